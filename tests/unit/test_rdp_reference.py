"""capc.privacy.rdp against the published scalable-PATE analysis (relative error <= 1e-9)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from capc.privacy import rdp

HERE = Path(__file__).resolve().parent
SOURCES = [HERE.parent / "data" / "pate_rdp_reference.csv"]
SHARED = HERE.parents[2] / "shared" / "reference" / "pate_rdp_reference.csv"
if SHARED.exists():
    SOURCES.append(SHARED)
ORDERS = np.arange(2, 101, dtype=np.float64)


def _rows() -> list[dict[str, str]]:
    seen: dict[tuple[str, ...], dict[str, str]] = {}
    for path in SOURCES:
        with path.open() as fh:
            for row in csv.DictReader(fh):
                seen[(row["kind"], row["votes"], row["sigma"], row["threshold"])] = row
    return list(seen.values())


ROWS = _rows()


def test_reference_has_rows() -> None:
    assert len(ROWS) >= 12


@pytest.mark.parametrize(
    "row", ROWS, ids=lambda r: f"{r['kind']}-{r['votes'][:9]}-{r['sigma']}-{r['threshold']}"
)
def test_matches_reference(row: dict[str, str]) -> None:
    votes = np.array([float(x) for x in row["votes"].split()])
    sigma = float(row["sigma"])
    expected = np.array([float(row[f"rdp@{n}"]) for n in range(2, 101)])
    if row["kind"] == "gnmax":
        log_value = rdp.log_q_gnmax(votes, sigma)
        got = rdp.gnmax_data_dependent(votes, sigma, ORDERS)
        assert np.all(got <= rdp.gnmax_data_independent(sigma, ORDERS))
    else:
        t = float(row["threshold"])
        log_value = rdp.log_pr_answered(votes, t, sigma)
        got = rdp.threshold_data_dependent(votes, t, sigma, ORDERS)
        assert np.all(got <= rdp.threshold_data_independent(sigma, ORDERS))
    assert log_value == pytest.approx(float(row["log_q_or_log_pr_answered"]), rel=1e-9)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=0)
