"""Exporters: graph rewrites from the edgebnn IR to standard ONNX, and ONNX to TensorRT engines."""
