"""Atomic artifact writes: temp file in the same directory, fsync, rename.

A reader never sees a half-written file, and a failure (full disk, interrupt) leaves the previous file at
the destination intact and no temp file behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from edgebnn.errors import ArtifactWriteError


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object]) -> Path:
    """Call ``write(fileobj)`` on a temp file beside ``path``, then rename it over ``path``."""
    dest = Path(path)
    directory = dest.parent if str(dest.parent) else Path(".")
    if not directory.is_dir():
        raise ArtifactWriteError(f"{dest}: output directory {directory} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise ArtifactWriteError(f"{dest}: cannot write to {directory}: {e.strerror or e}") from e
    try:
        # mkstemp creates 0600; give the artifact the mode an ordinary file would get (0666 less the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise ArtifactWriteError(f"{dest}: write failed: {e.strerror or e}") from e
        raise
    return dest


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


@contextlib.contextmanager
def cwd_on_path() -> Iterator[None]:
    """The working directory first on ``sys.path`` while a user's module is imported (a ``--model`` factory, a
    ``--plugin`` or ``$EDGEBNN_PLUGINS`` module).

    As ``python -m``, uvicorn and gunicorn do: ``mynet:factory`` finds ``./mynet.py`` without ``PYTHONPATH=.``.
    The entry is removed again afterwards (modules already imported stay in ``sys.modules``).
    """
    cwd = os.getcwd()
    if cwd in sys.path or "" in sys.path:  # already importable (``python -m edgebnn``, an interactive session)
        yield
        return
    sys.path.insert(0, cwd)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(cwd)
