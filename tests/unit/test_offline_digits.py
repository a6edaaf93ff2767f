"""capc.data.offline.digits reads scikit-learn's digits file without importing
scikit-learn: the same arrays as its own reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from capc.data import offline
from capc.data.offline import digits


def test_digits_are_scikit_learns() -> None:
    x, y = digits(8)
    d = load_digits()
    assert x.shape == (1797, 1, 8, 8) and x.dtype == np.float32
    np.testing.assert_array_equal(x[:, 0], (d.images / 16.0).astype(np.float32))
    np.testing.assert_array_equal(y, d.target)


def test_without_the_file_digits_are_read_by_scikit_learn(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A scikit-learn that keeps its data elsewhere: the fallback reader, same arrays.
    monkeypatch.setattr(offline, "_package_folder", lambda _name: tmp_path)
    x, y = digits(8)
    d = load_digits()
    np.testing.assert_array_equal(x[:, 0], (d.images / 16.0).astype(np.float32))
    np.testing.assert_array_equal(y, d.target)
