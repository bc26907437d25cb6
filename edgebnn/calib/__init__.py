"""Calibration (edgebnn.calib): INT8 activation calibration of exported ensembles.

:mod:`edgebnn.calib.int8` (``calibrate_ensemble``, ``edgebnn calibrate``) writes a symmetric INT8 Q/DQ
model TensorRT can build and reports what INT8 costs; :mod:`edgebnn.calib.readers` feeds it digits or a
folder of ``.npy`` inputs.
"""

METHODS = ("minmax", "percentile", "entropy")
"""Activation-range methods of the INT8 calibration (``edgebnn calibrate --method``); here, not in
:mod:`.int8`, so that the command line names them without importing onnx."""
