"""``capc answerer --task FILE`` refuses a hospital's own model that does not fit the task
before it dials: exit 2, one line naming the file and both shapes, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.e2e.own_models import export_onnx, export_thief, export_torchscript, own_net

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "services" / "tasks" / "images.json"
LIGHT = ROOT / "services" / "tasks" / "light.json"


def answerer(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``capc answerer`` as the hospital runs it; the guardian address is never dialled."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "services.commands.cli",
            "answerer",
            *args,
            "--guardian",
            "127.0.0.1:9",
            "--name",
            "hospital-a",
            "--epsilon-cap",
            "1",
            "--ledger",
            str(tmp_path / "ledger.db"),
            "--insecure-dev",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def refused(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "dialling" not in result.stdout
    return result.stderr


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return own_net().eval()


def test_wrong_input_shape_is_refused_at_start(model: torch.nn.Module, tmp_path: Path) -> None:
    onnx = export_onnx(model, (4,), tmp_path / "model.onnx")
    err = refused(answerer(tmp_path, "--model", str(onnx), "--task", str(IMAGES)))
    assert "hospital-a's model" in err and "model.onnx" in err
    assert "takes inputs (4,) but task images has (1, 28, 28)" in err
    assert not (tmp_path / "ledger.db").exists()  # refused before anything else


def test_wrong_number_of_classes_is_refused_at_start(
    model: torch.nn.Module, tmp_path: Path
) -> None:
    ts = export_torchscript(model, (4,), tmp_path / "model.ts")
    task = tmp_path / "five.json"
    task.write_text(
        json.dumps(
            {"num_classes": 5, "input_shape": [4], "mechanism": {"name": "gnmax", "sigma": 4.0}}
        )
    )
    err = refused(answerer(tmp_path, "--model", str(ts), "--task", str(task), "--trust-model-code"))
    assert "model.ts gives 3 classes but task five has 5" in err


def test_torch_model_on_the_wrong_inputs_is_refused_naming_both(
    model: torch.nn.Module, tmp_path: Path
) -> None:
    w = tmp_path / "w.pt"
    torch.save(model.state_dict(), w)
    spec = f"tests.e2e.own_models:own_net@{w}"
    err = refused(answerer(tmp_path, "--model", spec, "--task", str(IMAGES), "--trust-model-code"))
    assert spec in err and "task images's inputs (1, 28, 28)" in err


def test_unimportable_factory_exits_2_without_traceback(tmp_path: Path) -> None:
    err = refused(
        answerer(
            tmp_path,
            "--model",
            "no_such_hospital_pkg:net@w.pt",
            "--task",
            str(LIGHT),
            "--trust-model-code",
        )
    )
    assert "cannot import module 'no_such_hospital_pkg'" in err


def test_a_bad_task_file_exits_2(model: torch.nn.Module, tmp_path: Path) -> None:
    ts = export_torchscript(model, (4,), tmp_path / "model.ts")
    task = tmp_path / "broken.json"
    task.write_text("{not json")
    err = refused(answerer(tmp_path, "--model", str(ts), "--task", str(task), "--trust-model-code"))
    assert "broken.json" in err


def test_a_malicious_torchscript_file_is_refused_without_trust(tmp_path: Path) -> None:
    """capc answerer without --trust-model-code: the file's forward (copy a secret over
    another file) never runs, the party exits 2 saying what to do, and opens no ledger."""
    secret, target = tmp_path / "hospital-a.key", tmp_path / "planted.py"
    secret.write_bytes(b"PRIVATE KEY")
    target.write_bytes(b"# untouched")
    evil = export_thief(secret, target, tmp_path / "teacher.ts")
    err = refused(answerer(tmp_path, "--model", str(evil), "--task", str(LIGHT)))
    assert "teacher.ts is a TorchScript file" in err and "--trust-model-code" in err
    assert target.read_bytes() == b"# untouched"
    assert not (tmp_path / "ledger.db").exists()
