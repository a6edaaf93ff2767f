"""Record schemas: parsing, checking and encoding records against a task."""

from __future__ import annotations

import numpy as np
import pytest

from capc.data.schema import (
    CategoricalFeature,
    ImageSchema,
    NumericFeature,
    SchemaError,
    TableSchema,
    parse_classes,
    parse_records,
)
from capc.task_config import TaskConfig, TaskError, config_hash

TABLE = {
    "kind": "table",
    "features": [
        {"name": "age", "min": 0, "max": 100},
        {"name": "smoker", "levels": ["no", "yes"]},
        {"name": "stage", "levels": [1, 2, 3]},
    ],
}


def test_a_table_encodes_numeric_by_its_public_range_and_levels_one_hot() -> None:
    schema = parse_records(TABLE)
    assert isinstance(schema, TableSchema)
    assert schema.input_shape == (6,)
    x = schema.encode({"age": [50, 100], "smoker": ["yes", "no"], "stage": [3.0, 1.0]}, "t.csv")
    np.testing.assert_array_equal(x, [[0.5, 0, 1, 0, 0, 1], [1.0, 1, 0, 1, 0, 0]])
    assert schema.check(x, "t.npz") is not None


@pytest.mark.parametrize(
    ("columns", "needle"),
    [
        (
            {"age": [5, float("nan")], "smoker": ["no", "no"], "stage": [1, 1]},
            "row 11, feature 'age'",
        ),
        ({"age": [5, 101], "smoker": ["no", "no"], "stage": [1, 1]}, "outside its public range"),
        ({"age": [5, 6], "smoker": ["no", "maybe"], "stage": [1, 1]}, "'maybe' is not one of"),
        ({"age": [5, "old"], "smoker": ["no", "no"], "stage": [1, 1]}, "'old' is not a number"),
        ({"age": [5, 6], "stage": [1, 1]}, "missing column 'smoker'"),
    ],
)
def test_a_bad_row_is_named_by_file_row_and_feature(
    columns: dict[str, list[object]], needle: str
) -> None:
    schema = parse_records(TABLE)
    assert isinstance(schema, TableSchema)
    with pytest.raises(SchemaError, match=r"t\.csv") as err:
        schema.encode(columns, "t.csv", first_row=10)
    assert needle in str(err.value)


def test_random_rows_come_from_the_public_ranges_alone() -> None:
    schema = TableSchema((NumericFeature("a", -5, 5), CategoricalFeature("b", ("x", "y", "z"))))
    x = schema.random(500, np.random.default_rng(0))
    schema.check(x, "random")
    assert 0.3 < x[:, 0].mean() < 0.7
    assert set(np.argmax(x[:, 1:], axis=1)) == {0, 1, 2}


def test_images_are_checked_for_shape_nan_and_range() -> None:
    schema = parse_records({"kind": "image", "channels": 1, "height": 4, "width": 4})
    assert isinstance(schema, ImageSchema)
    ok = np.zeros((3, 1, 4, 4), dtype=np.float32)
    schema.check(ok, "a.npz")
    with pytest.raises(SchemaError, match=r"shape \(N, 1, 4, 4\)"):
        schema.check(np.zeros((3, 3, 4, 4)), "a.npz")
    bad = ok.copy()
    bad[2, 0, 1, 1] = np.nan
    with pytest.raises(SchemaError, match="record 2 has a NaN"):
        schema.check(bad, "a.npz")
    bad[2, 0, 1, 1] = 2.0
    with pytest.raises(SchemaError, match=r"record 2 .* outside the task's range \[0, 1\]"):
        schema.check(bad, "a.npz")


@pytest.mark.parametrize(
    "records",
    [
        {"kind": "audio"},
        {"kind": "table", "features": []},
        {"kind": "table", "features": [{"name": "a", "min": 1, "max": 1}]},
        {"kind": "table", "features": [{"name": "a", "levels": ["x"]}]},
        {"kind": "table", "features": [{"name": "a", "min": 0, "max": 1, "unit": "y"}]},
        {"kind": "table", "features": [{"name": "a", "min": 0, "max": float("inf")}]},
        {"kind": "image", "channels": 0, "height": 4, "width": 4},
        {"kind": "image", "channels": 1, "height": 4, "width": 4, "range": [1, 0]},
    ],
)
def test_invalid_schemas_are_refused(records: dict[str, object]) -> None:
    with pytest.raises(SchemaError):
        parse_records(records)


def test_class_names_match_the_outputs() -> None:
    assert parse_classes(["a", "b"], 2) == ("a", "b")
    for bad in (["a"], ["a", "a"], "ab", ["a", ""]):
        with pytest.raises(SchemaError):
            parse_classes(bad, 2)


def _task(**extra: object) -> dict[str, object]:
    return {
        "num_classes": 2,
        "input_shape": [6],
        "mechanism": {"name": "gnmax", "sigma": 4.0},
        **extra,
    }


def test_a_task_carries_its_records_and_class_names() -> None:
    config = _task(records=TABLE, classes=["benign", "malignant"])
    task = TaskConfig.parse("t", config, config_hash(config))
    assert isinstance(task.records, TableSchema)
    assert task.class_names == ("benign", "malignant")
    plain = _task()
    assert TaskConfig.parse("t", plain, config_hash(plain)).class_names == ("0", "1")


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"records": {**TABLE, "features": TABLE["features"][:1]}}, "does not match its records"),
        ({"records": TABLE, "classes": ["a", "b", "c"]}, "2 outputs"),
        ({"records": {"kind": "table"}}, "features"),
    ],
)
def test_a_task_whose_records_disagree_is_refused(extra: dict[str, object], needle: str) -> None:
    config = _task(**extra)
    with pytest.raises(TaskError, match=needle):
        TaskConfig.parse("t", config, config_hash(config))
