"""``capc teacher fit --dp-epsilon``: DP-SGD teachers whose file carries their one charge,
loaded as an answering party loads them, reading nothing private outside DP-SGD."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from capc.data.readers import read_records
from capc.learning import dp_teacher, hospital
from capc.models.checkpoint import load_teacher, save_teacher
from capc.models.ensemble import TeacherEnsemble, Voters, load_members, statistics_of
from capc.privacy.dp_training import CARD_KEY, DpTraining
from services.commands import cli, teacher_cli
from tests.hospital_files import DIGIT_CLASSES, breast_cancer_frame, digits_npz

CONSORTIUM = ["--hospitals", "5", "--teachers-per-hospital", "50"]
#: Fewer steps than the default: the tests check the plumbing, not the accuracy.
FAST = ["--dp-steps", "40"]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An image task and 300 digit records (NPZ) for it."""
    root = tmp_path_factory.mktemp("dp-images")
    task = root / "task.json"
    init = ["task", "init", "--image", "1x28x28", "--classes", ",".join(DIGIT_CLASSES)]
    assert cli.main([*init, *CONSORTIUM, "--out", str(task)]) == 0
    return task, digits_npz(root / "digits.npz", 300)


def _fit(
    capsys: pytest.CaptureFixture[str], task: Path, data: Path, out: Path, *extra: str
) -> dict[str, Any]:
    capsys.readouterr()
    argv = ["teacher", "fit", "--task", str(task), "--data", str(data), "--out", str(out)]
    assert cli.main([*argv, "--json", *extra]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    # --json: only JSON on stdout, and no progress on stderr.
    assert captured.err == ""
    report: dict[str, Any] = json.loads(captured.out)
    return report


def test_image_teacher_carries_its_record_and_votes_as_measured(
    images: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task, data = images
    out = tmp_path / "dp.pt"
    # A large epsilon: little noise, so the accuracy check below cannot flake.
    report = _fit(capsys, task, data, out, "--dp-epsilon", "50", "--dp-delta", "1e-6", *FAST)
    assert report["kind"] == "DP-SGD linear heads" and len(report["teachers"]) == 1
    dp = report["dp_training"]
    assert dp["epsilon"] <= 50.0 and dp["epsilon"] == pytest.approx(50.0, abs=1e-9)
    assert dp["delta"] == 1e-6 and dp["steps"] == 40

    loaded = load_members(out)
    assert isinstance(loaded, TeacherEnsemble)
    record = DpTraining.from_dict(loaded.card[CARD_KEY])
    assert record.epsilon == 50.0 and record.delta == 1e-6 and record.steps == 40
    assert record.spent() == pytest.approx(dp["epsilon"]) and record.mu == pytest.approx(dp["mu"])
    assert record.clip == dp_teacher.CLIP and record.records == report["teachers"][0]["records"]

    # The answerer's loading votes on the held-out records exactly as the fit measured.
    records = read_records(data, None, (1, 28, 28), tuple(DIGIT_CLASSES))
    held = hospital.split(records.y, 1, 0.2, 0).held_out
    assert len(held) == report["held_out"]
    voters = Voters.load([out])
    votes = voters.predict(records.x[held])
    accuracy = float((votes[:, 0] == records.y[held]).mean())
    assert accuracy == report["teachers"][0]["accuracy"]
    assert accuracy > 0.4  # chance is 0.1


def test_the_noise_is_never_the_seed(
    images: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task, data = images
    heads = []
    for name in ("a.pt", "b.pt"):
        _fit(capsys, task, data, tmp_path / name, "--dp-epsilon", "2", "--seed", "5", *FAST)
        ensemble = load_members(tmp_path / name)
        assert isinstance(ensemble, TeacherEnsemble)
        heads.append(ensemble.weights)
    # Same split, same initial weights, same records: only the OS-keyed noise differs.
    assert not torch.equal(heads[0], heads[1])


def test_the_fit_reads_no_private_statistic(
    images: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The body's BatchNorm statistics and weights are the shipped body's whatever the
    records: here the digits and their negatives (a very different mean and spread)."""
    task, data = images
    with np.load(data) as stored:
        x, y = stored["x"], stored["y"]
    negative = tmp_path / "negative.npz"
    np.savez(negative, x=(1.0 - x).astype(np.float32), y=y)
    shipped = load_teacher(teacher_cli.SHIPPED_BODY).model
    want = {k: v for k, v in shipped.state_dict().items() if not k.startswith("head.")}
    for source in (data, negative):
        out = tmp_path / f"{source.stem}.pt"
        _fit(capsys, task, source, out, "--dp-epsilon", "5", "--teachers", "2", *FAST)
        ensemble = load_members(out)
        assert isinstance(ensemble, TeacherEnsemble) and len(ensemble) == 2
        body = ensemble.body.state_dict()
        for k, v in want.items():
            assert torch.equal(body[k].cpu(), v.cpu()), k
        for stats in ensemble.statistics:
            for k, v in stats.items():
                assert torch.equal(v.cpu(), statistics_of(shipped)[k].cpu()), k
        # One record, one part: every teacher carries the same record (one charge).
        assert DpTraining.from_dict(ensemble.card[CARD_KEY]).records == 120


def test_a_body_that_saw_real_records_is_refused(
    images: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task, data = images
    teacher = load_teacher(teacher_cli.SHIPPED_BODY)
    teacher.card = {"kind": "hospital teacher", "data": "a hospital's records"}
    body = tmp_path / "teacher-as-body.pt"
    save_teacher(body, teacher)
    out = tmp_path / "dp.pt"
    argv = ["teacher", "fit", "--task", str(task), "--data", str(data), "--out", str(out)]
    assert cli.main([*argv, "--body", str(body), "--dp-epsilon", "2", *FAST]) == 2
    err = capsys.readouterr().err
    assert "not a pretrained body" in err and "capc diet pretrain" in err
    assert not out.exists()


def test_table_teachers_each_carry_the_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = breast_cancer_frame()
    csv = tmp_path / "patients.csv"
    frame.to_csv(csv, index=False)
    task = tmp_path / "cancer.json"
    init = ["task", "init", "--data", str(csv), "--label", "diagnosis", "--drop", "patient_id"]
    assert cli.main([*init, *CONSORTIUM, "--out", str(task)]) == 0
    out = tmp_path / "dp.pt"
    report = _fit(capsys, task, csv, out, "--dp-epsilon", "4", "--teachers", "2")
    loaded = load_members(out)
    assert isinstance(loaded, list) and len(loaded) == 2
    records = {json.dumps(t.card[CARD_KEY], sort_keys=True) for t in loaded}
    assert len(records) == 1
    record = DpTraining.from_dict(loaded[0].card[CARD_KEY])
    assert record.epsilon == 4.0 and record.steps == dp_teacher.STEPS
    assert all(t.architecture == "linear" for t in loaded)
    # Chance (always the larger class) is 63% on this data.
    assert report["majority_vote_accuracy"] > 0.8


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--dp-epsilon", "0"], "--dp-epsilon must be a positive number"),
        (["--dp-epsilon", "-1"], "--dp-epsilon must be a positive number"),
        (["--dp-epsilon", "nan"], "--dp-epsilon must be a positive number"),
        (["--dp-epsilon", "2", "--dp-delta", "0"], "--dp-delta must lie strictly between"),
        (["--dp-epsilon", "2", "--dp-delta", "1"], "--dp-delta must lie strictly between"),
        (["--dp-epsilon", "2", "--dp-steps", "0"], "--dp-steps must be at least 1"),
        (["--dp-epsilon", "2", "--dp-clip", "0"], "--dp-clip must be a positive number"),
        (["--dp-epsilon", "2", "--dp-lr", "-0.5"], "--dp-lr must be a positive number"),
        (["--dp-delta", "1e-6"], "add --dp-epsilon"),
    ],
)
def test_bad_dp_options_are_refused_before_reading(
    options: list[str],
    named: str,
    images: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    task, _ = images
    out = tmp_path / "dp.pt"
    # No data at all: the options are refused before the records are read.
    argv = ["teacher", "fit", "--task", str(task), "--data", str(tmp_path / "none.npz")]
    assert cli.main([*argv, "--out", str(out), *options]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    assert not out.exists()


def test_the_cli_defaults_are_the_learning_defaults() -> None:
    assert teacher_cli.DP_DEFAULTS == {
        "delta": dp_teacher.DELTA,
        "steps": dp_teacher.STEPS,
        "clip": dp_teacher.CLIP,
        "lr": dp_teacher.LR,
    }
    parser = argparse.ArgumentParser()
    teacher_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["teacher", "fit", "--task", "t", "--data", "d", "--out", "o"])
    assert teacher_cli.dp_settings(args) is None
    args.dp_epsilon = 1.5
    settings = teacher_cli.dp_settings(args)
    assert settings == dp_teacher.DpSettings(1.5)
    assert math.isclose(settings.record(10).spent(), 1.5, abs_tol=1e-9)
