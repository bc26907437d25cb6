"""Errors a user can cause. Each names the file, layer, option or target at fault.

The CLI prints ``str(error)`` on one line and exits with status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations


class EdgeBNNError(Exception):
    """Base class of every error edgebnn raises on purpose."""


class InvalidArtifactError(EdgeBNNError):
    """An .ebnn/.onnx/engine file is missing, truncated, corrupt or fails verification."""


class InvalidWeightsError(EdgeBNNError):
    """A checkpoint is unreadable, unsafe, or its tensors are missing, misshapen or not finite."""


class UnsupportedLayerError(EdgeBNNError):
    """A layer edgebnn cannot import, lower or export (names the module path and class)."""


class InvalidOptionError(EdgeBNNError):
    """A command-line or API option is out of range or inconsistent."""


class MissingDependencyError(EdgeBNNError):
    """An optional dependency (torch, tensorrt, pynvml, ...) is needed and absent; says what to install."""


class ArtifactWriteError(EdgeBNNError):
    """Writing an artifact failed; the previous file at that path is left intact."""


class ArtifactRuntimeError(EdgeBNNError):
    """An exported artifact fails when its runtime loads or runs it (names the artifact and the failing op)."""


class PluginError(EdgeBNNError):
    """A plug-in failed to import or registered something invalid (names the plug-in and where it came from)."""
