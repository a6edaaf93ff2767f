"""``capc demo`` run twice, and ``capc demo --json``: stdout is only the JSON object."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from services.commands import demo
from services.commands.cli import build_parser


def _args(directory: Path, *extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["demo", "--dir", str(directory), "--no-serve", *extra])


def _fake_demo(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """What the real demo does to stdout: progress lines, and processes it starts."""
    print("  0s  [1/6] progress line", flush=True)
    subprocess.run([sys.executable, "-c", "print('a child process says hello')"], check=True)
    return {"student_accuracy": 0.9, "epsilon": {"hospital-0": 9.9}}


@pytest.mark.parametrize("as_json", [False, True])
def test_second_run_says_it_already_ran(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    as_json: bool,
) -> None:
    monkeypatch.setattr(demo, "_demo", _fake_demo)
    extra = ["--json"] if as_json else []
    assert demo.run(_args(tmp_path, *extra)) == 0
    capfd.readouterr()

    def unreachable(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
        raise AssertionError("the demo ran twice in one directory")

    monkeypatch.setattr(demo, "_demo", unreachable)
    assert demo.run(_args(tmp_path, *extra)) == 0
    out, err = capfd.readouterr()
    line = err if as_json else out
    assert len(line.strip().splitlines()) == 1
    assert "already ran" in line and str(tmp_path / demo.RESULT) in line
    assert "make demo DIR=" in line and f"remove {tmp_path}" in line
    if as_json:
        assert json.loads(out)["student_accuracy"] == 0.9


def test_json_stdout_is_only_the_json_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "_demo", _fake_demo)
    assert demo.run(_args(tmp_path, "--json")) == 0
    out, err = capfd.readouterr()
    assert json.loads(out) == {"student_accuracy": 0.9, "epsilon": {"hospital-0": 9.9}}
    assert "progress line" in err and "a child process says hello" in err
    print("stdout is back")
    assert capfd.readouterr().out == "stdout is back\n"


def test_makefile_demo_takes_dir() -> None:
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert "capc demo --dir $(DIR)" in makefile and "DIR ?=" in makefile
