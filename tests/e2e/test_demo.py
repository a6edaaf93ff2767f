"""``capc demo`` end to end, as ``make demo`` runs it (with a shorter pretraining)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from capc.data.offline import animal_mnist
from capc.models import load_teacher
from capc.models.heads import BatchStandardiser


@pytest.mark.slow
def test_demo_runs_a_consortium_and_reports(tmp_path: Path) -> None:
    exe = shutil.which("capc")
    cmd = [exe, "demo"] if exe else [sys.executable, "-m", "services.cli", "demo"]
    args = ["--dir", str(tmp_path), "--no-serve", "--pretrain-steps", "20", "--queries", "512"]
    out = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    for step in range(1, 7):
        assert f"[{step}/6]" in text
    answered = re.search(r"queries labelled:\s+(\d+) of 512 answered", text)
    assert answered and int(answered.group(1)) > 0
    label = re.search(r"label accuracy:\s+([0-9.]+)", text)
    assert label and 0.5 < float(label.group(1)) <= 1.0
    student = re.search(r"student test accuracy:\s+([0-9.]+) on 400 held-out", text)
    assert student and 0.0 <= float(student.group(1)) <= 1.0
    spent = re.findall(r"hospital-(\d): ([0-9.]+) of cap", text)
    assert sorted(i for i, _ in spent) == ["0", "1", "2"]
    assert all(float(eps) > 0 for _, eps in spent)
    assert re.search(r"dashboard:\s+https://127\.0\.0\.1:\d+/dashboard", text)
    if shutil.which("chromium"):
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    # The student downloaded through the gateway keeps the head that standardises each batch,
    # and reads real images with it as the service measured them.
    saved = load_teacher(tmp_path / "student.pt")
    assert isinstance(saved.model.head[0], BatchStandardiser)  # type: ignore[index]
    x, _ = animal_mnist()
    assert "standardises each batch" in saved.card["inference"]
    pred = saved.predict(x[:256], current_statistics=True)
    assert pred.shape == (256,) and set(np.unique(pred)) <= set(range(10))
    # A second run reuses the pretrained body, the keys and the teachers.
    assert (tmp_path / "body.pt").exists()
