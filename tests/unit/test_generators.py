"""Programmatic query generators: deterministic per index, in range, hashed."""

from __future__ import annotations

import numpy as np
import pytest

from capc.data.generators import GENERATORS, Recipe, batch_hash
from capc.data.schema import CategoricalFeature, NumericFeature, TableSchema
from capc.data.table_queries import TABLE_GENERATORS


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


def _schema() -> TableSchema:
    return TableSchema(
        (
            NumericFeature("age", 0, 120),
            CategoricalFeature("smoker", ("no", "yes", "former")),
            NumericFeature("weight", 30, 250),
        )
    )


@pytest.mark.parametrize("name", sorted(TABLE_GENERATORS))
def test_table_rows_depend_only_on_their_index(name: str) -> None:
    schema = _schema()
    whole = Recipe(name, seed=3, start=10, count=12, shape=(5,)).generate(schema)
    part = Recipe(name, seed=3, start=16, count=4, shape=(5,)).generate(schema)
    np.testing.assert_array_equal(whole[6:10], part)
    assert whole.dtype == np.float32 and whole.shape == (12, 5)
    # Encoded as the schema encodes records: in range, each categorical block one-hot.
    np.testing.assert_array_equal(schema.check(whole, "queries"), whole)
    other = Recipe(name, seed=4, start=10, count=12, shape=(5,)).generate(schema)
    assert not np.array_equal(whole, other)


def test_table_recipes_take_their_layout_from_the_task() -> None:
    recipe = Recipe("uniform", 0, 0, 4, (5,))
    with pytest.raises(ValueError, match="width 5, the task's schema 4"):
        recipe.generate(TableSchema(tuple(NumericFeature(f"b{i}", 0, 1) for i in range(4))))
    # A table task without a schema: every column numeric.
    assert Recipe("uniform", 0, 0, 4, (5,)).generate().shape == (4, 5)
    assert Recipe.from_json(recipe.to_json()) == recipe
    with pytest.raises(ValueError, match="draws table rows"):
        Recipe("uniform", 0, 0, 4, (1, 8, 8))
    with pytest.raises(ValueError, match="draws images"):
        Recipe("gaussian", 0, 0, 4, (30,))
    with pytest.raises(ValueError, match="parameter 'a' must be"):
        Recipe("beta", 0, 0, 4, (5,), {"a": 0.0})


def test_beta_rows_sit_low_in_their_ranges() -> None:
    x = Recipe("beta", 0, 0, 2000, (4,), {"a": 1.0, "b": 3.0}).generate()
    assert abs(float(x.mean()) - 0.25) < 0.02  # Beta(1, 3) has mean 1/4
