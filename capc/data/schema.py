"""What a task's records are: images or table rows, with public ranges, and the class names.

A task file is read by every party, so everything here is public: the shape
and value range of an image, the names and ranges of a table's numeric
features (from a data dictionary, never fitted to one hospital's records)
and the levels of its categorical ones. A schema

- checks records against the task (a bad record is named by its source and
  row or field, so a hospital can fix its file);
- encodes table rows into the float32 vectors teachers see: a numeric
  feature scaled by its public range to [0, 1], a categorical one one-hot
  over its levels, in the schema's order;
- draws programmatic queries from the public ranges alone (tables), so that
  no record of any hospital decides what a query looks like.

The ``records`` object of a task configuration::

    {"kind": "image", "channels": 1, "height": 28, "width": 28, "range": [0, 1]}
    {"kind": "table", "label": "outcome", "features": [
        {"name": "age", "min": 0, "max": 120},
        {"name": "smoker", "levels": ["no", "yes"]}]}

(``label``, optional: the column of a hospital's files that holds the class.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatRecords = NDArray[np.float32]

#: Most features a table may have (after one-hot encoding: the teachers' input width).
MAX_TABLE_WIDTH = 4096
#: Most levels one categorical feature may have.
MAX_LEVELS = 256
#: Largest image side a task may declare.
MAX_SIDE = 1024


class SchemaError(ValueError):
    """A schema, or a record checked against it, is invalid; the message names what and where."""


def _number(d: Mapping[str, Any], key: str, where: str) -> float:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SchemaError(f"{where}: {key!r} must be a finite number, got {value!r}")
    return float(value)


def _count(d: Mapping[str, Any], key: str, where: str, high: int) -> int:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise SchemaError(f"{where}: {key!r} must be an integer in [1, {high}], got {value!r}")
    return value


def _unknown_keys(d: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise SchemaError(
            f"{where}: unknown field {extra[0]!r}; allowed: {', '.join(sorted(allowed))}"
        )


@dataclass(frozen=True)
class ImageSchema:
    """Images of ``channels`` x ``height`` x ``width`` pixels with values in [low, high]."""

    channels: int
    height: int
    width: int
    low: float = 0.0
    high: float = 1.0

    kind = "image"

    def __post_init__(self) -> None:
        if not (1 <= self.channels <= 4 and 1 <= self.height <= MAX_SIDE):
            raise SchemaError(f"image channels must be 1 to 4 and sides 1 to {MAX_SIDE}")
        if not 1 <= self.width <= MAX_SIDE:
            raise SchemaError(f"image sides must be 1 to {MAX_SIDE}")
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise SchemaError(f"image range must be finite with low < high, got {self.range}")

    @property
    def range(self) -> tuple[float, float]:
        return self.low, self.high

    @property
    def input_shape(self) -> tuple[int, ...]:
        """(channels, height, width): one record's shape."""
        return self.channels, self.height, self.width

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "channels": self.channels,
            "height": self.height,
            "width": self.width,
            "range": [self.low, self.high],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ImageSchema:
        _unknown_keys(d, {"kind", "channels", "height", "width", "range"}, "records")
        rng = d.get("range", [0.0, 1.0])
        if not isinstance(rng, list | tuple) or len(rng) != 2:
            raise SchemaError(f"records: 'range' must be [low, high], got {rng!r}")
        pair = {"low": rng[0], "high": rng[1]}
        return cls(
            _count(d, "channels", "records", 4),
            _count(d, "height", "records", MAX_SIDE),
            _count(d, "width", "records", MAX_SIDE),
            _number(pair, "low", "records.range"),
            _number(pair, "high", "records.range"),
        )

    def check(self, x: ArrayLike, source: str) -> FloatRecords:
        """``x`` as (N, C, H, W) float32, every value finite and in range; SchemaError names
        ``source`` and the first bad record (0-based index)."""
        arr = np.asarray(x, dtype=np.float32)
        if arr.ndim != 4 or arr.shape[1:] != self.input_shape:
            raise SchemaError(
                f"{source}: images must have shape (N, {self.channels}, {self.height}, "
                f"{self.width}), got {arr.shape}"
            )
        return _check_values(arr, self.low, self.high, source, "pixel")


def _check_values(
    arr: FloatRecords, low: float, high: float, source: str, what: str
) -> FloatRecords:
    """``arr`` unchanged when every value is finite and in [low, high] (a small float slack)."""
    flat = arr.reshape(len(arr), -1)
    bad = ~np.isfinite(flat).all(axis=1)
    if bad.any():
        raise SchemaError(f"{source}: record {int(np.argmax(bad))} has a NaN or infinite {what}")
    slack = 1e-6 * (high - low)
    out = (flat < low - slack) | (flat > high + slack)
    if out.any():
        row = int(np.argmax(out.any(axis=1)))
        value = float(flat[row][out[row]][0])
        raise SchemaError(
            f"{source}: record {row} has a {what} value {value:g} outside the task's range "
            f"[{low:g}, {high:g}]"
        )
    return arr


