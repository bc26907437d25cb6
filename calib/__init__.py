"""Calibration: INT8 activation calibration and uncertainty recalibration (edgebnn.calib)."""
