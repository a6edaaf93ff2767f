"""A round the hospitals cannot afford is refused with what it costs and what still fits."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from capc.privacy import events
from capc.privacy.accountants import GaussianDp
from capc.privacy.events import DpEvent, GaussianEvent
from capc.round.errors import QuorumError
from services.common.ledger import Ledger

DELTA = 1e-5


def gnmax(queries: int, sigma: float = 40.0) -> DpEvent:
    """GNMax's worst case for ``queries`` queries: one Gaussian of sensitivity sqrt(2) each."""
    return events.repeat(GaussianEvent(np.sqrt(2.0), sigma), queries)


def test_refusal_names_the_round_cost_the_queries_left_and_capcctl_budget(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "ledger.db"), delta=DELTA)
    ledger.create_task("images", {"mechanism": "gnmax"})
    for name in ("hospital-0", "hospital-1", "hospital-2"):
        ledger.register_party(name, 10.0)
    # 10 eps left each, but a round of 5000 queries at sigma 40 costs more than that alone.
    with pytest.raises(QuorumError) as err:
        ledger.reserve(
            "big",
            "images",
            "student",
            5000,
            {p: gnmax(5000) for p in ("hospital-0", "hospital-1", "hospital-2")},
            mechanism="gnmax",
            quorum=3,
        )
    message = str(err.value)
    gdp = GaussianDp()
    alone = gdp.spent(gdp.cost(gnmax(5000)), DELTA).epsilon
    fit = gdp.max_count(gnmax(1), 10.0, DELTA)
    assert "only 0 of 3 parties can afford this round" in message
    assert (
        f"hospital-0: 10 eps left, this round of 5000 queries costs it {alone:.4g} eps" in message
    )
    assert f"{fit} more queries fit" in message and 3000 < fit < 5000
    assert re.search(rf"at most {fit} more queries fit \(hospital-\d\): ask for", message)
    assert "`capcctl budget`" in message
    # What it says fits does fit: a round of exactly that many is reserved; then nothing.
    ledger.reserve(
        "fits",
        "images",
        "student",
        fit,
        {p: gnmax(fit) for p in ("hospital-0", "hospital-1", "hospital-2")},
        mechanism="gnmax",
        quorum=3,
    )
    with pytest.raises(QuorumError) as spent:
        ledger.reserve(
            "more",
            "images",
            "student",
            1,
            {p: gnmax(1) for p in ("hospital-0", "hospital-1", "hospital-2")},
            mechanism="gnmax",
            quorum=3,
        )
    assert "0 more queries fit" in str(spent.value)
    assert "No excluded party's cap covers another query" in str(spent.value)
