"""Schema names of the JSON reports: every ``--json`` report carries ``schema`` (one of these) and
``edgebnn_version``. A report changes its number when a key changes meaning or disappears.
"""

from __future__ import annotations

LOWER = "edgebnn.lower/1"
INSPECT = "edgebnn.inspect/1"
EVAL = "edgebnn.eval/1"
COMPARE = "edgebnn.compare/1"
CALIBRATE = "edgebnn.calibrate/1"
PROFILE = "edgebnn.profile/1"
DEMO = "edgebnn.demo/1"
SEARCH = "edgebnn.search/2"  # 2: trial "bytes" is the deployed ONNX file (was the IR's tensors)
EXPORT = "edgebnn.export/1"
PLUGINS = "edgebnn.plugins/1"
