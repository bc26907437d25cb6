"""Deployment targets: compile an exported graph for a device, run it, time it, measure its energy.

* :mod:`.registry` — :func:`get_target`: a device profile name (:mod:`edgebnn.devices`) -> its target;
* :mod:`.base` — :class:`Target` (compile -> :class:`Executable`, load, baselines, plan, default mode,
  power meters) and :class:`CompileOptions`;
* :mod:`.cpu` (onnxruntime/torch on the host) and :mod:`.gpu` (TensorRT on rtx and jetson): one class per kind;
* :mod:`.runners` (onnxruntime, torch, TensorRT) with :mod:`.torch_interp`, the ONNX->torch interpreter;
* :mod:`.power` — power meters; :mod:`.profiler` — ``edgebnn profile``; :mod:`.remote` — ``--remote``.
"""

from __future__ import annotations

from edgebnn.targets.base import CompileOptions, Executable, Target
from edgebnn.targets.registry import get_target, target_names

__all__ = ["CompileOptions", "Executable", "Target", "get_target", "target_names"]
