"""The experiment scripts run on small settings and write the JSON they promise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(module: str, out: Path, *args: str) -> dict[str, object]:
    subprocess.run(
        [sys.executable, "-m", module, "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out.read_text())
    assert isinstance(result, dict)
    return result


def test_multilabel_voting_experiment(tmp_path: Path) -> None:
    result = run(
        "experiments.multilabel_voting",
        tmp_path / "ml.json",
        "--teachers",
        "6",
        "--epochs",
        "1",
        "--seeds",
        "1",
    )
    rows = result["results"]
    assert isinstance(rows, dict) and set(rows) == {"eps=2", "eps=5", "eps=10"}
    for row in rows.values():
        # Same epsilon, same planned queries: Powerset's smaller sensitivity needs less noise.
        assert row["powerset"]["sigma_for_queries"] < row["binary"]["sigma_for_queries"]
        assert row["powerset"]["labels_at_equal_sigma"] > row["binary"]["labels_at_equal_sigma"]
        assert 0 <= row["tau"]["quality"]["mAP"] <= 1


def test_personalized_budgets_experiment(tmp_path: Path) -> None:
    result = run(
        "experiments.personalized_budgets",
        tmp_path / "p.json",
        "--teachers",
        "6",
        "--epochs",
        "1",
        "--stream",
        "3000",
        "--sigma",
        "20",
    )
    rows = result["results"]
    assert isinstance(rows, dict)
    for row in rows.values():
        di = row["data_independent"]
        # Personalized runs never produce fewer labels than everyone at the smallest budget.
        assert di["weighting_over_baseline"] >= 1.0 and di["vanishing_over_baseline"] >= 1.0
