"""Privacy events: what a mechanism did, described by its parameters.

An event says *what ran* (a Gaussian mechanism of L2 sensitivity s with noise
sigma, a pure-DP mechanism, n copies of an event, several events in turn),
never what it costs: accountants (:mod:`capc.privacy.accountants`) interpret
events, and each one says which events it supports. The ledger stores events
as JSON (:meth:`to_dict` / :func:`from_dict`), so a charge can be re-read by
another accountant later.

Units: sensitivities and noise scales in the statistic's units (votes);
epsilon in nats; RDP curves per Renyi order, in nats.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.privacy import validation as check

FloatArray = NDArray[np.float64]


class EventError(ValueError):
    """An event's description is invalid."""


def _finite_non_negative(value: float, name: str) -> float:
    v = float(value)
    if not (math.isfinite(v) and v >= 0):
        raise EventError(f"{name} must be finite and >= 0, got {value!r}")
    return v


@dataclass(frozen=True)
class NoOpEvent:
    """Nothing that touches the data ran (e.g. a query a party sat out)."""

    kind = "noop"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True)
class GaussianEvent:
    """One Gaussian mechanism: a statistic of L2 ``sensitivity`` plus N(0, sigma**2) noise.

    Any post-processing of its output (an argmax, a threshold test) is covered.
    mu = sensitivity / sigma is its Gaussian-DP parameter (Dong, Roth and Su 2022).
    """

    sensitivity: float
    sigma: float
    kind = "gaussian"

    def __post_init__(self) -> None:
        _finite_non_negative(self.sensitivity, "sensitivity")
        s = float(self.sigma)
        if not (math.isfinite(s) and s > 0):
            raise EventError(f"sigma must be finite and > 0, got {self.sigma!r}")

    @property
    def mu(self) -> float:
        """Gaussian-DP mu: sensitivity over noise (dimensionless)."""
        return float(self.sensitivity) / float(self.sigma)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sensitivity": float(self.sensitivity),
            "sigma": float(self.sigma),
        }


@dataclass(frozen=True)
class PureDpEvent:
    """A mechanism that is ``epsilon``-DP with delta 0 (e.g. Laplace noisy max: eps = 2 / scale)."""

    epsilon: float
    kind = "pure"

    def __post_init__(self) -> None:
        _finite_non_negative(self.epsilon, "epsilon")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "epsilon": float(self.epsilon)}