@dataclass(frozen=True)
class NumericFeature:
    """A numeric column with its public range [low, high]."""

    name: str
    low: float
    high: float

    @property
    def width(self) -> int:
        return 1

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "min": self.low, "max": self.high}


@dataclass(frozen=True)
class CategoricalFeature:
    """A categorical column and its levels (read as strings: ``1`` and ``"1"`` are one level)."""

    name: str
    levels: tuple[str, ...]

    @property
    def width(self) -> int:
        return len(self.levels)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "levels": list(self.levels)}


Feature = NumericFeature | CategoricalFeature


def _feature(d: Any, i: int) -> Feature:
    where = f"records.features[{i}]"
    if not isinstance(d, Mapping):
        raise SchemaError(f"{where} must be an object with a name, got {d!r}")
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise SchemaError(f"{where}: 'name' must be a non-empty string")
    where = f"feature {name!r}"
    if "levels" in d:
        _unknown_keys(d, {"name", "levels"}, where)
        levels = d["levels"]
        if not isinstance(levels, list) or not 2 <= len(levels) <= MAX_LEVELS:
            raise SchemaError(f"{where}: 'levels' must list 2 to {MAX_LEVELS} levels")
        names = tuple(str(v) for v in levels)
        if len(set(names)) != len(names):
            raise SchemaError(f"{where}: its levels repeat: {list(names)}")
        return CategoricalFeature(name, names)
    _unknown_keys(d, {"name", "min", "max"}, where)
    low, high = _number(d, "min", where), _number(d, "max", where)
    if not low < high:
        raise SchemaError(f"{where}: 'min' must be below 'max', got [{low:g}, {high:g}]")
    return NumericFeature(name, low, high)


