"""Calibration data: the inputs INT8 calibration runs the float graph on.

Two sources, both giving a float32 array ``(N, *input_shape)`` that :class:`BatchReader` feeds to
onnxruntime's calibrators one batch at a time:

* ``digits``: one split of :func:`edgebnn.data.digits` (default ``val``: the model was trained on
  ``train`` and is evaluated on ``test``, so calibrating on ``val`` touches neither);
* an ``.npz`` with ``x``, or a folder of ``.npy``/``.npz`` shards, read by :func:`edgebnn.data.load_data`
  (``allow_pickle=False``): a ``.npy`` holds one input ``input_shape`` or a stack ``(n, *input_shape)`` of
  floating-point values. Every file is checked (dtype, shape, finite values) and the first bad one is named
  in a single :class:`InvalidOptionError`.

Batches all have the same size: onnxruntime's histogram calibrators (percentile, entropy) stack the per-batch
outputs with ``np.asarray`` and fail on ragged batches. So the batch is the largest size between half the one asked
for and it that divides the inputs evenly (360 inputs, batch 32: 12 batches of 30), and only when none does is a
last partial batch left out; :attr:`BatchReader.samples_used` and :attr:`BatchReader.inputs` say how many inputs
were used of how many, and ``edgebnn calibrate`` prints both.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from edgebnn.errors import InvalidOptionError

DEFAULT_BATCH = 32


class BatchReader(CalibrationDataReader):
    """Feeds ``{input_name: x[i:i+batch]}`` for equal-size batches of ``x``; :meth:`rewind` starts over.

    Args:
        x: Calibration inputs ``(N, ...)``, cast to contiguous float32.
        input_name: Name of the graph input.
        batch: Batch size; clipped to N, so a small set is one batch.
        limit: Use at most this many inputs (the first ``limit``), or all when None.
        progress: Called as ``progress(batches given, batches per pass)`` after each batch.
    """

    def __init__(self, x: np.ndarray, input_name: str, *, batch: int = DEFAULT_BATCH, limit: int | None = None,
                 progress: Callable[[int, int], None] | None = None) -> None:
        if batch < 1:
            raise InvalidOptionError(f"calibration batch must be at least 1, got {batch}")
        if limit is not None and limit < 1:
            raise InvalidOptionError(f"calibration sample limit must be at least 1, got {limit}")
        if len(x) == 0:
            raise InvalidOptionError("no calibration inputs")
        x = x[:limit] if limit is not None else x
        self.inputs = len(x)
        self.batch = even_batch(len(x), batch)
        self.samples_used = len(x) // self.batch * self.batch
        self.x = np.ascontiguousarray(x[: self.samples_used], dtype=np.float32)
        self.input_name = input_name
        self.progress = progress
        self._next = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= self.samples_used:
            return None
        chunk = self.x[self._next : self._next + self.batch]
        self._next += self.batch
        if self.progress:
            self.progress(self._next // self.batch, len(self))
        return {self.input_name: chunk}

    def __len__(self) -> int:
        return self.samples_used // self.batch

    def rewind(self) -> None:
        self._next = 0


def even_batch(n: int, batch: int) -> int:
    """The batch size for ``n`` inputs asked ``batch``: the largest divisor of ``n`` in [batch/2, batch] (every input
    used, in equal batches), else ``batch`` (a last partial batch left out); ``n`` when it is at most ``batch``."""
    if n <= batch:
        return n
    return next((d for d in range(batch, (batch + 1) // 2 - 1, -1) if d > 0 and n % d == 0), batch)


def divisor_near(n: int, batch: int) -> int | None:
    """A batch size up to twice ``batch`` that divides ``n`` evenly (what to suggest when ``batch`` leaves some out)."""
    return next((d for d in range(batch + 1, 2 * batch + 1) if n % d == 0), None)


def digits_inputs(split: str = "val", *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(N, 1, 8, 8)`` and labels of one split of :func:`edgebnn.data.digits`."""
    from edgebnn.data import digits

    return digits(seed).split(split)


def load_inputs(data: str | os.PathLike[str], input_shape: Sequence[int], *,
                limit: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Calibration inputs ``(N, *input_shape)`` float32 from an ``.npz`` or a folder of shards, and a description.

    Read with :func:`edgebnn.data.load_data` (labels not needed; a ``.npy`` in a folder may hold a single
    input shaped ``input_shape``).

    Args:
        data: An ``.npz`` with ``x``, or a folder of ``.npy``/``.npz`` shards.
        input_shape: Shape of one input, without the batch axis.
        limit: Read only the first ``limit`` inputs (None: all).

    Returns:
        ``(x, {"data": str(data), "files": number of shards})``.

    Raises:
        InvalidOptionError: A missing folder or file, a pickle, a non-float or misshapen array, or NaN or
            infinite values (the message names the file and key).
    """
    from edgebnn.data import load_data

    dataset = load_data(data, input_shape=input_shape, labels=False)
    x, _ = dataset.arrays(limit)
    return x, {"data": str(data), "files": dataset.files}
