"""A hospital's data checked against a task, task proposals and GNMax sizing (in process)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capc.data import infer
from capc.data.readers import read_records
from capc.data.schema import ImageSchema, SchemaError, TableSchema, parse_records
from capc.learning.hospital import majority, split
from capc.mechanisms import from_config
from capc.models import build
from capc.models.checkpoint import Teacher
from capc.models.ensemble import Voters, save_checkpoints
from capc.planning.sizing import NoUsefulSigmaError, labelling_margin, plan_gnmax
from capc.privacy import accountants
from tests.hospital_files import (
    ANIMAL_CLASSES,
    DIGIT_CLASSES,
    animal_split,
    breast_cancer_frame,
    write_dicom_set,
    write_png_folder,
)

IMAGES = ImageSchema(1, 28, 28)


def _table(tmp_path: Path) -> tuple[Path, TableSchema, tuple[str, ...]]:
    frame = breast_cancer_frame().head(60)
    path = tmp_path / "records.csv"
    frame.to_csv(path, index=False)
    proposal = infer.table(path, "diagnosis", ["patient_id"])
    assert isinstance(proposal.records, TableSchema)
    return path, proposal.records, proposal.classes


# -- sizing --------------------------------------------------------------------------------
def test_sigma_fits_the_target_queries_in_the_ledgers_accountant() -> None:
    plan = plan_gnmax(
        classes=10,
        hospitals=5,
        teachers_per_hospital=50,
        quorum=5,
        epsilon=10.0,
        delta=1e-5,
        queries=1024,
    )
    ledger = accountants.make(accountants.DEFAULT_ACCOUNTANT)
    per_query = from_config(plan.mechanism(), 10).per_query()
    assert ledger.max_count(per_query, 10.0, 1e-5) == plan.queries_fit >= 1024
    # the smallest such sigma, to three figures: 1% less noise no longer fits
    smaller = from_config({"name": "gnmax", "sigma": plan.sigma * 0.99}, 10).per_query()
    assert ledger.max_count(smaller, 10.0, 1e-5) < 1024
    assert plan.margin == pytest.approx(labelling_margin(plan.sigma, 10))
    assert plan.margin < plan.min_voters
    assert any(str(plan.queries_fit) in line for line in plan.explain())


def test_the_demo_configuration_is_reproduced() -> None:
    # services/commands/demo.py: sigma 40 lets 3,072 queries fit eps 9.75 per hospital.
    plan = plan_gnmax(
        classes=10,
        hospitals=5,
        teachers_per_hospital=50,
        quorum=3,
        epsilon=9.75,
        delta=1e-5,
        queries=3072,
    )
    assert plan.sigma == pytest.approx(40.0, rel=0.01)


def test_too_few_voters_is_refused_with_what_to_change() -> None:
    with pytest.raises(NoUsefulSigmaError, match="teachers per hospital"):
        plan_gnmax(
            classes=10,
            hospitals=3,
            teachers_per_hospital=2,
            quorum=2,
            epsilon=10.0,
            delta=1e-5,
            queries=1024,
        )


def test_rounding_outward() -> None:
    assert infer.round_outward(6.981, 28.11) == (6.0, 29.0)
    assert infer.round_outward(0.05263, 0.1634) == (0.05, 0.17)
    assert infer.round_outward(143.5, 2501.0) == (100.0, 2600.0)
    lo, hi = infer.round_outward(3.0, 3.0)
    assert lo < 3.0 < hi and lo >= 0


# -- proposals -----------------------------------------------------------------------------
def test_table_proposal_keeps_the_label_and_warns_ranges_are_public(tmp_path: Path) -> None:
    path, schema, classes = _table(tmp_path)
    assert classes == ("benign", "malignant")
    assert schema.label == "diagnosis" and "patient_id" not in schema.columns
    assert parse_records(schema.to_dict()) == schema
    frame = pd.read_csv(path)
    encoded = schema.encode(frame, "x")
    assert encoded.shape == (60, 30) and encoded.min() >= 0 and encoded.max() <= 1
    notes = infer.table(path, "diagnosis", ["patient_id"]).notes
    assert any("PUBLIC" in n and "data dictionary" in n for n in notes)


def test_numeric_classes_sort_as_numbers() -> None:
    assert infer.sorted_levels(np.array([10, 2, 1, 2.0])) == ["1", "2", "10"]
    assert infer.sorted_levels(np.array(["b", "a", None], dtype=object)) == ["a", "b"]


def test_an_identifier_column_must_be_dropped(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    breast_cancer_frame().to_csv(path, index=False)
    with pytest.raises(SchemaError, match="--drop patient_id"):
        infer.table(path, "diagnosis")


# -- readers: every bad record named -------------------------------------------------------
def test_corrupt_png_is_named(tmp_path: Path) -> None:
    x, y, _, _ = animal_split(2, test=0)
    root = write_png_folder(tmp_path / "png", x, y, ANIMAL_CLASSES)
    bad = root / ANIMAL_CLASSES[3] / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really")
    with pytest.raises(SchemaError, match=r"broken\.png: not a readable image"):
        read_records(root, IMAGES, (1, 28, 28), ANIMAL_CLASSES)


def test_png_of_another_size_is_resized_and_unknown_folder_named(tmp_path: Path) -> None:
    from PIL import Image

    x, y, _, _ = animal_split(2, test=0)
    root = write_png_folder(tmp_path / "png", x, y, ANIMAL_CLASSES)
    Image.new("RGB", (40, 30), (200, 10, 10)).save(root / ANIMAL_CLASSES[0] / "big.png")
    records = read_records(root, IMAGES, (1, 28, 28), ANIMAL_CLASSES)
    assert records.x.shape == (21, 1, 28, 28) and 0 <= records.x.min() <= records.x.max() <= 1
    (root / "zebra").mkdir()
    with pytest.raises(SchemaError, match="'zebra' is not one of the task's classes"):
        read_records(root, IMAGES, (1, 28, 28), ANIMAL_CLASSES)


def test_csv_nan_unknown_label_and_missing_column_are_named(tmp_path: Path) -> None:
    path, schema, classes = _table(tmp_path)
    frame = pd.read_csv(path)
    broken = frame.copy()
    broken.loc[4, "mean radius"] = np.nan
    broken.to_csv(path, index=False)
    # row 4 of the frame is line 6 of the file (header on line 1)
    with pytest.raises(SchemaError, match=r"records\.csv: row 6, feature 'mean radius'"):
        read_records(path, schema, schema.input_shape, classes)
    broken = frame.copy()
    broken.loc[7, "diagnosis"] = "unsure"
    broken.to_csv(path, index=False)
    with pytest.raises(SchemaError, match=r"row 9: label 'unsure' is not one of"):
        read_records(path, schema, schema.input_shape, classes)
    frame.drop(columns=["mean texture"]).to_csv(path, index=False)
    with pytest.raises(SchemaError, match="missing column 'mean texture'"):
        read_records(path, schema, schema.input_shape, classes)
    frame.drop(columns=["diagnosis"]).to_csv(path, index=False)
    with pytest.raises(SchemaError, match="missing label column 'diagnosis'"):
        read_records(path, schema, schema.input_shape, classes)


def test_out_of_range_value_is_named(tmp_path: Path) -> None:
    path, schema, classes = _table(tmp_path)
    frame = pd.read_csv(path)
    frame.loc[2, "mean area"] = 1e6
    frame.to_csv(path, index=False)
    with pytest.raises(SchemaError, match=r"row 4, feature 'mean area'.*outside its public range"):
        read_records(path, schema, schema.input_shape, classes)


def test_dicom_without_a_label_row_is_named(tmp_path: Path) -> None:
    root, labels = write_dicom_set(tmp_path / "dicom", 6)
    records = read_records(root, IMAGES, (1, 28, 28), DIGIT_CLASSES, labels_csv=labels)
    assert records.x.shape == (6, 1, 28, 28) and records.x.max() > 0.5
    table = pd.read_csv(labels)
    missing = table.loc[2, "file"]
    table.drop(index=2).to_csv(labels, index=False)
    with pytest.raises(SchemaError, match=f"{missing}: no row in .*labels.csv"):
        read_records(root, IMAGES, (1, 28, 28), DIGIT_CLASSES, labels_csv=labels)


def test_corrupt_dicom_is_named(tmp_path: Path) -> None:
    root, labels = write_dicom_set(tmp_path / "dicom", 3)
    name = pd.read_csv(labels).loc[1, "file"]
    (root / name).write_bytes(b"garbage")
    with pytest.raises(SchemaError, match=f"{name}: not a readable DICOM image"):
        read_records(root, IMAGES, (1, 28, 28), DIGIT_CLASSES, labels_csv=labels)


def test_npz_nan_shape_and_label_are_named(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    x = np.full((5, 1, 28, 28), 0.5, dtype=np.float32)
    x[3, 0, 1, 2] = np.nan
    np.savez(path, x=x, y=np.array(DIGIT_CLASSES[:5]))
    with pytest.raises(SchemaError, match=r"d\.npz: record 3 has a NaN"):
        read_records(path, IMAGES, (1, 28, 28), DIGIT_CLASSES)
    np.savez(path, x=np.zeros((5, 1, 20, 20)), y=np.arange(5))
    with pytest.raises(SchemaError, match=r"d\.npz: images must have shape"):
        read_records(path, IMAGES, (1, 28, 28), DIGIT_CLASSES)
    np.savez(path, x=np.zeros((2, 1, 28, 28)), y=np.array([1, 12]))
    with pytest.raises(SchemaError, match=r"row 1: label 12 is not a class index"):
        read_records(path, IMAGES, (1, 28, 28), DIGIT_CLASSES)
    np.savez(path, x=np.zeros((2, 1, 28, 28)))
    with pytest.raises(SchemaError, match="missing array 'y'"):
        read_records(path, IMAGES, (1, 28, 28), DIGIT_CLASSES)


# -- split and the checkpoints file --------------------------------------------------------
def test_split_is_disjoint_and_stratified() -> None:
    y = np.repeat(np.arange(4), [50, 30, 15, 5])
    plan = split(y, 3, 0.2, seed=1)
    everything = np.concatenate([*plan.parts, plan.held_out])
    assert sorted(everything.tolist()) == list(range(len(y)))
    assert np.bincount(y[plan.held_out]).tolist() == [10, 6, 3, 1]
    assert max(map(len, plan.parts)) - min(map(len, plan.parts)) <= 1
    with pytest.raises(ValueError, match="fewer --teachers"):
        split(y, 60, 0.2)


def test_majority_vote() -> None:
    votes = np.array([[0, 1, 1], [2, 2, 0], [0, 1, 2]])
    assert majority(votes, 3).tolist() == [1, 2, 0]


def test_a_file_of_checkpoints_votes_with_every_member(tmp_path: Path) -> None:
    members = [
        Teacher("mlp", (6,), 3, build("mlp", (6,), 3), {"teacher": t}, device="cpu")
        for t in range(3)
    ]
    path = tmp_path / "three.pt"
    save_checkpoints(path, members)
    voters = Voters.load([path])
    assert len(voters) == 3 and voters.input_shape == (6,)
    queries = np.random.default_rng(0).random((4, 6), dtype=np.float32)
    assert voters.predict(queries).shape == (4, 3)
    assert [m.card["teacher"] for m in voters.members] == [0, 1, 2]


def test_parquet_and_jpeg_are_read(tmp_path: Path) -> None:
    from PIL import Image

    path, schema, classes = _table(tmp_path)
    parquet = tmp_path / "records.parquet"
    pd.read_csv(path).to_parquet(parquet)
    records = read_records(parquet, schema, schema.input_shape, classes)
    assert records.x.shape == (60, 30) and len(set(records.y.tolist())) == 2
    folder = tmp_path / "jpeg" / ANIMAL_CLASSES[1]
    folder.mkdir(parents=True)
    Image.new("RGB", (28, 28), (255, 255, 255)).save(folder / "white.jpg")
    rgb = ImageSchema(3, 28, 28, -1.0, 1.0)
    one = read_records(tmp_path / "jpeg", rgb, (3, 28, 28), ANIMAL_CLASSES)
    assert one.x.shape == (1, 3, 28, 28) and one.y.tolist() == [1]
    assert np.allclose(one.x, 1.0, atol=0.02)  # white, in the task's range [-1, 1]
