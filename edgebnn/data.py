"""The digits data set (sklearn's 8x8 handwritten digits) with a fixed, seeded train/val/test split.

1797 grey-scale images of the digits 0-9, shipped with scikit-learn (no download). Pixels are scaled from
0..16 to [0, 1] and laid out as float32 ``(N, 1, 8, 8)`` images; labels are int64. The split is 60/20/20
and stratified by class; the same seed gives the same split on every run and machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgebnn.errors import InvalidOptionError

SPLIT_NAMES = ("train", "val", "test")


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
