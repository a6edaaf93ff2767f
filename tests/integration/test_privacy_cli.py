"""``capc privacy`` as a user runs it: a separate process, text and JSON output, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

CONFIDENT = [
    "--mechanism",
    "confident-gnmax",
    "--teachers",
    "250",
    "--threshold",
    "200",
    "--sigma1",
    "150",
    "--sigma",
    "40",
    "--delta",
    "1e-5",
]


def capc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.commands.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_plan_is_data_independent_and_says_what_the_ledger_admits(tmp_path: Path) -> None:
    out = capc("privacy", "plan", *CONFIDENT, "--epsilon", "6", "--queries", "1000", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["data_independent"]["queries_fit"] == 1164
    ledger = result["ledger"]
    assert ledger["accountant"] == "gdp" and ledger["queries_fit"] > 1164
    assert result["noise_for_queries"]["sigma"] < 40
    # Sizing a run from private votes would let them decide how much is released.
    votes = tmp_path / "votes.npy"
    np.save(votes, np.array([[200, 30, 20, 0, 0, 0, 0, 0, 0, 0]] * 20, dtype=float))
    refused = capc("privacy", "plan", *CONFIDENT, "--epsilon", "6", "--votes", str(votes))
    assert refused.returncode != 0 and "--votes" in refused.stderr


def test_plan_text_output() -> None:
    out = capc("privacy", "plan", "--mechanism", "gnmax", "--sigma", "40", "--epsilon", "2")
    assert out.returncode == 0, out.stderr
    assert "queries fit:" in out.stdout


def test_plain_gnmax_is_also_planned_and_costed_exactly(tmp_path: Path) -> None:
    # 250 teachers, sigma 40 votes, eps 10: 2849 queries by RDP, 3201 by exact Gaussian DP.
    plain = ["--mechanism", "gnmax", "--sigma", "40", "--json"]
    out = capc("privacy", "plan", *plain, "--epsilon", "10")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["data_independent"]["queries_fit"] == 2849
    assert result["gaussian_dp"]["queries_fit"] == 3201
    assert result["ledger"] == {"accountant": "gdp", "queries_fit": 3201}
    votes = tmp_path / "votes.npy"
    np.save(votes, np.array([[30, 25, 20, 175, 0, 0, 0, 0, 0, 0]] * 3201, dtype=float))
    out = capc("privacy", "cost", *plain, "--votes", str(votes))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert 9.99 < result["gaussian_dp"]["epsilon"] <= 10.0 < result["data_independent"]["epsilon"]


def test_cost_with_sanitised_release(tmp_path: Path) -> None:
    votes = tmp_path / "votes.npy"
    answered = tmp_path / "answered.npy"
    np.save(votes, np.array([[200, 30, 20, 0, 0, 0, 0, 0, 0, 0]] * 30, dtype=float))
    np.save(answered, np.arange(30) % 2 == 0)
    out = capc(
        "privacy",
        "cost",
        *CONFIDENT,
        "--votes",
        str(votes),
        "--answered",
        str(answered),
        "--sanitise",
        "--seed",
        "1",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["answered"] == 15 and result["answered_source"] == "file"
    assert result["data_dependent"]["epsilon"] < result["data_independent"]["epsilon"]
    assert result["sanitised"]["sigma_ss"] == 10.0


def test_errors_say_what_to_fix(tmp_path: Path) -> None:
    out = capc("privacy", "plan", "--mechanism", "gnmax", "--epsilon", "2")
    assert out.returncode != 0 and "needs --sigma" in out.stderr
    bad = tmp_path / "bad.npy"
    np.save(bad, np.array([[1.0, np.nan]]))
    out = capc("privacy", "cost", "--mechanism", "gnmax", "--sigma", "4", "--votes", str(bad))
    assert out.returncode != 0 and "finite" in out.stderr
    out = capc(
        "privacy", "plan", "--mechanism", "gnmax", "--sigma", "4", "--epsilon", "2", "--delta", "3"
    )
    assert out.returncode != 0 and "delta" in out.stderr
    missing = capc(
        "privacy",
        "cost",
        "--mechanism",
        "gnmax",
        "--sigma",
        "4",
        "--votes",
        str(tmp_path / "nope.npy"),
    )
    assert missing.returncode != 0 and "cannot read" in missing.stderr
