"""Data: the built-in digits set, and the loader every command uses for the user's own data.

:func:`digits`: sklearn's 8x8 handwritten digits (1797 grey-scale images of 0-9, shipped with scikit-learn,
no download). Pixels are scaled from 0..16 to [0, 1] and laid out as float32 ``(N, 1, 8, 8)`` images;
labels are int64. The split is 60/20/20 and stratified by class; the same seed gives the same split on
every run and machine.

:func:`load_data`: ``digits``, an ``.npz`` with ``x`` (N, ...) float32 inputs and ``y`` (N,) integer
labels, or a folder of ``.npy``/``.npz`` shards streamed in batches (``--data`` of ``eval``, ``compare``,
``calibrate`` and ``lower --eval``; ``--ood-data`` of ``eval``). Nothing is ever unpickled.

Labels follow the model's task (:class:`Targets`, which the task gives): integer class indices ``(N,)``
(:class:`ClassLabels`, classification), float targets ``(N,)`` or ``(N, D)`` (:class:`FloatTargets`, regression),
integer masks ``(N, *spatial)`` (:class:`ClassMasks`, segmentation), or a plug-in task's own.
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
import tokenize
import warnings
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from edgebnn.errors import InvalidOptionError

SPLIT_NAMES = ("train", "val", "test")


@dataclass(frozen=True)
class Targets:
    """What one label of a data set is and how the loader checks it; a task gives its own
    (:meth:`edgebnn.tasks.Task.targets`).

    The loader asks :meth:`dtype_error` and :meth:`accepts` of every labels file as it is opened (headers only),
    then :meth:`cast` and :meth:`check` of every batch as it is read. Subclass it for a task's own labels
    (docs/extending.md; a frozen dataclass, so ``MyTargets((k,))`` sets the shape): every message names the file
    (``where``) and, for a value, the row.

    Attributes:
        shape: One label's shape (no batch axis).
    """

    shape: tuple[int, ...] = ()

    def describe(self, n: int) -> str:
        """What a labels array of ``n`` rows must be, e.g. ``(300,): one integer label per input``."""
        return f"({', '.join(map(str, (n, *self.shape)))}): labels"

    def accepts(self, shape: tuple[int, ...]) -> bool:
        """Whether one label of ``shape`` (no batch axis) fits."""
        return shape == self.shape

    def dtype_error(self, dtype: np.dtype[Any]) -> str | None:
        """Why labels of ``dtype`` are refused (the message's tail after the file and dtype), or None."""
        return None if dtype.kind in "iu" else "labels must be integers"

    def cast(self, y: np.ndarray) -> np.ndarray:
        """One batch of labels as the metrics take them (int64 by default)."""
        return y.astype(np.int64, copy=False)

    def check(self, y: np.ndarray, classes: int | None, where: str, start: int) -> None:
        """Refuse (one line naming ``where`` and the row) a batch ``y`` (cast) whose first row is row ``start``.

        Args:
            y: The batch, as :meth:`cast` gives it.
            classes: The model's class count (``load_data``'s ``num_classes``), or None.
            where: The labels file and key, for messages.
            start: The row number of ``y[0]`` in that file.

        Raises:
            InvalidOptionError: A label the task cannot take.
        """


def _outside_classes(k: int | None) -> str:
    return f"the model's {k} classes (0..{k - 1})" if k is not None else "class indices (>= 0)"


def _first_outside(y: np.ndarray, k: int | None) -> int | None:
    """The first row of ``y`` holding a class index outside ``0..k-1`` (``>= 0`` without ``k``), or None."""
    outside = np.asarray((y < 0) | (y >= k) if k is not None else y < 0)
    bad = outside.reshape(len(y), -1).any(axis=1)
    return int(bad.argmax()) if bad.any() else None


@dataclass(frozen=True)
class ClassLabels(Targets):
    """One integer class index per input, ``(N,)``, in ``0..classes-1`` (classification)."""

    def describe(self, n: int) -> str:
        return f"({n},): one integer label per input"

    def dtype_error(self, dtype: np.dtype[Any]) -> str | None:
        if dtype.kind in "iu":
            return None
        hint = "; a float target is a regression: import the model with task='regression'" if dtype.kind == "f" else ""
        return f"labels must be integer class indices{hint}"

    def check(self, y: np.ndarray, classes: int | None, where: str, start: int) -> None:
        i = _first_outside(y, classes)
        if i is not None:
            raise InvalidOptionError(f"{where}: label {int(y[i])} at row {start + i} is outside "
                                     f"{_outside_classes(classes)}")


@dataclass(frozen=True)
class ClassMasks(Targets):
    """An integer class mask per input, ``(N, *shape)`` (the spatial dims), in ``0..classes-1`` (segmentation)."""

    shape: tuple[int, ...] = ()

    def describe(self, n: int) -> str:
        return f"({', '.join(map(str, (n, *self.shape)))}): an integer class mask per input"

    def dtype_error(self, dtype: np.dtype[Any]) -> str | None:
        return None if dtype.kind in "iu" else "labels must be an integer mask per input"

    def check(self, y: np.ndarray, classes: int | None, where: str, start: int) -> None:
        i = _first_outside(y, classes)
        if i is not None:
            row = y[i].reshape(-1)
            wrong = int(row[(row < 0) | (row >= (classes if classes is not None else row.max() + 1))][0])
            raise InvalidOptionError(f"{where}: mask label {wrong} at row {start + i} is outside "
                                     f"{_outside_classes(classes)}")


@dataclass(frozen=True)
class FloatTargets(Targets):
    """Finite float targets of ``shape`` per input, ``()`` or ``(D,)``; one value may drop its axis (regression)."""

    shape: tuple[int, ...] = ()

    def describe(self, n: int) -> str:
        return f"({', '.join(map(str, (n, *self.shape)))}): float targets"

    def accepts(self, shape: tuple[int, ...]) -> bool:
        return shape == self.shape or (self.shape in ((1,), ()) and shape in ((1,), ()))

    def dtype_error(self, dtype: np.dtype[Any]) -> str | None:
        return None if dtype.kind in "iuf" else "regression targets must be numbers"

    def cast(self, y: np.ndarray) -> np.ndarray:
        return y.astype(np.float64, copy=False)

    def check(self, y: np.ndarray, classes: int | None, where: str, start: int) -> None:
        finite = np.isfinite(y.reshape(len(y), -1)).all(axis=1)
        if not finite.all():
            raise InvalidOptionError(f"{where}: NaN or infinite target at row {start + int(finite.argmin())}")


CLASS_LABELS = ClassLabels()


@dataclass(frozen=True)
class DigitsSplits:
    """The three parts of the digits data set: images ``(N, 1, 8, 8)`` float32 in [0, 1], int64 labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Return the images and labels of one part.

        Args:
            name: ``"train"``, ``"val"`` or ``"test"``.

        Returns:
            ``(x, y)`` for that part.

        Raises:
            InvalidOptionError: ``name`` is none of the three.
        """
        if name not in SPLIT_NAMES:
            raise InvalidOptionError(f"unknown split {name!r}; choose one of {', '.join(SPLIT_NAMES)}")
        return getattr(self, f"x_{name}"), getattr(self, f"y_{name}")


TEST_SEED = 0  # the held-out test split never moves


def digits(seed: int = 0) -> DigitsSplits:
    """Load sklearn's digits and split them 60/20/20 into train/val/test, stratified by class.

    The test split is the same for every seed (held out once, with seed 0), so a model trained on any
    ``digits(seed)`` is never evaluated on its own training images by ``edgebnn eval --data digits``;
    ``seed`` reshuffles the train/val split of the rest.

    Args:
        seed: Seed of the train/val split; the same seed gives the same split on every run and machine.

    Returns:
        The three parts (1077 train, 360 val, 360 test images).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=0.2, stratify=y, random_state=TEST_SEED)
    # A quarter of the remaining 80% is 20% of the whole.
    x_train, x_val, y_train, y_val = train_test_split(
        x_rest, y_rest, test_size=0.25, stratify=y_rest, random_state=seed
    )
    return DigitsSplits(
        x_train=np.ascontiguousarray(x_train),
        y_train=np.ascontiguousarray(y_train),
        x_val=np.ascontiguousarray(x_val),
        y_val=np.ascontiguousarray(y_val),
        x_test=np.ascontiguousarray(x_test),
        y_test=np.ascontiguousarray(y_test),
    )


# -- the user's own data ------------------------------------------------------------------------------------

DIGITS = "digits"
DEFAULT_BATCH = 1024  # rows per batch streamed from disk
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_FORMAT_HINT = "give 'digits', an .npz with x (N, ...) float32 and y (N,) int labels, or a folder of .npy/.npz shards"


@dataclass(frozen=True)
class _Member:
    """One array on disk: a whole ``.npy`` file, or key ``key`` of an ``.npz``; only its header is read."""

    path: Path
    key: str | None  # None: a .npy file
    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def where(self) -> str:
        return str(self.path) if self.key is None else f"{self.path}['{self.key}']"

    def chunks(self, size: int) -> Iterator[np.ndarray]:
        """The rows in chunks of ``size``, each a fresh array.

        A .npy is memory-mapped only while one chunk is copied out, so the pages read do not stay resident;
        an .npz member is read whole, once (keep .npz shards smaller than memory).
        """
        if self.key is not None:
            try:
                with np.load(self.path, allow_pickle=False) as z:
                    whole = np.asarray(z[self.key]).reshape(self.shape)
            except _READ_ERRORS as e:  # a bad CRC, broken deflate data, a member shorter than its header says
                raise InvalidOptionError(f"{self.where}: unreadable .npz member ({_reason(e)})") from e
            for start in range(0, self.shape[0], size):
                yield whole[start : start + size]
            return
        for start in range(0, self.shape[0], size):
            try:
                mapped = np.load(self.path, mmap_mode="r", allow_pickle=False).reshape(self.shape)
            except _READ_ERRORS as e:  # the file changed since its header was checked
                raise InvalidOptionError(f"{self.where}: unreadable array data ({_reason(e)})") from e
            yield np.array(mapped[start : start + size])
            del mapped


# What reading a corrupt .npy/.npz raises (zipfile, zlib, numpy's header and data readers, mmap): a bad CRC or
# deflate stream, a header numpy cannot parse, fewer bytes than the header declares.
_READ_ERRORS = (OSError, EOFError, ValueError, zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error,
                NotImplementedError, RuntimeError, struct.error, SyntaxError, TypeError, OverflowError,
                tokenize.TokenError)
_DEFLATE_RATIO = 1100  # deflate expands at most ~1032:1; a member declaring more is lying about its size


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:200] + "...") if len(text) > 200 else text or type(e).__name__


def _header(f: IO[bytes], where: str, data_bytes: int) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """(shape, dtype) from a .npy header, refusing object arrays (they would need pickle) and a shape that
    does not match the ``data_bytes`` stored after the header (checked before anything is allocated)."""
    if f.read(6) != _NPY_MAGIC:
        raise InvalidOptionError(f"{where}: not a .npy array (no NUMPY header)")
    version = tuple(f.read(2))
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise InvalidOptionError(f"{where}: unreadable .npy header (format version {version})")
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    try:
        with warnings.catch_warnings():  # "created on Python 2": a mutated header; the checks below decide
            warnings.simplefilter("ignore")
            shape, _, dtype = read(f)
        offset = f.tell()
    except _READ_ERRORS as e:
        raise InvalidOptionError(f"{where}: unreadable .npy header ({_reason(e)})") from e
    if dtype.hasobject:
        raise InvalidOptionError(f"{where}: not a plain numeric array (object arrays need pickle, which is refused)")
    shape = tuple(int(d) for d in shape)
    declared = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if declared != data_bytes - offset:
        raise InvalidOptionError(f"{where}: corrupt .npy: the header declares {dtype} {shape} ({declared} bytes) but "
                                 f"{data_bytes - offset} bytes follow it")
    return shape, dtype


def _npy_member(path: Path) -> _Member:
    try:
        with path.open("rb") as f:
            if not f.read(1):
                raise InvalidOptionError(f"{path}: empty file")
            f.seek(0)
            shape, dtype = _header(f, str(path), os.fstat(f.fileno()).st_size)
    except OSError as e:
        raise InvalidOptionError(f"{path}: cannot read ({e.strerror or e})") from e
    return _Member(path, None, shape, dtype)


def _npz_members(path: Path) -> dict[str, _Member]:
    """Every array of an .npz, by key (headers and the zip directory only; no array data is read)."""
    try:
        with path.open("rb") as f:
            head = f.read(4)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise InvalidOptionError(f"{path}: cannot read ({e.strerror or e})") from e
    if not head:
        raise InvalidOptionError(f"{path}: empty file")
    if head not in _ZIP_MAGIC:
        raise InvalidOptionError(f"{path}: not an .npz file (not a zip archive)")
    try:
        with zipfile.ZipFile(path) as zf:
            infos = [i for i in zf.infolist() if i.filename.endswith(".npy")]
            return {i.filename[: -len(".npy")]: _npz_member(path, zf, i, size) for i in infos}
    except InvalidOptionError:
        raise
    except _READ_ERRORS as e:
        raise InvalidOptionError(f"{path}: unreadable .npz file ({_reason(e)})") from e


def _npz_member(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, archive_bytes: int) -> _Member:
    key = info.filename[: -len(".npy")]
    where = f"{path}['{key}']"
    _check_zip_member(info, archive_bytes, where)
    try:
        with zf.open(info) as f:
            shape, dtype = _header(f, where, info.file_size)
    except _READ_ERRORS as e:
        raise InvalidOptionError(f"{where}: unreadable .npz member ({_reason(e)})") from e
    return _Member(path, key, shape, dtype)


def _check_zip_member(info: zipfile.ZipInfo, archive_bytes: int, where: str) -> None:
    """Refuse sizes a member cannot have, before numpy allocates what its header declares."""
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise InvalidOptionError(f"{where}: unsupported zip compression method {info.compress_type} (np.savez writes "
                                 "stored or deflated members)")
    stored = info.compress_type == zipfile.ZIP_STORED
    if (info.compress_size > archive_bytes or (stored and info.file_size != info.compress_size)
            or info.file_size > info.compress_size * _DEFLATE_RATIO + 1024):
        raise InvalidOptionError(f"{where}: corrupt .npz: the zip directory says {info.compress_size} bytes stored, "
                                 f"{info.file_size} unpacked, in a {archive_bytes}-byte file")


Array = _Member | np.ndarray


def _chunks(a: Array, size: int) -> Iterator[np.ndarray]:
    if isinstance(a, _Member):
        yield from a.chunks(size)
    else:
        for start in range(0, len(a), size):
            yield a[start : start + size]


def _where(a: Array, default: str) -> str:
    return a.where if isinstance(a, _Member) else default


@dataclass(frozen=True)
class _Shard:
    """The rows of one file (or of arrays in memory): inputs and, when needed, their labels."""

    x: Array
    y: Array | None
    where: str  # names the inputs in messages
    y_where: str


def _label_partner(path: Path) -> Path:
    """Where the labels of a .npy input shard live: its name with the last ``x`` changed to ``y``."""
    stem = path.name[: -len(".npy")]
    i = stem.rfind("x")
    return path.with_name(f"{stem[:i]}y{stem[i + 1:]}.npy") if i >= 0 else path.with_name(f"{stem}.labels.npy")


def _files_of(path: Path, option: str) -> tuple[list[Path], set[Path]]:
    """(input files, label files) of ``--data PATH``."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".npy", ".npz"))
        if not files:
            raise InvalidOptionError(f"{option} {path}: no .npy or .npz files in this folder")
        npy = {p for p in files if p.suffix == ".npy"}
        partners = {_label_partner(p) for p in npy} & npy
        return [p for p in files if p not in partners], partners
    if path.is_file():
        if path.suffix not in (".npz", ".npy"):
            raise InvalidOptionError(f"{option} {path}: not an .npz or .npy file; {_FORMAT_HINT}")
        return [path], set()
    raise InvalidOptionError(f"{option} {path}: no such file or directory; {_FORMAT_HINT}")


def _file_shards(path: Path, labels: bool, option: str) -> list[_Shard]:
    inputs, partners = _files_of(path, option)
    shards = []
    for p in inputs:
        y: _Member | None = None
        if p.suffix == ".npz":
            members = _npz_members(p)
            if "x" not in members:
                keys = ", ".join(sorted(members)) or "none"
                raise InvalidOptionError(f"{p}: no key 'x' (it holds: {keys}); {_FORMAT_HINT}")
            x = members["x"]
            if labels:
                if "y" not in members:
                    raise InvalidOptionError(f"{p}: no key 'y' (integer labels, one per row of 'x')")
                y = members["y"]
        else:
            x = _npy_member(p)
            if labels:
                partner = _label_partner(p)
                if partner not in partners:
                    raise InvalidOptionError(f"{p}: no labels: expected {partner.name}, (N,) integer labels, beside it")
                y = _npy_member(partner)
        shards.append(_Shard(x, y, x.where, y.where if y is not None else ""))
    return shards


class Dataset:
    """A labelled (or inputs-only) data set, streamed in batches; build it with :func:`load_data`.

    Files are checked when the data set is built (keys, dtypes, shapes, row counts: headers only); values
    (NaN or infinite inputs, labels out of range) are checked per batch as they are read.

    Attributes:
        name: What the data came from (``digits``, a path, or ``<arrays>``), for reports.
        split: The digits split, or None.
        n: Number of rows.
        input_shape: Shape of one input, without the batch axis.
        num_classes: Labels must lie in ``0..num_classes-1`` (None: only ``>= 0`` is checked).
    """

    def __init__(self, name: str, shards: list[_Shard], *, input_shape: tuple[int, ...], split: str | None = None,
                 num_classes: int | None = None, targets: Targets = CLASS_LABELS) -> None:
        self.name = name
        self.targets = targets
        self.split = split
        self._shards = shards
        self.n = sum(s.x.shape[0] for s in shards)
        self.input_shape = input_shape
        self.num_classes = num_classes

    @property
    def has_labels(self) -> bool:
        return all(s.y is not None for s in self._shards)

    @property
    def files(self) -> int:
        """Number of shards (files) the data set reads."""
        return len(self._shards)

    def describe(self) -> dict[str, Any]:
        """``{"data", "split", "n"}`` for a report."""
        return {"data": self.name, "split": self.split, "n": self.n}

    def batches(self, size: int = DEFAULT_BATCH) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """Yield ``(x, y)`` batches of at most ``size`` rows, in order: x float32, y as the targets cast it
        (:meth:`Targets.cast`: int64 class labels, float64 regression targets; None without labels).

        Raises:
            InvalidOptionError: A batch holds NaN or infinite inputs, or a label the targets refuse
                (:meth:`Targets.check`: a class outside ``0..num_classes-1``, a NaN target; the message names the
                file, key and row).
        """
        if size < 1:
            raise InvalidOptionError(f"batch size must be at least 1, got {size}")
        for shard in self._shards:
            ys = _chunks(shard.y, size) if shard.y is not None else None
            start = 0
            for x in _chunks(shard.x, size):
                bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
                if bad.any():
                    raise InvalidOptionError(f"{shard.where}: NaN or infinite input at row {start + int(bad.argmax())}")
                y = None
                if ys is not None:
                    y = self.targets.cast(next(ys))
                    self.targets.check(y, self.num_classes, shard.y_where, start)
                yield np.ascontiguousarray(x, dtype=np.float32), y
                start += len(x)

    def arrays(self, limit: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """All rows (or the first ``limit``) in memory: ``(x float32, y as the targets cast it, or None)``."""
        xs: list[np.ndarray] = []
        ys: list[np.ndarray] = []
        for x, y in self.batches():
            xs.append(x)
            if y is not None:
                ys.append(y)
            if limit is not None and sum(map(len, xs)) >= limit:
                break
        return np.concatenate(xs)[:limit], (np.concatenate(ys)[:limit] if ys else None)


DataSource = str | os.PathLike[str] | np.ndarray | tuple[np.ndarray, np.ndarray] | Dataset


def load_data(source: DataSource, *, split: str | None = None, input_shape: Sequence[int] | None = None,
              num_classes: int | None = None, labels: bool = True, option: str = "--data",
              targets: Targets = CLASS_LABELS) -> Dataset:
    """Open a data set for a model: ``digits``, an ``.npz``, a folder of shards, or numpy arrays.

    Formats (``x``: inputs ``(N, *input_shape)``, floating point, preprocessed as the model expects;
    ``y``: ``(N,)`` integer labels in ``0..K-1``):

    * ``"digits"``: sklearn's digits, split ``split`` (default ``test``), ``(N, 1, 8, 8)``;
    * ``data.npz``: keys ``x`` and ``y`` (``y`` may be absent when ``labels=False``);
    * a folder: every ``.npz`` shard (keys ``x``, ``y``) and ``.npy`` input shard, in name order; a ``.npy``
      shard's labels are the file whose name has its last ``x`` changed to ``y`` (``x_000.npy`` and
      ``y_000.npy``). ``.npy`` shards are memory-mapped and read one batch at a time, so a folder larger
      than memory streams in bounded memory. With ``labels=False`` a ``.npy`` may also hold one input
      shaped ``input_shape`` (no batch axis);
    * ``(x, y)`` arrays, or ``x`` alone when ``labels=False`` (Python only).

    Files are read with ``allow_pickle=False``; here only their array headers are read.

    Args:
        source: The data, as above.
        split: Digits split (``train``, ``val``, ``test``); digits only.
        input_shape: Shape of one model input without the batch axis; checked against every file.
        num_classes: The model's class count, given to the targets' checks (class labels outside it are refused
            as they are read).
        labels: Whether labels are needed (False: inputs only, e.g. OOD or calibration data).
        option: The option named in messages (``--data``, ``--ood-data``, ``--eval``).
        targets: What one label is and how it is checked (:class:`Targets`: class indices by default; the
            model's task gives its own, :meth:`edgebnn.tasks.Task.targets`).

    Returns:
        The :class:`Dataset`.

    Raises:
        InvalidOptionError: A missing file or key, a pickled or non-numeric array, inputs of the wrong dtype
            or shape, labels of the wrong dtype or count, or an empty file (one line naming file and key).
    """
    if isinstance(source, Dataset):
        return source
    want = tuple(int(d) for d in input_shape) if input_shape is not None else None
    if isinstance(source, (tuple, np.ndarray)):
        if split is not None:
            raise InvalidOptionError(f"split={split!r}: applies to digits only")
        x, y = (source, None) if isinstance(source, np.ndarray) else (np.asarray(source[0]), np.asarray(source[1]))
        if labels and y is None:
            raise InvalidOptionError("data: labels are needed; pass (x, y)")
        shards = [_Shard(x, y if labels else None, "<arrays> x", "<arrays> y")]
        name = "<arrays>"
    elif str(source) == DIGITS:
        split = split or "test"
        x, y = digits().split(split)
        shards = [_Shard(x, y if labels else None, f"digits/{split}", f"digits/{split}")]
        name = DIGITS
    else:
        if split is not None:
            raise InvalidOptionError(f"--split {split}: applies to --data digits only, not to {source}")
        shards = _file_shards(Path(source), labels, option)
        if not labels and want is not None:  # a .npy holding one input: give it its batch axis
            shards = [_Shard(dataclasses.replace(s.x, shape=(1, *want)), None, s.where, "")
                      if isinstance(s.x, _Member) and s.x.shape == want else s for s in shards]
        name = str(source)
    return Dataset(name, shards, input_shape=_check_shards(shards, want, targets), split=split,
                   num_classes=num_classes, targets=targets)


def _check_shards(shards: list[_Shard], want: tuple[int, ...] | None, targets: Targets = CLASS_LABELS,
                  ) -> tuple[int, ...]:
    """Check dtypes and shapes of every shard (headers only); return the shape of one input."""
    item = want
    for s in shards:
        if s.x.dtype.kind != "f":
            raise InvalidOptionError(f"{s.where}: dtype {s.x.dtype} is not floating point; save the inputs as "
                                     "float32, preprocessed exactly as the model expects")
        if s.x.dtype != np.float32:  # float64 is numpy's default: often raw, unpreprocessed data
            raise InvalidOptionError(f"{s.where}: dtype {s.x.dtype}; the model takes float32 inputs: save them as "
                                     "x.astype(np.float32), preprocessed exactly as the model expects")
        shape = tuple(s.x.shape)
        if len(shape) < 2 or shape[0] == 0:
            raise InvalidOptionError(f"{s.where}: shape {shape}: expected (N, ...) with N >= 1 rows")
        item = item if item is not None else shape[1:]
        if shape[1:] != item:
            raise InvalidOptionError(f"{s.where}: shape {shape}, the model takes (N, {', '.join(map(str, item))})")
        if s.y is not None:
            wrong = targets.dtype_error(s.y.dtype)
            if wrong:
                raise InvalidOptionError(f"{s.y_where}: dtype {s.y.dtype}; {wrong}")
            if s.y.shape[:1] != (shape[0],) or not targets.accepts(tuple(s.y.shape[1:])):
                raise InvalidOptionError(f"{s.y_where}: shape {tuple(s.y.shape)}, expected "
                                         f"{targets.describe(shape[0])}")
    assert item is not None
    return item
