"""Programmatic table queries: rows drawn from a task's public feature ranges alone.

Row ``i`` of a batch depends only on (generator, parameters, seed, i) and the
task's :class:`~capc.data.schema.TableSchema`, which every party reads from
the same task configuration (its hash is bound into every message), so every
party regenerates exactly the same rows. No record of any hospital decides
what a query looks like: only the public ranges and levels do.

Rows come out encoded, as teachers read them: (count, width) float32, each
numeric feature's position in its public range in [0, 1], each categorical
feature one-hot over its levels (a uniformly drawn level).

Generators:
- ``uniform``: each numeric feature uniform over its public range;
- ``beta``: each numeric feature's position in its range ~ Beta(a, b). The
  default (a=1, b=3) favours the lower part of each range, where right-skewed
  measurements (sizes, areas, counts) put most records when a range is a
  data dictionary's outer bound.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from capc.data.schema import CategoricalFeature, NumericFeature, TableSchema

FloatRows = NDArray[np.float32]
#: Salt of the per-row random streams (image generators use 0 and 1).
_SALT = 2

#: Draws one row's numeric positions in [0, 1]: (rng, how many) -> (n,) float64.
NumericDraw = Callable[[np.random.Generator, int], NDArray[np.float64]]


def numeric_layout(width: int) -> TableSchema:
    """The layout of a table task that declares no schema: ``width`` numeric features whose
    encoded values span [0, 1]."""
    return TableSchema(tuple(NumericFeature(f"x{j}", 0.0, 1.0) for j in range(width)))


def _rows(seed: int, start: int, count: int, schema: TableSchema, draw: NumericDraw) -> FloatRows:
    """Rows start..start+count-1, each from its own stream (so any index range regenerates
    the same rows); numeric positions from ``draw``, categorical levels uniform."""
    numeric = [i for i, f in enumerate(schema.features) if isinstance(f, NumericFeature)]
    widths = [f.width for f in schema.features]
    offsets = np.concatenate([[0], np.cumsum(widths)[:-1]]).astype(np.int64)
    num_cols = offsets[numeric]
    cats = [
        (int(offsets[i]), f.width)
        for i, f in enumerate(schema.features)
        if isinstance(f, CategoricalFeature)
    ]
    out = np.zeros((count, schema.input_shape[0]), dtype=np.float32)
    for r in range(count):
        rng = np.random.default_rng([seed, _SALT, start + r])
        out[r, num_cols] = draw(rng, len(numeric))
        for col, width in cats:  # a few levels per row: no per-value loop
            out[r, col + int(rng.integers(0, width))] = 1.0
    return out


def uniform(seed: int, start: int, count: int, schema: TableSchema) -> FloatRows:
    """Each numeric feature uniform over its public range: (count, width) float32."""
    return _rows(seed, start, count, schema, lambda rng, n: rng.random(n))


def beta(
    seed: int, start: int, count: int, schema: TableSchema, a: float = 1.0, b: float = 3.0
) -> FloatRows:
    """Each numeric feature at position Beta(a, b) of its public range: (count, width)."""
    return _rows(seed, start, count, schema, lambda rng, n: rng.beta(a, b, n))


TABLE_GENERATORS: dict[str, Callable[..., FloatRows]] = {"uniform": uniform, "beta": beta}

#: Bounds of every parameter a table recipe may set (the recipe comes from the network).
TABLE_PARAMETERS: dict[str, dict[str, tuple[str, float, float]]] = {
    "uniform": {},
    "beta": {"a": ("float", 0.05, 100.0), "b": ("float", 0.05, 100.0)},
}


def default_generator(records: object) -> str:
    """The generator a job uses when it names none: ``beta`` for a table task (rows from the
    low part of each public range, where records tend to sit; docs/usage.md), ``gaussian``
    for images (what the DIET teachers label best)."""
    return "beta" if isinstance(records, TableSchema) else "gaussian"
