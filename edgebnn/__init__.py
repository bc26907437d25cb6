"""edgebnn: a deployment compiler for Bayesian neural networks.

A trained BNN goes in (edgebnn, bayesian-torch, torchbnn or blitz layers); out comes an ONNX model or
TensorRT engine that computes the whole S-sample predictive distribution on the device.

    import ──> IR (.ebnn) ──lowering passes──> IR (encoded weights) ──export──> ONNX / TensorRT
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
