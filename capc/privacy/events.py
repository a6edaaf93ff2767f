"""Privacy events: one mechanism application's RDP curve with what produced it.

An event's ``rdp`` is the RDP of ONE application at each order of ``orders``
(nats). Events are what accountants compose and what the ledger stores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.privacy import rdp
from capc.privacy import validation as check
from capc.privacy.conversion import DEFAULT_ORDERS

Param = float | int | str | bool
FloatArray = NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class PrivacyEvent:
    """The RDP of one mechanism application at each order, with its parameters."""

    mechanism: str
    rdp: FloatArray
    orders: FloatArray
    params: dict[str, Param] = field(default_factory=dict)
    data_dependent: bool = False

    def __post_init__(self) -> None:
        o = check.orders(self.orders)
        r = np.atleast_1d(np.asarray(self.rdp, dtype=np.float64))
        check.same_length(r, o, f"event {self.mechanism!r}: rdp and orders")
        if np.isnan(r).any() or (r < 0).any():
            raise ValueError(f"event {self.mechanism!r}: RDP must be non-negative and not NaN")
        object.__setattr__(self, "orders", o)
        object.__setattr__(self, "rdp", r)

    def same_as(self, other: PrivacyEvent) -> bool:
        """True when both events charge the same curve for the same mechanism."""
        return (
            self.mechanism == other.mechanism
            and self.params == other.params
            and self.data_dependent == other.data_dependent
            and np.array_equal(self.rdp, other.rdp)
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (the orders are stored once by the owner)."""
        return {
            "mechanism": self.mechanism,
            "rdp": self.rdp.tolist(),
            "params": dict(self.params),
            "data_dependent": self.data_dependent,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], orders: ArrayLike) -> PrivacyEvent:
        """Inverse of :meth:`to_dict` on the owner's order grid."""
        return cls(
            mechanism=str(data["mechanism"]),
            rdp=np.asarray(data["rdp"], dtype=np.float64),
            orders=np.asarray(orders, dtype=np.float64),
            params=dict(data.get("params", {})),
            data_dependent=bool(data.get("data_dependent", False)),
        )


def gnmax(
    sigma: float, orders: ArrayLike = DEFAULT_ORDERS, votes: ArrayLike | None = None
) -> PrivacyEvent:
    """One answered GNMax query; data-dependent when the histogram ``votes`` is given."""
    o = check.orders(orders)
    if votes is None:
        return PrivacyEvent(
            "gnmax", rdp.gnmax_data_independent(sigma, o), o, {"sigma": float(sigma)}
        )
    return PrivacyEvent(
        "gnmax", rdp.gnmax(votes, sigma, o), o, {"sigma": float(sigma)}, data_dependent=True
    )


def threshold_test(
    threshold: float,
    sigma1: float,
    orders: ArrayLike = DEFAULT_ORDERS,
    votes: ArrayLike | None = None,
) -> PrivacyEvent:
    """One Confident-GNMax threshold test; data-dependent when ``votes`` is given."""
    o = check.orders(orders)
    params: dict[str, Param] = {"threshold": float(threshold), "sigma1": float(sigma1)}
    if votes is None:
        return PrivacyEvent("threshold", rdp.threshold_data_independent(sigma1, o), o, params)
    return PrivacyEvent(
        "threshold", rdp.threshold(votes, threshold, sigma1, o), o, params, data_dependent=True
    )


def laplace_noisy_max(scale: float, orders: ArrayLike = DEFAULT_ORDERS) -> PrivacyEvent:
    """One Laplace noisy-max query with noise scale ``scale``."""
    o = check.orders(orders)
    return PrivacyEvent(
        "laplace-noisy-max", rdp.laplace_noisy_max(scale, o), o, {"scale": float(scale)}
    )


def multilabel_binary(
    num_labels: int, sigma: float, orders: ArrayLike = DEFAULT_ORDERS
) -> PrivacyEvent:
    """Binary voting decisions released on ``num_labels`` labels."""
    o = check.orders(orders)
    return PrivacyEvent(
        "binary-voting",
        rdp.multilabel_binary(num_labels, sigma, o),
        o,
        {"labels": int(num_labels), "sigma": float(sigma)},
    )


def multilabel_tau(
    num_labels: int, tau: float, sigma: float, orders: ArrayLike = DEFAULT_ORDERS
) -> PrivacyEvent:
    """tau-voting decisions released on ``num_labels`` labels."""
    o = check.orders(orders)
    return PrivacyEvent(
        "tau-voting",
        rdp.multilabel_tau(num_labels, tau, sigma, o),
        o,
        {"labels": int(num_labels), "tau": float(tau), "sigma": float(sigma)},
    )


def multilabel_powerset(sigma: float, orders: ArrayLike = DEFAULT_ORDERS) -> PrivacyEvent:
    """One Powerset-voting query."""
    o = check.orders(orders)
    return PrivacyEvent(
        "powerset-voting", rdp.multilabel_powerset(sigma, o), o, {"sigma": float(sigma)}
    )


def confident_gnmax_unit(ratio: float, orders: ArrayLike = DEFAULT_ORDERS) -> FloatArray:
    """Per-query RDP of an answered Confident-GNMax query at sigma2 = 1, sigma1 = ratio.

    Both parts scale as 1 / sigma2**2 when sigma1 / sigma2 is held fixed, which
    is what :func:`capc.privacy.planning.noise_scale_for` needs.
    """
    o = check.orders(orders)
    r = check.positive(ratio, "ratio")
    return rdp.threshold_data_independent(r, o) + rdp.gnmax_data_independent(1.0, o)
