"""Calibration (edgebnn.calib): INT8 activation calibration of exported ensembles.

:mod:`edgebnn.calib.int8` (``calibrate_ensemble``, ``edgebnn calibrate``) writes a symmetric INT8 Q/DQ
model TensorRT can build and reports what INT8 costs; :mod:`edgebnn.calib.readers` feeds it digits or a
folder of ``.npy`` inputs.
"""
