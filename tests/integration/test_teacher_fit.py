"""``capc task init`` and ``capc teacher fit`` as a hospital runs them: the fits as separate
processes on files the test writes (PNG folder, CSV, DICOM set, NPZ), outputs loaded as an
answering party loads them; bad records refused by name with no output left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capc.data.offline import digits
from capc.data.schema import TableSchema
from capc.mechanisms import from_config
from capc.models.ensemble import Voters
from capc.privacy import accountants
from capc.task_config import TaskConfig, config_hash
from services.commands import cli
from tests.hospital_files import (
    ANIMAL_CLASSES,
    DIGIT_CLASSES,
    animal_split,
    breast_cancer_frame,
    digits_npz,
    write_dicom_set,
    write_png_folder,
)

CONSORTIUM = ["--hospitals", "5", "--teachers-per-hospital", "50"]


def capc(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.commands.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def _task(path: Path) -> TaskConfig:
    config = json.loads(path.read_text())
    return TaskConfig.parse(path.stem, config, config_hash(config))


def _fits_1000_queries(task: TaskConfig) -> None:
    ledger = accountants.make(accountants.DEFAULT_ACCOUNTANT)
    assert ledger.max_count(task.mechanism.per_query(), 10.0, 1e-5) >= 1000


def _fit(task: Path, data: Path, out: Path, *extra: str | Path) -> dict[str, object]:
    done = capc("teacher", "fit", "--task", task, "--data", data, "--out", out, "--json", *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, object] = json.loads(done.stdout)
    return report


def _image_task(tmp_path: Path, classes: list[str]) -> Path:
    # ``task init`` in this process, here and in every test: a process start (torch and
    # the services imported, about 4 s of CPU) costs more than the command; the fits,
    # what a hospital runs for minutes, stay separate processes.
    task = tmp_path / "task.json"
    init = ["task", "init", "--image", "1x28x28", "--classes", ",".join(classes)]
    assert cli.main([*init, *CONSORTIUM, "--out", str(task)]) == 0
    return task


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *named: str) -> str:
    """Run ``capc`` in this process; it must exit 2 with every ``named`` text in its error."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "error: " in err and "Traceback" not in err
    for text in named:
        assert text in err, err
    return err


@pytest.mark.slow
def test_png_folder_to_task_to_diet_teachers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x, y, test_x, test_y = animal_split(per_class=30)
    root = write_png_folder(tmp_path / "images", x, y, ANIMAL_CLASSES)
    task_path = tmp_path / "animals.json"
    init = ["task", "init", "--data", str(root), *CONSORTIUM]
    assert cli.main([*init, "--out", str(task_path)]) == 0
    printed = capsys.readouterr().out
    assert "sigma" in printed and "queries that fit" in printed
    task = _task(task_path)
    assert task.classes == tuple(ANIMAL_CLASSES) and task.input_shape == (1, 28, 28)
    _fits_1000_queries(task)

    out = tmp_path / "hospital.pt"
    report = _fit(task_path, root, out, "--teachers", "3")
    assert report["records"] == 300 and report["held_out"] == 60
    voters = Voters.load([out])
    assert len(voters) == 3
    votes = voters.predict(test_x)
    # Each teacher's vote on unseen images beats chance (10%) by far.
    assert all((votes[:, t] == test_y).mean() > 0.4 for t in range(3))
    card = voters.members[0].card
    assert card["records"] == 300 and "image folder" in card["data"]
    assert card["held_out"]["records"] == 60 and card["held_out"]["majority_vote"] > 0.4


