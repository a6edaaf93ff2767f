"""``capc teacher export --onnx``: every teacher of a capc checkpoint as an ONNX file that
loads without --trust-model-code and votes as the teacher does (stored statistics)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from capc.models import Teacher, build, save_teacher
from capc.models.ensemble import load_members, save_ensemble
from capc.models.foreign import ForeignTeacher
from services.commands.teacher_cli import export_teachers
from tests.e2e.own_models import export_torchscript, own_net
from tests.unit.test_ensembles import _data, _ensemble

ROOT = Path(__file__).resolve().parents[2]
CAPC = [sys.executable, "-m", "services.commands.cli"]


def test_every_teacher_of_an_ensemble_votes_as_it_did(tmp_path: Path) -> None:
    ens = _ensemble(3)
    save_ensemble(tmp_path / "e.pt", ens)
    paths = export_teachers(tmp_path / "e.pt", str(tmp_path / "teacher-{i}.onnx"))
    assert paths == [tmp_path / f"teacher-{i}.onnx" for i in (1, 2, 3)]
    x, _ = _data(24, 3)
    want = ens.predict(x, current_statistics=False)
    for i, path in enumerate(paths):
        onnx = load_members(path)  # no trust needed: ONNX is data
        assert isinstance(onnx, ForeignTeacher) and onnx.architecture == "onnx"
        np.testing.assert_array_equal(onnx.predict(x), want[:, i])
    # The teachers differ (their own statistics and heads reached their files).
    assert len({p.read_bytes() for p in paths}) == 3


def test_a_single_teacher_by_the_command_line(tmp_path: Path) -> None:
    teacher = Teacher("small-cnn", (1, 12, 12), 3, build("small-cnn", (1, 12, 12), 3, seed=1))
    save_teacher(tmp_path / "t.pt", teacher)
    out = tmp_path / "t.onnx"
    done = subprocess.run(
        [*CAPC, "teacher", "export", "--model", str(tmp_path / "t.pt"), "--onnx", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    x, _ = _data(16, 4)
    onnx = load_members(out)
    assert isinstance(onnx, ForeignTeacher)
    np.testing.assert_array_equal(onnx.predict(x), teacher.predict(x))


def test_several_teachers_need_a_numbered_name(tmp_path: Path) -> None:
    save_ensemble(tmp_path / "e.pt", _ensemble(2))
    with pytest.raises(ValueError, match=r"2 teachers.*put \{i\} in --onnx"):
        export_teachers(tmp_path / "e.pt", str(tmp_path / "all.onnx"))
    assert list(tmp_path.glob("*.onnx")) == []


def test_a_torchscript_file_is_not_converted(tmp_path: Path) -> None:
    """Converting traces the module: a received TorchScript file would run here."""
    ts = export_torchscript(own_net(), (4,), tmp_path / "m.ts")
    with pytest.raises(ValueError, match="not a capc checkpoint"):
        export_teachers(ts, str(tmp_path / "m.onnx"))
    assert not (tmp_path / "m.onnx").exists()
