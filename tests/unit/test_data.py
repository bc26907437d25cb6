from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from sklearn.datasets import load_digits

from edgebnn.data import DigitsSplits, digits
from edgebnn.errors import InvalidOptionError

NAMES = ("train", "val", "test")
FRACTIONS = {"train": 0.6, "val": 0.2, "test": 0.2}


@pytest.fixture(scope="module")
def splits() -> DigitsSplits:
    return digits(0)


def _examples(x: np.ndarray, y: np.ndarray) -> Counter:
    """Each example as (image bytes, label), counted: a multiset of the examples."""
    return Counter((img.tobytes(), int(label)) for img, label in zip(x, y, strict=True))


def test_sizes_are_60_20_20(splits):
    sizes = {name: len(splits.split(name)[1]) for name in NAMES}
    assert sizes == {"train": 1077, "val": 360, "test": 360}
    for name in NAMES:
        x, y = splits.split(name)
        assert len(x) == len(y)


def test_shapes_dtypes_and_range(splits):
    for name in NAMES:
        x, y = splits.split(name)
        assert x.dtype == np.float32 and x.shape == (len(y), 1, 8, 8)
        assert y.dtype == np.int64 and y.shape == (len(x),)
        assert x.min() >= 0.0 and x.max() <= 1.0
        np.testing.assert_array_equal(x * 16, np.round(x * 16))  # the 17 grey levels 0/16 .. 16/16
        assert set(np.unique(y)) == set(range(10))
    x_all = np.concatenate([splits.split(n)[0] for n in NAMES])
    assert x_all.min() == 0.0 and x_all.max() == 1.0


def test_parts_partition_the_whole_data_set(splits):
    """Every digits example lands in exactly one part (sklearn's digits has no duplicate images)."""
    bunch = load_digits()
    whole = _examples((bunch.images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8), bunch.target)
    parts = [_examples(*splits.split(name)) for name in NAMES]
    assert sum(parts, Counter()) == whole
    for i in range(3):
        for j in range(i + 1, 3):
            assert not (parts[i].keys() & parts[j].keys())


def test_split_is_stratified(splits):
    totals = np.bincount(load_digits().target, minlength=10)
    for name in NAMES:
        counts = np.bincount(splits.split(name)[1], minlength=10)
        # Each class gets its share of the part, up to rounding of the per-class count.
        assert np.all(np.abs(counts - FRACTIONS[name] * totals) <= 1), (name, counts)


def test_same_seed_same_split_other_seed_other_train_val_same_test(splits):
    again = digits(0)
    other = digits(1)
    for name in NAMES:
        np.testing.assert_array_equal(again.split(name)[0], splits.split(name)[0])
        np.testing.assert_array_equal(again.split(name)[1], splits.split(name)[1])
    assert not np.array_equal(other.x_train, splits.x_train)
    # The test split never moves, so no seed's training images leak into evaluation.
    np.testing.assert_array_equal(other.x_test, splits.x_test)
    assert not _examples(other.x_train, other.y_train) & _examples(splits.x_test, splits.y_test)


def test_split_returns_the_fields(splits):
    assert splits.split("train")[0] is splits.x_train and splits.split("train")[1] is splits.y_train
    assert splits.split("val")[0] is splits.x_val and splits.split("test")[1] is splits.y_test


def test_unknown_split_name_is_refused(splits):
    with pytest.raises(InvalidOptionError, match="'validation'"):
        splits.split("validation")


def test_splits_are_frozen(splits):
    with pytest.raises(AttributeError):
        splits.x_train = splits.x_test
