"""``capc demo`` end to end, as ``make demo`` runs it, at a small scale.

The full-scale run (15 minutes of both cores) is measured by ``experiments/demo_run.py``
and its saved result checked by ``tests/unit/test_saved_demo.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from capc.data.offline import animal_mnist
from capc.models import load_teacher
from capc.models.heads import BatchStandardiser


def demo(tmp_path: Path, *args: str, timeout: float) -> tuple[str, dict[str, Any]]:
    exe = shutil.which("capc")
    cmd = [exe, "demo"] if exe else [sys.executable, "-m", "services.commands.cli", "demo"]
    out = subprocess.run(
        [*cmd, "--dir", str(tmp_path), "--no-serve", "--json", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    return out.stdout + out.stderr, json.loads(last)


@pytest.mark.slow
def test_a_small_demo_runs_a_consortium_and_reports(tmp_path: Path) -> None:
    text, result = demo(
        tmp_path,
        *("--pretrain-steps", "20", "--hospitals", "3", "--teachers", "4", "--queries", "512"),
        # Twelve teachers need little noise for useful labels, so a query costs much epsilon.
        *("--epsilon", "2000"),
        timeout=900,
    )
    for step in range(1, 7):
        assert f"[{step}/6]" in text
    assert set(result) == {
        "student_accuracy",
        "epsilon",
        "delta",
        "hospitals",
        "teachers",
        "queries",
        "answered",
    }
    assert result["hospitals"] == 3 and result["teachers"] == 12 and result["delta"] == 1e-5
    assert result["queries"] == result["answered"] == 512
    assert sorted(result["epsilon"]) == ["hospital-0", "hospital-1", "hospital-2"]
    assert all(0 < eps <= 2000 for eps in result["epsilon"].values())
    assert 0.0 <= result["student_accuracy"] <= 1.0
    label = re.search(r"label accuracy:\s+([0-9.]+)", text)
    assert label and 0.0 < float(label.group(1)) <= 1.0
    assert re.search(r"one record alone:\s+class \d", text)
    # Run without a terminal, the demo stops its consortium: no address is printed for it.
    assert re.search(r"dashboard:\s+stops with the demo", text)
    assert not re.search(r"dashboard:\s+https://", text)
    if shutil.which("chromium"):
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    # The student downloaded through the gateway stores its reference batch's statistics:
    # it reads one image as it reads it among many.
    saved = load_teacher(tmp_path / "student.pt")
    assert isinstance(saved.model.head[0], BatchStandardiser)  # type: ignore[index]
    assert "reference batch" in saved.card["inference"]
    x, _ = animal_mnist()
    many = saved.predict(x[:64])
    alone = np.concatenate([saved.predict(x[i : i + 1]) for i in range(64)])
    np.testing.assert_array_equal(many, alone)
    # A second run reuses the pretrained body, the keys and the teachers.
    assert (tmp_path / "body.pt").exists()
