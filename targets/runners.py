"""Runners execute one exported graph on one batch. The profiler times them; they only run.

``OrtRunner``: onnxruntime with the benchmark settings of FACTS.md (``intra_op_num_threads``, no
spinning, ``ORT_ENABLE_ALL``); the CUDA provider when asked for and present.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from edgebnn.errors import MissingDependencyError


class OrtRunner:
    name = "onnxruntime"

    def __init__(self, model: onnx.ModelProto | bytes, *, threads: int = 2, provider: str = "cpu") -> None:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        if provider == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise MissingDependencyError("the CUDA runner needs onnxruntime-gpu and a CUDA device")
            providers = ["CUDAExecutionProvider", *providers]
        data = model if isinstance(model, bytes) else model.SerializeToString()
        self.session = ort.InferenceSession(data, opts, providers=providers)
        self.input_name = self.session.get_inputs()[0].name
        self.provider = self.session.get_providers()[0]

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        return self.session.run(None, {self.input_name: x})
