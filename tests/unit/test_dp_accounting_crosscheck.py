"""Data-independent Gaussian compositions agree with Google's dp-accounting."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from capc.privacy import events, rdp
from capc.privacy.accountant import Accountant
from capc.privacy.conversion import DEFAULT_ORDERS, convert


@pytest.mark.parametrize(
    ("sensitivity", "sigma", "count", "delta"),
    [
        (np.sqrt(2), 40.0, 1000, 1e-5),
        (1.0, 150.0, 5000, 1e-6),
        (np.sqrt(8), 20.0, 300, 1e-5),
        (np.sqrt(2), 2.0, 7, 1e-3),
    ],
)
def test_gaussian_composition_matches(
    sensitivity: float, sigma: float, count: int, delta: float
) -> None:
    theirs = rdp_privacy_accountant.RdpAccountant(list(DEFAULT_ORDERS))
    theirs.compose(dp_accounting.GaussianDpEvent(sigma / sensitivity), count)
    their_eps = theirs.get_epsilon(delta)

    ours = count * rdp.gaussian_rdp(sensitivity, sigma, DEFAULT_ORDERS)
    # dp-accounting applies the total-variation shortcut; so do we when asked.
    mine = convert(ours, DEFAULT_ORDERS, delta, tv_shortcut=True).epsilon
    assert mine == pytest.approx(their_eps, rel=1e-9, abs=1e-12)


def test_mixed_mechanisms_match() -> None:
    acc = Accountant()
    acc.compose(events.GaussianEvent(1.0, 150.0), 1000)  # threshold tests
    acc.compose(events.GaussianEvent(np.sqrt(2), 40.0), 400)  # GNMax answers
    acc.compose(events.GaussianEvent(np.sqrt(6), 30.0), 50)  # Binary voting, 6 labels
    theirs = rdp_privacy_accountant.RdpAccountant(list(DEFAULT_ORDERS))
    theirs.compose(dp_accounting.GaussianDpEvent(150.0), 1000)
    theirs.compose(dp_accounting.GaussianDpEvent(40.0 / np.sqrt(2)), 400)
    theirs.compose(dp_accounting.GaussianDpEvent(30.0 / np.sqrt(6)), 50)
    assert acc.spent(1e-5).epsilon == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-9)
