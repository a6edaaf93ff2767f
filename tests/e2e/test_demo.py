"""``capc demo`` end to end, as ``make demo`` runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys


def test_demo_prints_every_hospitals_ledger() -> None:
    exe = shutil.which("capc")
    cmd = [exe, "demo"] if exe else [sys.executable, "-m", "services.cli", "demo"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for name in ("hospital-a", "hospital-b", "hospital-c"):
        assert f"{name}: epsilon =" in out.stdout
    assert "data-dependent accounting" in out.stdout
    assert "answered" in out.stdout
