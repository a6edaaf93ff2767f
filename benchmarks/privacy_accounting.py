"""Throughput of the privacy core: data-dependent RDP, composition, conversion, noise.

Prints one JSON object per result, with ratios beside absolute times.
"""

from __future__ import annotations

import json

import numpy as np
from timing import best_time

from capc.mechanisms.gnmax import GNMax
from capc.privacy import discrete_gaussian, rdp
from capc.privacy.accountant import Accountant
from capc.privacy.conversion import DEFAULT_ORDERS, convert
from capc.privacy.randomness import SecureRandom


def main() -> None:
    """Run every benchmark and print its JSON line."""
    rng = SecureRandom()
    hists = np.zeros((1000, 10))
    hists[:, 0] = 200
    hists[:, 1] = np.arange(1000) % 150
    dd = best_time(lambda: [rdp.gnmax_data_dependent(h, 40.0, DEFAULT_ORDERS) for h in hists])
    di = best_time(lambda: [rdp.gnmax_data_independent(40.0, DEFAULT_ORDERS) for _ in range(1000)])
    print(
        json.dumps(
            {
                "bench": "gnmax_rdp",
                "queries": 1000,
                "orders": int(DEFAULT_ORDERS.size),
                "data_dependent_s": dd,
                "data_independent_s": di,
                "data_dependent_over_independent": dd / di,
            }
        )
    )

    def compose() -> None:
        acc = Accountant()
        mech = GNMax.from_params(hists.shape[1], {"sigma": 40.0})
        for h in hists:
            acc.compose(mech.data_dependent_event(h, True, DEFAULT_ORDERS))
        acc.spent(1e-5)

    comp = best_time(compose)
    conv = best_time(lambda: convert(np.ones_like(DEFAULT_ORDERS), DEFAULT_ORDERS, 1e-5), repeat=20)
    print(
        json.dumps(
            {
                "bench": "accountant",
                "events": 1000,
                "compose_and_convert_s": comp,
                "per_event_us": comp / 1000 * 1e6,
                "single_conversion_us": conv * 1e6,
            }
        )
    )

    cont = best_time(lambda: rng.normal((1024, 10), 40.0))
    disc = best_time(
        lambda: discrete_gaussian.discrete_gaussian_noise((1024, 10), 40.0, rng), repeat=1
    )
    print(
        json.dumps(
            {
                "bench": "noise",
                "samples": 10240,
                "gaussian_s": cont,
                "discrete_gaussian_s": disc,
                "discrete_over_continuous": disc / cont,
            }
        )
    )


if __name__ == "__main__":
    main()
