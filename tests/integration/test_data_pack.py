"""``capc data pack`` as a hospital runs it: a PNG folder (class subfolders, and flat with
--unlabelled) and a CSV table packed into NPZ files that read back as the task's records;
a bad record refused by name with no output left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from capc.data.readers import read_records
from capc.task_config import TaskConfig, config_hash
from services.commands import cli
from tests.hospital_files import ANIMAL_CLASSES, animal_split, breast_cancer_frame, write_png_folder


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


@pytest.fixture
def images(tmp_path: Path) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    """A PNG folder of class subfolders, its task, and the images and labels written."""
    x, y, _, _ = animal_split(per_class=3)
    root = write_png_folder(tmp_path / "images", x, y, ANIMAL_CLASSES)
    task = tmp_path / "animals.json"
    done = capc(
        "task",
        "init",
        "--data",
        root,
        "--hospitals",
        "3",
        "--teachers-per-hospital",
        "50",
        "--out",
        task,
    )
    assert done.returncode == 0, done.stderr
    return root, task, x, y


def test_png_class_folders_pack_to_x_and_y(
    images: tuple[Path, Path, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    root, task, x, _ = images
    out = tmp_path / "own.npz"
    done = capc("data", "pack", "--task", task, "--data", root, "--out", out)
    assert done.returncode == 0, done.stderr
    assert f"{len(x)} records of 1x28x28 written to {out}" in done.stdout
    assert "animal0 3" in done.stdout
    config = _task(task)
    expected = read_records(root, config.records, config.input_shape, config.class_names)
    with np.load(out) as f:
        assert sorted(f.files) == ["x", "y"]
        assert f["x"].dtype == np.float32 and f["y"].dtype == np.int64
        np.testing.assert_array_equal(f["x"], expected.x)
        np.testing.assert_array_equal(f["y"], expected.y)


def test_a_flat_folder_packs_unlabelled(
    images: tuple[Path, Path, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    _, task, x, _ = images
    flat = tmp_path / "flat"
    flat.mkdir()
    for i, img in enumerate(x[:7]):
        Image.fromarray((img[0] * 255).round().astype(np.uint8), "L").save(flat / f"{i:02d}.png")
    out = tmp_path / "records.npz"
    done = capc("data", "pack", "--task", task, "--data", flat, "--unlabelled", "--out", out)
    assert done.returncode == 0, done.stderr
    with np.load(out) as f:
        assert f.files == ["x"] and f["x"].shape == (7, 1, 28, 28)
    # labelled, a flat folder has no classes: refused, nothing written
    assert (
        capc(
            "data", "pack", "--task", task, "--data", flat, "--out", tmp_path / "no.npz"
        ).returncode
        == 2
    )
    assert not (tmp_path / "no.npz").exists()


def test_a_csv_packs_with_and_without_its_label(tmp_path: Path) -> None:
    frame = breast_cancer_frame()
    csv = tmp_path / "patients.csv"
    frame.to_csv(csv, index=False)
    task = tmp_path / "cancer.json"
    done = capc(
        "task", "init", "--data", csv, "--label", "diagnosis", "--drop", "patient_id",
        "--hospitals", "3", "--teachers-per-hospital", "50", "--out", task,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = tmp_path / "rows.npz"
    done = capc("data", "pack", "--task", task, "--data", csv, "--out", out, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["records"] == 569 and report["shape"] == [569, 30]
    assert sum(report["classes"].values()) == 569
    unlabelled = tmp_path / "unlabelled.csv"
    frame.drop(columns=["diagnosis"]).to_csv(unlabelled, index=False)
    bare = tmp_path / "bare.npz"
    done = capc("data", "pack", "--task", task, "--data", unlabelled, "--unlabelled", "--out", bare)
    assert done.returncode == 0, done.stderr
    with np.load(out) as a, np.load(bare) as b:
        np.testing.assert_array_equal(a["x"], b["x"])


def test_a_bad_record_is_refused_by_name_and_nothing_is_written(
    images: tuple[Path, Path, np.ndarray, np.ndarray],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, task, _, _ = images
    bad = root / "animal3" / "broken.png"
    bad.write_bytes(b"not a png")
    out = tmp_path / "own.npz"
    argv = ["data", "pack", "--task", str(task), "--data", str(root), "--out", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "error: " in err and str(bad) in err and "Traceback" not in err
    assert not out.exists() and list(tmp_path.glob(".own.npz.*")) == []


def test_json_prints_only_the_report(
    images: tuple[Path, Path, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    root, task, x, _ = images
    out = tmp_path / "own.npz"
    done = capc("data", "pack", "--task", task, "--data", root, "--out", out, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["records"] == len(x) and report["labelled"] is True
