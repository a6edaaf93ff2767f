"""A task's records and classes proposed from a sample of data (``capc task init``).

What this proposes becomes public (every party reads the task file), so a
table's ranges are rounded outward and the caller is told to replace them by
a data dictionary's: ranges fitted to private records would leak their
extremes. Images need no such care: their shape and range are properties of
the format.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from capc.data.readers import IMAGE_SUFFIXES, read_frame
from capc.data.schema import (
    MAX_LEVELS,
    CategoricalFeature,
    Feature,
    ImageSchema,
    NumericFeature,
    RecordSchema,
    SchemaError,
    TableSchema,
    level_names,
)

#: Channels of the Pillow modes an image folder may hold (others are read as RGB).
_CHANNELS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "F": 1, "LA": 2, "RGB": 3, "RGBA": 4, "P": 3}


@dataclass
class Proposal:
    """A proposed ``records`` schema, the classes, and what the user must check (``notes``)."""

    records: RecordSchema
    classes: tuple[str, ...]
    notes: list[str] = field(default_factory=list)


def round_outward(low: float, high: float) -> tuple[float, float]:
    """[low, high] widened to round numbers: a step of a tenth of the span's order of magnitude.

    A constant column (low == high) gets a unit-wide range around its value.
    The result never crosses 0 when the input does not (a non-negative
    feature stays non-negative).
    """
    span = high - low
    if span <= 0:
        step = 10.0 ** math.floor(math.log10(abs(low))) if low != 0 else 1.0
        lo, hi = low - step, high + step
        return (max(lo, 0.0) if low >= 0 else lo), hi
    step = 10.0 ** (math.floor(math.log10(span)) - 1)
    lo = math.floor(low / step) * step
    hi = math.ceil(high / step) * step
    # Round away the float noise of the multiplication (0.30000000000000004).
    digits = max(0, -math.floor(math.log10(step)))
    return round(lo, digits), round(hi, digits)


def sorted_levels(values: Any) -> list[str]:
    """The distinct non-missing level names of ``values``: in numeric order when every one is
    a number (classes 2 before 10), else alphabetical."""
    names = set(level_names(np.asarray(values, dtype=object))) - {""}
    try:
        return sorted(names, key=float)
    except ValueError:
        return sorted(names)


def image_folder(folder: Path, range_: tuple[float, float] = (0.0, 1.0)) -> Proposal:
    """Channels and size of the most common kind of image in ``folder``'s class subfolders;
    the subfolders' names are the classes."""
    from PIL import Image, UnidentifiedImageError

    subfolders = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(subfolders) < 2:
        raise SchemaError(
            f"{folder}: needs one subfolder per class (at least two), named after the class"
        )
    kinds: Counter[tuple[int, int, int]] = Counter()
    for sub in subfolders:
        for f in sorted(sub.iterdir()):
            if not (f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES):
                continue
            try:
                with Image.open(f) as img:  # reads the header only
                    kinds[(_CHANNELS.get(img.mode, 3), img.height, img.width)] += 1
            except (UnidentifiedImageError, OSError) as err:
                raise SchemaError(f"{f}: not a readable image ({err})") from None
    if not kinds:
        raise SchemaError(f"{folder}: no {'/'.join(IMAGE_SUFFIXES)} files in its class folders")
    (c, h, w), n = kinds.most_common(1)[0]
    notes = []
    if n < sum(kinds.values()):
        notes.append(
            f"images differ in size or colour; the task takes the most common kind ({c}x{h}x{w}, "
            f"{n} of {sum(kinds.values())}) and the others are converted when a teacher is fitted"
        )
    return Proposal(ImageSchema(c, h, w, *range_), tuple(s.name for s in subfolders), notes)


def _is_numeric(values: Any) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values))


def table(path: Path, label: str, drop: Sequence[str] = ()) -> Proposal:
    """Features of a CSV/Parquet sample: numeric columns with outward-rounded ranges (to be
    checked against a data dictionary), other columns categorical with the levels seen;
    ``label``'s values are the classes; ``drop``: columns left out (identifiers)."""
    frame = read_frame(path)
    for name in [label, *drop]:
        if name not in frame.columns:
            raise SchemaError(
                f"{path}: no column {name!r}; its columns are {', '.join(map(str, frame.columns))}"
            )
    classes = sorted_levels(frame[label].to_numpy())
    if len(classes) < 2:
        raise SchemaError(f"{path}: label column {label!r} has {len(classes)} class(es); need 2")
    features: list[Feature] = []
    notes = [
        "the numeric features' ranges in the task file are the sample's, rounded outward. Ranges are PUBLIC: every party "
        "reads them. Replace each by the range in your data dictionary (not fitted to private "
        "records) and check it before sharing the task file"
    ]
    for name in frame.columns:
        if name == label or name in drop:
            continue
        values = frame[name]
        if _is_numeric(values):
            finite = values.to_numpy(dtype=np.float64)
            finite = finite[np.isfinite(finite)]
            if len(finite) == 0:
                raise SchemaError(f"{path}: column {name!r} has no values; --drop it")
            if len(finite) < len(values):
                notes.append(f"column {name!r} has missing values; teachers refuse such rows")
            features.append(NumericFeature(str(name), *round_outward(finite.min(), finite.max())))
            continue
        levels = sorted_levels(values.to_numpy())
        if len(levels) > MAX_LEVELS or len(levels) > max(20, len(values) // 2):
            raise SchemaError(
                f"{path}: column {name!r} has {len(levels)} distinct values, like an identifier; "
                f"leave it out with --drop {name}"
            )
        if len(levels) < 2:
            raise SchemaError(
                f"{path}: column {name!r} has {len(levels)} level(s) in the sample; a categorical "
                f"feature needs 2: --drop {name}, or add its levels to the task file"
            )
        if values.isna().any():
            notes.append(f"column {name!r} has missing values; teachers refuse such rows")
        features.append(CategoricalFeature(str(name), tuple(levels)))
    if not features:
        raise SchemaError(f"{path}: no feature columns left besides the label")
    return Proposal(TableSchema(tuple(features), label), tuple(classes), notes)
