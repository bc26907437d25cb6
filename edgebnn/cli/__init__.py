"""The ``edgebnn`` command line.

Errors a user can cause print one line naming the file, layer or option and exit with status 2;
``edgebnn --debug ...`` shows the traceback instead. Every ``--json`` report carries ``schema`` and
``edgebnn_version``.
"""

from edgebnn.cli import _build, _measure, _plugins, _search  # registers the commands on ``main``
from edgebnn.cli._build import _describe_ir
from edgebnn.cli._common import main, write_json

__all__ = ["_build", "_describe_ir", "_measure", "_plugins", "_search", "main", "write_json"]