@dataclass(frozen=True, eq=False)
class RdpCurveEvent:
    """A bound known only as an RDP curve (e.g. a data-dependent PATE bound, central mode).

    ``rdp[i]`` is the RDP (nats) at ``orders[i]``; ``label`` says what produced it.
    Only the Renyi-DP accountant on the same order grid can read it.
    """

    rdp: FloatArray
    orders: FloatArray
    label: str = "rdp-curve"
    data_dependent: bool = False
    kind = "rdp-curve"

    def __post_init__(self) -> None:
        o = check.orders(self.orders)
        r = np.atleast_1d(np.asarray(self.rdp, dtype=np.float64))
        check.same_length(r, o, f"{self.label}: rdp and orders")
        if np.isnan(r).any() or (r < 0).any():
            raise EventError(f"{self.label}: RDP must be non-negative and not NaN")
        object.__setattr__(self, "orders", o)
        object.__setattr__(self, "rdp", r)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RdpCurveEvent)
            and self.label == other.label
            and self.data_dependent == other.data_dependent
            and np.array_equal(self.rdp, other.rdp)
            and np.array_equal(self.orders, other.orders)
        )

    def __hash__(self) -> int:
        return hash((self.label, self.rdp.tobytes(), self.orders.tobytes()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "rdp": self.rdp.tolist(),
            "orders": self.orders.tolist(),
            "label": self.label,
            "data_dependent": self.data_dependent,
        }


@dataclass(frozen=True)
class SelfComposedEvent:
    """``count`` independent applications of ``event`` (count 0 is nothing)."""

    event: DpEvent
    count: int
    kind = "self-composed"

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or int(self.count) != self.count or self.count < 0:
            raise EventError(f"count must be a non-negative integer, got {self.count!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "event": self.event.to_dict(), "count": int(self.count)}


@dataclass(frozen=True)
class ComposedEvent:
    """The events in turn; each may be chosen adaptively from earlier outputs."""

    events: tuple[DpEvent, ...]
    kind = "composed"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "events": [e.to_dict() for e in self.events]}


DpEvent = (
    NoOpEvent | GaussianEvent | PureDpEvent | RdpCurveEvent | SelfComposedEvent | ComposedEvent
)


def compose(*events: DpEvent) -> DpEvent:
    """The composition of ``events``, flattened, without no-ops and empty repetitions."""
    parts = [e for e in _flatten(events) if not is_noop(e)]
    if not parts:
        return NoOpEvent()
    if len(parts) == 1:
        return parts[0]
    return ComposedEvent(tuple(parts))


def repeat(event: DpEvent, count: int) -> DpEvent:
    """``count`` applications of ``event``; a no-op when count is 0."""
    if count == 0 or is_noop(event):
        return NoOpEvent()
    if count == 1:
        return event
    return SelfComposedEvent(event, int(count))


def is_noop(event: DpEvent) -> bool:
    """True when ``event`` releases nothing about the data."""
    if isinstance(event, NoOpEvent):
        return True
    if isinstance(event, SelfComposedEvent):
        return event.count == 0 or is_noop(event.event)
    if isinstance(event, ComposedEvent):
        return all(is_noop(e) for e in event.events)
    if isinstance(event, GaussianEvent):
        return event.sensitivity == 0
    if isinstance(event, PureDpEvent):
        return event.epsilon == 0
    return False


def _flatten(events: Sequence[DpEvent]) -> Iterator[DpEvent]:
    for e in events:
        if isinstance(e, ComposedEvent):
            yield from _flatten(e.events)
        else:
            yield e


def leaves(event: DpEvent) -> Iterator[tuple[DpEvent, int]]:
    """Every primitive event with how many times it runs (composites unrolled)."""
    if isinstance(event, SelfComposedEvent):
        for leaf, n in leaves(event.event):
            yield leaf, n * event.count
    elif isinstance(event, ComposedEvent):
        for e in event.events:
            yield from leaves(e)
    else:
        yield event, 1


def _number(data: Mapping[str, Any], key: str) -> float:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventError(f"{key} must be a number, got {value!r}")
    return float(value)


def _count(data: Mapping[str, Any]) -> int:
    value = data["count"]
    if isinstance(value, bool) or not isinstance(value, int):
        raise EventError(f"count must be an integer, got {value!r}")
    return value


def _flag(data: Mapping[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise EventError(f"{key} must be true or false, got {value!r}")
    return value


def from_dict(data: Mapping[str, Any]) -> DpEvent:
    """Inverse of ``event.to_dict()``; raises EventError on anything it does not know,
    and coerces nothing (a count is an integer, a flag a boolean, a parameter a number)."""
    if not isinstance(data, Mapping):
        raise EventError(f"an event is a JSON object, got {type(data).__name__}")
    kind = data.get("kind")
    try:
        if kind == NoOpEvent.kind:
            return NoOpEvent()
        if kind == GaussianEvent.kind:
            return GaussianEvent(_number(data, "sensitivity"), _number(data, "sigma"))
        if kind == PureDpEvent.kind:
            return PureDpEvent(_number(data, "epsilon"))
        if kind == RdpCurveEvent.kind:
            label = data.get("label", "rdp-curve")
            if not isinstance(label, str):
                raise EventError(f"label must be a string, got {label!r}")
            return RdpCurveEvent(
                np.asarray(data["rdp"], dtype=np.float64),
                np.asarray(data["orders"], dtype=np.float64),
                label,
                _flag(data, "data_dependent"),
            )
        if kind == SelfComposedEvent.kind:
            return SelfComposedEvent(from_dict(data["event"]), _count(data))
        if kind == ComposedEvent.kind:
            parts = data["events"]
            if not isinstance(parts, list):
                raise EventError("events must be a list")
            return ComposedEvent(tuple(from_dict(e) for e in parts))
    except EventError:
        raise
    except (KeyError, TypeError, ValueError, OverflowError) as err:
        raise EventError(f"event {kind!r} is missing or has a malformed field: {err}") from err
    raise EventError(f"unknown event kind {kind!r}")


def scaled(event: DpEvent, weight: float) -> DpEvent:
    """``event`` for a data owner whose contribution is scaled by ``weight``.

    A vote of weight w moves the noised statistic w times as far, so every
    Gaussian sensitivity scales by w. Pure-DP and curve events have no
    sensitivity to scale: they are refused unless w is 1 (or 0: nothing ran).
    """
    w = _finite_non_negative(weight, "weight")
    if w == 1.0:
        return event
    if w == 0.0:
        return NoOpEvent()
    if isinstance(event, GaussianEvent):
        return GaussianEvent(event.sensitivity * w, event.sigma)
    if isinstance(event, NoOpEvent):
        return event
    if isinstance(event, SelfComposedEvent):
        return SelfComposedEvent(scaled(event.event, w), event.count)
    if isinstance(event, ComposedEvent):
        return ComposedEvent(tuple(scaled(e, w) for e in event.events))
    raise EventError(f"a {event.kind} event cannot be scaled by a vote weight")


def rdp_curve(event: DpEvent, orders: ArrayLike) -> FloatArray:
    """RDP (nats) of ``event`` at each order, for the events that have a closed form."""
    o = check.orders(orders)
    total = np.zeros_like(o)
    for leaf, n in leaves(event):
        if isinstance(leaf, NoOpEvent):
            continue
        if isinstance(leaf, GaussianEvent):
            total = total + n * o * (leaf.mu * leaf.mu) / 2.0
        elif isinstance(leaf, PureDpEvent):
            # Pure eps-DP is (order, min(eps, order eps^2 / 2))-RDP (Bun and Steinke 2016, Prop. 1.4).
            e = leaf.epsilon
            total = total + n * np.minimum(e, o * e * e / 2.0)
        elif isinstance(leaf, RdpCurveEvent):
            if not np.array_equal(leaf.orders, o):
                raise EventError(
                    f"{leaf.label}: this curve was computed on another order grid "
                    f"({leaf.orders.size} orders, not {o.size})"
                )
            total = total + n * leaf.rdp
        else:  # pragma: no cover - leaves() yields primitives only
            raise EventError(f"no RDP curve for a {leaf.kind} event")
    return np.asarray(total, dtype=np.float64)
