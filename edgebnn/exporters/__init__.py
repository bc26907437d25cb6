"""Exporters: graph rewrites from the edgebnn IR to standard ONNX, and ONNX to TensorRT engines.

One function exports (:func:`edgebnn.exporters.export.export_model`), taking one configuration
(:class:`edgebnn.exporters.config.ExportConfig`); the constants every exporter shares are here.
"""

from __future__ import annotations

from edgebnn.errors import InvalidOptionError

MODES = ("baked", "noise", "shared", "analytic")  # export modes (ensemble.py, noise.py, analytic.py)
AUTO = "auto"  # mode: the device's default (the handlers tried in order); samples: an anytime ensemble
MODE_CHOICES = (AUTO, *MODES)  # --mode
WEIGHT_FORMATS = ("fp32", "int8", "int4")  # how exported weight constants are stored
# --weights: how every weight tensor a graph stores is written, in every mode (stores/: ir = the IR's own codes where
# its encoding has them, else fp32; fp32; int8/int4 = coded at export: moments by stores.gaussian, members and means
# by stores.constants, both with the one quantizer, quantize.py)
STORE_CHOICES = ("ir", *WEIGHT_FORMATS)
RNG_CHOICES = ("auto", "host", "graph")  # --rng of the noise/shared modes: where standard noise is drawn
VARIANCE_CHOICES = ("exact", "separable")  # --variance of analytic mode: how a k×k Conv's variance is computed
NOISE_VARIANTS = ("auto", "local", "weight", "shared", "mixed", "flipout")  # --noise of the noise mode (noise.py)
ORT, TRT = "onnxruntime", "tensorrt"  # the runtimes a graph's decodes are written for (stores.base.Store.runtimes)
MAX_SAMPLES = 4096
DEFAULT_SAMPLES = 16  # S when none is given and the posterior family fixes none (a deep ensemble fixes its M)


def check_samples(samples: int) -> None:
    """Refuse an ensemble size that is not a positive integer up to ``MAX_SAMPLES`` (one-line user error)."""
    if not isinstance(samples, int) or isinstance(samples, bool) or samples <= 0:
        raise InvalidOptionError(f"--samples {samples}: must be a positive integer")
    if samples > MAX_SAMPLES:
        raise InvalidOptionError(f"--samples {samples}: more than {MAX_SAMPLES} is not supported")
