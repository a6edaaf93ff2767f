"""Programmatic query generators: deterministic per index, in range, hashed."""

from __future__ import annotations

import numpy as np
import pytest

from capc.data.generators import GENERATORS, Recipe, batch_hash


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_images_depend_only_on_their_index(name: str) -> None:
    whole = Recipe(name, seed=3, start=10, count=12, shape=(1, 16, 16)).generate()
    part = Recipe(name, seed=3, start=16, count=4, shape=(1, 16, 16)).generate()
    np.testing.assert_array_equal(whole[6:10], part)
    assert whole.dtype == np.float32 and whole.shape == (12, 1, 16, 16)
    assert whole.min() >= 0.0 and whole.max() <= 1.0
    other = Recipe(name, seed=4, start=10, count=12, shape=(1, 16, 16)).generate()
    assert not np.array_equal(whole, other)
    assert len({batch_hash(whole[i : i + 1]) for i in range(12)}) == 12


def test_channels_and_parameters() -> None:
    x = Recipe(
        "spectral", 1, 0, 3, (3, 32, 32), {"alpha_range": [1.5, 1.5], "anisotropy": 0.0}
    ).generate()
    assert x.shape == (3, 3, 32, 32)
    with pytest.raises(ValueError, match="takes no parameter 'colour'"):
        Recipe("gaussian", 1, 0, 3, (1, 8, 8), {"colour": 1}).generate()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"generator": "plasma"}, "unknown generator"),
        ({"count": 0}, "count"),
        ({"shape": (1, 2, 2)}, "sides"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_recipes(kwargs: dict[str, object], match: str) -> None:
    base: dict[str, object] = {
        "generator": "gaussian",
        "seed": 1,
        "start": 0,
        "count": 4,
        "shape": (1, 8, 8),
    }
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        Recipe(**base)  # type: ignore[arg-type]
