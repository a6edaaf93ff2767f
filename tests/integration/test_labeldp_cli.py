"""``capc labeldp alibi|rr|pate-fm --json`` as separate processes: each row is complete, the
provable epsilon is what the method's accountant says, and the audit never refutes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from capc.privacy import gaussian_dp
from services.commands import cli

QUICK = ["--dataset", "digits", "--canaries", "20", "--body-steps", "20", "--noise-seed", "t"]


def labeldp(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "services.commands.cli",
        "labeldp",
        *args,
        "--cache",
        str(tmp_path),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def row(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out: dict[str, Any] = json.loads(done.stdout)
    audit = out["audit"]
    assert out["canaries"] == audit["canaries"] == 20
    assert 0 <= audit["correct"] <= audit["guesses"] <= 20
    assert audit["lower"] <= out["epsilon"] and out["flagged"] is False
    assert 0.0 <= out["accuracy"] <= 1.0
    return out


@pytest.mark.slow
def test_alibi_and_rr_rows(tmp_path: Path) -> None:
    a = row(labeldp(tmp_path, "alibi", "--epsilon", "2", "--epochs", "2", "--json", *QUICK))
    assert a["method"] == "alibi" and a["epsilon"] == 2.0 and a["delta"] == 0.0
    assert a["laplace_scale"] == 1.0
    r = row(labeldp(tmp_path, "rr", "--epsilon", "2", "--epochs", "2", "--json", *QUICK))
    assert r["method"] == "rr" and r["keep_probability"] > 0.4


@pytest.mark.slow
def test_pate_fm_row_is_within_its_budget(tmp_path: Path) -> None:
    out = tmp_path / "row.json"
    done = labeldp(
        tmp_path,
        "pate-fm",
        "--epsilon",
        "3",
        "--teachers",
        "20",
        "--teacher-steps",
        "20",
        "--student-steps",
        "20",
        "--out",
        str(out),
        "--json",
        *QUICK,
    )
    r = row(done)
    assert json.loads(out.read_text()) == r
    m = r["mechanism"]
    assert m["sigma"] == pytest.approx(0.4 * 20) and m["threshold"] == pytest.approx(0.5 * 20)
    mu = (r["queries"] / m["sigma1"] ** 2 + 2 * r["answered"] / m["sigma"] ** 2) ** 0.5
    assert r["epsilon"] == pytest.approx(gaussian_dp.epsilon_at(mu, 1e-5)) and r["epsilon"] <= 3
    per_query = (1 / m["sigma1"] ** 2 + 2 / m["sigma"] ** 2) ** 0.5
    assert r["queries"] == r["budget_queries"] == gaussian_dp.max_queries_gdp(per_query, 3.0, 1e-5)


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``capc labeldp ARGS`` in this process (the parser is all it reaches): exit status 2,
    and its standard error."""
    with pytest.raises(SystemExit) as stopped:
        cli.main(["labeldp", *args])
    assert stopped.value.code == 2
    return capsys.readouterr().err


def test_bad_arguments_are_refused_with_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "positive" in refused(capsys, "alibi", "--epsilon", "-1", "--cache", str(tmp_path))
    err = refused(capsys, "pate-fm", "--epsilon", "1", "--dataset", "cifar")
    assert "invalid choice" in err
