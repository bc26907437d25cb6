"""Runtimes: the reference runtime (numpy sampling + onnxruntime) used to check every exporter."""
