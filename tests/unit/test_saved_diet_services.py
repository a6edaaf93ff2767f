"""The saved networked experiment backs what the README and docs/results.md claim of it.

Every claim is recomputed from the per-row results: the summary from the rows, each
hospital's epsilon against its row's cap, the labels against what exact Gaussian DP
pays for at the mechanism's noise, and the README's table from the summary.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from capc.privacy import gaussian_dp
from experiments.diet_services import format_table, summarise
from services.commands.demo import DEMO_TASK, DEMO_VOTERS

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "experiments" / "results" / "diet-services.json"

pytestmark = pytest.mark.skipif(
    not RESULT.exists() and os.environ.get("CI") != "true",
    reason="the experiment has not been saved (python -m experiments.diet_services)",
)


def test_the_summary_is_the_one_its_rows_give() -> None:
    result = json.loads(RESULT.read_text())
    assert result["summary"] == summarise(result["rows"])
    assert sorted({r["epsilon"] for r in result["rows"]}) == [5.0, 8.0, 10.0]


def test_every_hospital_stayed_within_its_cap_and_the_labels_are_paid_for() -> None:
    result = json.loads(RESULT.read_text())
    for row in result["rows"]:
        assert row["delta"] == 1e-5 and row["hospitals"] >= 5 and row["teachers"] >= 250
        assert all(eps <= row["epsilon"] for eps in row["epsilon_spent"].values()), row
        sigma = DEMO_TASK["mechanism"]["sigma"] * row["teachers"] / DEMO_VOTERS
        room = gaussian_dp.max_queries_gdp(
            gaussian_dp.gnmax_mu(sigma), row["epsilon"], row["delta"]
        )
        assert row["answered"] <= room, row
        spent = gaussian_dp.epsilon_at(
            math.sqrt(row["answered"]) * gaussian_dp.gnmax_mu(sigma), row["delta"]
        )
        assert max(row["epsilon_spent"].values()) == pytest.approx(spent, rel=1e-6)


def test_the_readme_and_results_tables_are_the_saved_summary() -> None:
    table = format_table(json.loads(RESULT.read_text()))
    for doc in ("README.md", "docs/results.md"):
        assert table in (ROOT / doc).read_text(), doc