@pytest.mark.slow
def test_csv_to_task_to_mlp_teachers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    frame = breast_cancer_frame()
    csv = tmp_path / "patients.csv"
    frame.to_csv(csv, index=False)
    task_path = tmp_path / "cancer.json"
    init = ["task", "init", "--data", str(csv), "--label", "diagnosis", "--drop", "patient_id"]
    assert cli.main([*init, *CONSORTIUM, "--out", str(task_path)]) == 0
    warned = capsys.readouterr().err
    assert "PUBLIC" in warned and "data dictionary" in warned
    task = _task(task_path)
    assert task.classes == ("benign", "malignant") and task.input_shape == (30,)
    _fits_1000_queries(task)

    out = tmp_path / "hospital.pt"
    # the label column comes from the task (records.label): no --label needed
    report = _fit(task_path, csv, out, "--teachers", "3", "--epochs", "20")
    assert report["records"] == 569
    voters = Voters.load([out])
    assert len(voters) == 3 and voters.architecture == "mlp"
    assert isinstance(task.records, TableSchema)
    x = task.records.encode(frame, "test")
    truth = np.array([task.class_names.index(v) for v in frame["diagnosis"]])
    votes = voters.predict(x)
    # chance (always the larger class) is 63%
    assert all((votes[:, t] == truth).mean() > 0.85 for t in range(3))
    assert voters.members[0].card["held_out"]["accuracy"] > 0.85


@pytest.mark.slow
def test_dicom_set_to_diet_teachers(tmp_path: Path) -> None:
    root, labels = write_dicom_set(tmp_path / "scans", 240)
    task = _image_task(tmp_path, DIGIT_CLASSES)
    out = tmp_path / "hospital.pt"
    report = _fit(task, root, out, "--labels", labels, "--teachers", "2")
    assert report["records"] == 240
    voters = Voters.load([out])
    x, y = digits(size=28)
    votes = voters.predict(np.clip(x[-300:], 0, 1))
    assert all((votes[:, t] == y[-300:]).mean() > 0.4 for t in range(2))


@pytest.mark.slow
def test_npz_to_diet_teachers(tmp_path: Path) -> None:
    npz = digits_npz(tmp_path / "digits.npz", 300)
    task = _image_task(tmp_path, DIGIT_CLASSES)
    out = tmp_path / "hospital.pt"
    report = _fit(task, npz, out, "--teachers", "2")
    teachers = report["teachers"]
    assert isinstance(teachers, list)
    accuracies = [t["accuracy"] for t in teachers]
    assert all(a > 0.4 for a in accuracies)
    assert len(Voters.load([out])) == 2


def test_corrupt_png_is_refused_by_name_with_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x, y, _, _ = animal_split(per_class=2, test=0)
    root = write_png_folder(tmp_path / "images", x, y, ANIMAL_CLASSES)
    (root / ANIMAL_CLASSES[5] / "scan-17.png").write_bytes(b"\x89PNG\r\n\x1a\ntruncated")
    task = _image_task(tmp_path, ANIMAL_CLASSES)
    capsys.readouterr()
    out = tmp_path / "hospital.pt"
    fit = ["teacher", "fit", "--task", str(task), "--data", str(root), "--out", str(out)]
    _refused(fit, capsys, "scan-17.png: not a readable image")
    assert list(tmp_path.glob("*.pt*")) == [] and list(tmp_path.glob(".hospital*")) == []


def test_bad_csv_records_are_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = breast_cancer_frame().head(80)
    csv = tmp_path / "patients.csv"
    frame.to_csv(csv, index=False)
    task = tmp_path / "t.json"
    init = ["task", "init", "--data", str(csv), "--label", "diagnosis", "--drop", "patient_id"]
    assert cli.main([*init, *CONSORTIUM, "--out", str(task)]) == 0
    capsys.readouterr()
    out = tmp_path / "hospital.pt"
    fit = ["teacher", "fit", "--task", str(task), "--data", str(csv), "--out", str(out)]

    broken = frame.copy()
    broken.loc[10, "worst area"] = np.nan
    broken.to_csv(csv, index=False)
    _refused(fit, capsys, "patients.csv", "row 12", "'worst area'")
    broken = frame.copy()
    broken.loc[3, "diagnosis"] = "benign?"
    broken.to_csv(csv, index=False)
    _refused(fit, capsys, "patients.csv", "row 5", "'benign?'")
    frame.drop(columns=["mean smoothness"]).to_csv(csv, index=False)
    _refused(fit, capsys, "patients.csv", "missing column 'mean smoothness'")
    assert not out.exists() and not list(tmp_path.glob(".hospital*"))


