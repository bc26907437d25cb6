"""Calibration data: the inputs INT8 calibration runs the float graph on.

Two sources, both giving a float32 array ``(N, *input_shape)`` that :class:`BatchReader` feeds to
onnxruntime's calibrators one batch at a time:

* ``digits``: one split of :func:`edgebnn.data.digits` (default ``val``: the model was trained on
  ``train`` and is evaluated on ``test``, so calibrating on ``val`` touches neither);
* a folder of ``.npy`` files, read with ``allow_pickle=False``: each file holds one input
  ``input_shape`` or a stack ``(n, *input_shape)`` of floating-point values. Every file is checked
  (dtype, shape, finite values) and the first bad one is named in a single :class:`InvalidOptionError`.

Batches all have the same size and a last partial batch is dropped: onnxruntime's histogram
calibrators (percentile, entropy) stack the per-batch outputs with ``np.asarray`` and fail on ragged
batches. :attr:`BatchReader.samples_used` says how many inputs were actually used.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

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
    """

    def __init__(self, x: np.ndarray, input_name: str, *, batch: int = DEFAULT_BATCH, limit: int | None = None) -> None:
        if batch < 1:
            raise InvalidOptionError(f"calibration batch must be at least 1, got {batch}")
        if limit is not None and limit < 1:
            raise InvalidOptionError(f"calibration sample limit must be at least 1, got {limit}")
        if len(x) == 0:
            raise InvalidOptionError("no calibration inputs")
        x = x[:limit] if limit is not None else x
        self.batch = min(batch, len(x))
        self.samples_used = len(x) // self.batch * self.batch
        self.x = np.ascontiguousarray(x[: self.samples_used], dtype=np.float32)
        self.input_name = input_name
        self._next = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= self.samples_used:
            return None
        chunk = self.x[self._next : self._next + self.batch]
        self._next += self.batch
        return {self.input_name: chunk}

    def __len__(self) -> int:
        return self.samples_used // self.batch

    def rewind(self) -> None:
        self._next = 0


def digits_inputs(split: str = "val", *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(N, 1, 8, 8)`` and labels of one split of :func:`edgebnn.data.digits`."""
    from edgebnn.data import digits

    return digits(seed).split(split)


def load_npy_dir(directory: str | os.PathLike[str], input_shape: Sequence[int]) -> np.ndarray:
    """Stack every ``*.npy`` file of ``directory`` (sorted by name) into ``(N, *input_shape)`` float32.

    Args:
        directory: Folder of ``.npy`` files; other files are ignored.
        input_shape: Shape of one input, without the batch axis.

    Returns:
        The stacked inputs.

    Raises:
        InvalidOptionError: The folder is missing or holds no ``.npy`` file, or a file is unreadable, a pickle,
            not floating point, misshapen or not finite (the message names that file).
    """
    folder = Path(directory)
    if not folder.is_dir():
        raise InvalidOptionError(f"--data {folder}: not a directory (give 'digits' or a folder of .npy files)")
    files = sorted(p for p in folder.iterdir() if p.suffix == ".npy" and p.is_file())
    if not files:
        raise InvalidOptionError(f"--data {folder}: no .npy files")
    want = tuple(int(d) for d in input_shape)
    arrays = []
    for path in files:
        try:
            with path.open("rb") as f:
                if f.read(6) != b"\x93NUMPY":  # np.load would take anything else for a pickle
                    raise InvalidOptionError(f"{path}: not a .npy file (no NUMPY header)")
            arr = np.load(path, allow_pickle=False)
        except ValueError as e:
            if "pickle" in str(e):  # object arrays need pickle; refused
                raise InvalidOptionError(f"{path}: not a plain numeric .npy array (object arrays need pickle)") from e
            raise InvalidOptionError(f"{path}: unreadable .npy file ({e})") from e
        except (OSError, EOFError) as e:
            raise InvalidOptionError(f"{path}: unreadable .npy file ({e})") from e
        if arr.dtype.kind != "f":
            raise InvalidOptionError(
                f"{path}: dtype {arr.dtype} is not floating point; save the inputs as float32, preprocessed exactly "
                "as the model expects"
            )
        if tuple(arr.shape) == want:
            arr = arr[None]
        elif arr.ndim != len(want) + 1 or tuple(arr.shape[1:]) != want or len(arr) == 0:
            shape = ", ".join(map(str, want))
            raise InvalidOptionError(f"{path}: shape {tuple(arr.shape)}, expected ({shape}) or (n, {shape})")
        if not np.isfinite(arr).all():
            raise InvalidOptionError(f"{path}: contains NaN or infinite values")
        arrays.append(arr.astype(np.float32, copy=False))
    return np.ascontiguousarray(np.concatenate(arrays))
