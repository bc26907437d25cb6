"""Targets: device profiles, runners (onnxruntime, tensorrt, torch), power meters and the profiler."""