def test_dicom_missing_label_row_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, labels = write_dicom_set(tmp_path / "scans", 5)
    table = pd.read_csv(labels)
    missing = str(table.loc[4, "file"])
    table.drop(index=4).to_csv(labels, index=False)
    task = tmp_path / "t.json"
    init = ["task", "init", "--image", "1x28x28", "--classes", ",".join(DIGIT_CLASSES)]
    assert cli.main([*init, *CONSORTIUM, "--out", str(task)]) == 0
    out = tmp_path / "hospital.pt"
    fit = ["teacher", "fit", "--task", str(task), "--data", str(root), "--out", str(out)]
    _refused([*fit, "--labels", str(labels)], capsys, missing, "no row in", "labels.csv")
    assert not out.exists()


def test_npz_with_unknown_label_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    npz = tmp_path / "d.npz"
    np.savez(
        npz, x=np.zeros((4, 1, 28, 28), dtype=np.float32), y=np.array(["d1", "d2", "d7", "cat"])
    )
    task = tmp_path / "t.json"
    task.write_text(
        json.dumps(
            {
                "num_classes": 10,
                "input_shape": [1, 28, 28],
                "mechanism": {"name": "gnmax", "sigma": 23.0},
                "classes": DIGIT_CLASSES,
            }
        )
    )
    out = tmp_path / "hospital.pt"
    fit = ["teacher", "fit", "--task", str(task), "--data", str(npz), "--out", str(out)]
    _refused(fit, capsys, "d.npz", "row 3", "'cat'")
    assert not out.exists()


def test_body_of_another_shape_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    npz = tmp_path / "d.npz"
    np.savez(npz, x=np.zeros((40, 1, 16, 16), dtype=np.float32), y=np.arange(40) % 10)
    task = tmp_path / "t.json"
    config = {
        "num_classes": 10,
        "input_shape": [1, 16, 16],
        "mechanism": {"name": "gnmax", "sigma": 23.0},
    }
    task.write_text(json.dumps(config))
    fit = [
        "teacher",
        "fit",
        "--task",
        str(task),
        "--data",
        str(npz),
        "--out",
        str(tmp_path / "o.pt"),
    ]
    _refused(fit, capsys, "no shipped body takes 1x16x16", "--body")
    body = Path(cli.__file__).parents[1] / "assets" / "demo-body.pt"
    _refused([*fit, "--body", str(body)], capsys, "[1, 28, 28]", "[1, 16, 16]")


def test_task_init_refuses_a_hopeless_consortium(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.json"
    argv = ["task", "init", "--image", "1x28x28", "--classes", "a,b,c,d,e", "--hospitals", "3"]
    err = _refused(
        [*argv, "--teachers-per-hospital", "1", "--out", str(out)],
        capsys,
        "no useful sigma",
        "--teachers-per-hospital",
    )
    assert "mostly noise" in err and not out.exists()


def test_task_init_json_prints_only_the_task(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["task", "init", "--image", "3x32x32", "--classes", "no,yes", "--range=-1,1"]
    assert cli.main([*argv, *CONSORTIUM, "--quorum", "3", "--json"]) == 0
    config = json.loads(capsys.readouterr().out)
    task = TaskConfig.parse("t", config, config_hash(config))
    assert task.quorum == 3 and task.input_shape == (3, 32, 32) and task.classes == ("no", "yes")
    assert config["records"]["range"] == [-1.0, 1.0]
    assert from_config(config["mechanism"], 2).name == "gnmax"