@dataclass(frozen=True)
class TableSchema:
    """Rows of named features: numeric ones with public ranges, categorical ones with levels."""

    features: tuple[Feature, ...]
    #: The column that holds a row's class in a hospital's files (not a feature; optional).
    label: str | None = None

    kind = "table"

    def __post_init__(self) -> None:
        if not self.features:
            raise SchemaError("a table needs at least one feature")
        names = [f.name for f in self.features]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SchemaError(f"a table's feature names must be unique; repeated: {dup}")
        if self.label is not None and (not self.label or self.label in names):
            raise SchemaError(f"the label column {self.label!r} must be named and not a feature")
        if self.input_shape[0] > MAX_TABLE_WIDTH:
            raise SchemaError(
                f"the table encodes to {self.input_shape[0]} values, more than {MAX_TABLE_WIDTH}"
            )

    @property
    def columns(self) -> list[str]:
        """The feature names, in encoding order."""
        return [f.name for f in self.features]

    @property
    def input_shape(self) -> tuple[int, ...]:
        """(width,): numeric features plus every categorical level (one-hot)."""
        return (sum(f.width for f in self.features),)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "features": [f.to_dict() for f in self.features]}
        if self.label is not None:
            out["label"] = self.label
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TableSchema:
        _unknown_keys(d, {"kind", "features", "label"}, "records")
        features = d.get("features")
        if not isinstance(features, list):
            raise SchemaError("records: 'features' must be a list of features")
        label = d.get("label")
        if label is not None and not isinstance(label, str):
            raise SchemaError(f"records: 'label' must be a column name, got {label!r}")
        return cls(tuple(_feature(f, i) for i, f in enumerate(features)), label)

    def encode(self, columns: Mapping[str, Any], source: str, first_row: int = 0) -> FloatRecords:
        """Rows (any column-mapping, e.g. a pandas DataFrame) -> (N, width) float32.

        Every feature must be a column; extra columns are ignored. A missing
        value, a number outside its public range or an unknown level is a
        SchemaError naming ``source``, the row (``first_row`` + 0-based index,
        as the caller counts rows) and the feature.
        """
        missing = [name for name in self.columns if name not in columns]
        if missing:
            raise SchemaError(
                f"{source}: missing column {missing[0]!r}; the task's features are "
                f"{', '.join(self.columns)}"
            )
        parts: list[NDArray[np.float32]] = []
        for f in self.features:
            values = np.asarray(columns[f.name])
            if isinstance(f, NumericFeature):
                parts.append(_scaled(f, values, source, first_row))
            else:
                parts.append(_one_hot(f, values, source, first_row))
        return np.concatenate(parts, axis=1).astype(np.float32)

    def check(self, x: ArrayLike, source: str) -> FloatRecords:
        """Encoded rows (N, width): finite, numeric parts in [0, 1], each categorical part one-hot."""
        arr = np.asarray(x, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[1:] != self.input_shape:
            raise SchemaError(
                f"{source}: encoded rows must have shape (N, {self.input_shape[0]}), got {arr.shape}"
            )
        _check_values(arr, 0.0, 1.0, source, "feature")
        col = 0
        for f in self.features:
            if isinstance(f, CategoricalFeature):
                block = arr[:, col : col + f.width]
                bad = ~(((block == 0) | (block == 1)).all(axis=1) & (block.sum(axis=1) == 1))
                if bad.any():
                    raise SchemaError(
                        f"{source}: record {int(np.argmax(bad))}: feature {f.name!r} is not one "
                        f"of its {f.width} levels (one-hot)"
                    )
            col += f.width
        return arr

    def random(self, count: int, rng: np.random.Generator) -> FloatRecords:
        """``count`` encoded rows drawn from the public ranges alone: each numeric feature
        uniform over its range, each categorical one a uniform level. (count, width) float32."""
        parts: list[NDArray[np.float32]] = []
        for f in self.features:
            if isinstance(f, NumericFeature):
                parts.append(rng.random((count, 1), dtype=np.float32))
            else:
                parts.append(np.eye(f.width, dtype=np.float32)[rng.integers(0, f.width, count)])
        return np.concatenate(parts, axis=1)


def _scaled(
    f: NumericFeature, values: NDArray[Any], source: str, first_row: int
) -> NDArray[np.float32]:
    try:
        v = values.astype(np.float64)
    except (TypeError, ValueError):
        row = next(i for i, s in enumerate(values) if not _is_number(s))
        raise SchemaError(
            f"{source}: row {first_row + row}, feature {f.name!r}: {str(values[row])!r} is not a "
            "number"
        ) from None
    bad = ~np.isfinite(v)
    if bad.any():
        row = int(np.argmax(bad))
        raise SchemaError(
            f"{source}: row {first_row + row}, feature {f.name!r}: missing or not finite "
            f"({str(values[row])!r})"
        )
    out = (v < f.low) | (v > f.high)
    if out.any():
        row = int(np.argmax(out))
        raise SchemaError(
            f"{source}: row {first_row + row}, feature {f.name!r}: {v[row]:g} is outside its "
            f"public range [{f.low:g}, {f.high:g}]. If the value is right, the task's range "
            "is too narrow (often taken from one hospital's sample): the consortium agrees on "
            f"a wider public one (capc task init ... --range-of '{f.name}=LOW,HIGH', or the "
            "task file's min and max), re-registers the task and re-packs; or leave such "
            "rows out"
        )
    return ((v - f.low) / (f.high - f.low)).astype(np.float32)[:, None]


def _is_number(s: object) -> bool:
    try:
        float(s)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def level_names(values: NDArray[Any]) -> list[str]:
    """Values as level names: whole floats without '.0' (pandas reads int columns with a gap
    as floats), missing values as ''."""
    out = []
    for v in values.tolist():
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append("")
        elif isinstance(v, float) and v.is_integer():
            out.append(str(int(v)))
        else:
            out.append(str(v))
    return out


def _one_hot(
    f: CategoricalFeature, values: NDArray[Any], source: str, first_row: int
) -> NDArray[np.float32]:
    index = {level: i for i, level in enumerate(f.levels)}
    names = level_names(values)
    codes = np.fromiter((index.get(n, -1) for n in names), dtype=np.int64, count=len(names))
    bad = codes < 0
    if bad.any():
        row = int(np.argmax(bad))
        shown = names[row] or "a missing value"
        raise SchemaError(
            f"{source}: row {first_row + row}, feature {f.name!r}: {shown!r} is not one of its "
            f"levels {list(f.levels)}"
        )
    return np.eye(f.width, dtype=np.float32)[codes]


RecordSchema = ImageSchema | TableSchema


def parse_records(d: object) -> RecordSchema:
    """A ``records`` object of a task configuration -> its schema; SchemaError says what is wrong."""
    if not isinstance(d, Mapping):
        raise SchemaError(f"records must be an object with a 'kind', got {d!r}")
    kind = d.get("kind")
    if kind == "image":
        return ImageSchema.from_dict(d)
    if kind == "table":
        return TableSchema.from_dict(d)
    raise SchemaError(f"records: 'kind' must be 'image' or 'table', got {kind!r}")


def parse_classes(names: object, outputs: int) -> tuple[str, ...]:
    """The ``classes`` list of a task: ``outputs`` distinct non-empty names."""
    if not isinstance(names, Sequence) or isinstance(names, str):
        raise SchemaError(f"classes must be a list of names, got {names!r}")
    out = tuple(str(n) for n in names)
    if len(out) != outputs:
        raise SchemaError(f"classes names {len(out)} classes but the task has {outputs} outputs")
    if len(set(out)) != len(out) or any(not n for n in out):
        raise SchemaError(f"class names must be distinct and non-empty, got {list(out)}")
    return out
