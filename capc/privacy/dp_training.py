"""A teacher trained once with DP-SGD: its accounting record and its one privacy charge.

capc trains DP teachers by full-batch DP-SGD: every step uses every record of
the teacher's part (Poisson sampling at rate 1), clips each record's gradient
to L2 norm ``clip`` and adds N(0, (noise_multiplier * clip)**2) to the sum.
Under the ledger's replace-one neighbouring relation one record moves that
sum by at most ``2 * clip``, so each step is a Gaussian mechanism of L2
sensitivity 2 (in units of ``clip``) and noise ``noise_multiplier``; the
training is ``steps`` of them composed adaptively, mu-GDP with
mu = 2 sqrt(steps) / noise_multiplier. That is a Gaussian composition, so both
ledger accountants charge it exactly and under their proven budget filters
(:mod:`capc.privacy.accountants`); a sampling rate below 1 would make each
step a subsampled Gaussian, whose curve no capc filter is proven for, so it is
refused here rather than charged approximately.

Every answer of the trained model is post-processing of the training: the
ledger charges :meth:`DpTraining.event` once, when the teacher is registered,
and nothing per query. A hospital whose records are split among several DP
teachers (disjoint parts) pays one training: a record sits in one part.

Units: epsilon in nats; delta a probability; ``clip`` in the gradient's units;
``noise_multiplier`` is the noise's standard deviation over ``clip``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from capc.privacy import gaussian_dp
from capc.privacy import validation as check
from capc.privacy.events import DpEvent, GaussianEvent, SelfComposedEvent

#: One record's L2 effect on a step's clipped gradient sum, in units of ``clip``
#: (replace-one: the record's clipped gradient out, another's in).
STEP_SENSITIVITY = 2.0
#: The neighbouring relation the record is stated under (the ledger's).
NEIGHBOURING = "replace-one"
#: The only sampling rate capc trains and charges (full batch); see the module docstring.
FULL_BATCH = 1.0
#: The key of a teacher file's card that holds the record.
CARD_KEY = "dp_training"


class DpTrainingError(ValueError):
    """A DP-training record is malformed or claims what capc cannot charge exactly."""


def noise_multiplier(epsilon: float, delta: float, steps: int) -> float:
    """The smallest noise multiplier for which ``steps`` full-batch steps are
    (``epsilon``, ``delta``)-DP under replace-one neighbours (rounded up, so the
    record's :meth:`DpTraining.spent` never exceeds ``epsilon``)."""
    eps = check.positive(epsilon, "epsilon")
    d = check.delta(delta)
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise DpTrainingError(f"steps must be a positive integer, got {steps!r}")
    mu = gaussian_dp.max_mu(eps, d)
    sigma = STEP_SENSITIVITY * math.sqrt(int(steps)) / mu

    def kept(s: float) -> bool:
        # Both ways the ledger may compute mu (the closed form, and the gdp accountant's
        # sqrt of steps x mu_step**2), and the epsilon it reports (rounded up), stay within
        # the target; the last ulps of rounding must not overspend.
        closed = STEP_SENSITIVITY * math.sqrt(int(steps)) / s
        summed = math.sqrt(int(steps) * (STEP_SENSITIVITY / s) ** 2)
        return all(
            gaussian_dp.within(m, eps, d) and gaussian_dp.epsilon_at(m, d) <= eps
            for m in (closed, summed)
        )

    # max_mu rounds mu down, but the conversions round too: step sigma up until it fits
    # (relative steps of 1e-13, so the noise is within 1e-9 of the smallest that fits).
    while not kept(sigma):
        sigma *= 1.0 + 1e-13
    return sigma


@dataclass(frozen=True)
class DpTraining:
    """What a DP-trained teacher file attests about its training.

    ``epsilon``/``delta``: the target the training was planned for (the charge is
    :meth:`event`, whatever these say); ``records``: the records of the largest
    teacher part (informative only).
    """

    noise_multiplier: float
    steps: int
    clip: float
    epsilon: float
    delta: float
    sampling_rate: float = FULL_BATCH
    neighbouring: str = NEIGHBOURING
    records: int = 0

    def __post_init__(self) -> None:
        # Every message names the field, so a bad file says what to fix.
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise DpTrainingError(
                f"noise_multiplier must be finite and > 0, got {self.noise_multiplier!r}"
            )
        if isinstance(self.steps, bool) or int(self.steps) != self.steps or self.steps < 1:
            raise DpTrainingError(f"steps must be a positive integer, got {self.steps!r}")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise DpTrainingError(
                f"clip (the clipping norm) must be finite and > 0, got {self.clip!r}"
            )
        check.positive(self.epsilon, "epsilon")
        check.delta(self.delta)
        if self.sampling_rate != FULL_BATCH:
            raise DpTrainingError(
                f"sampling_rate {self.sampling_rate}: capc charges full-batch DP-SGD "
                "(rate 1) exactly; a subsampled step is not a Gaussian mechanism its "
                "ledgers' budget filters are proven for (docs/privacy.md)"
            )
        if self.neighbouring != NEIGHBOURING:
            raise DpTrainingError(
                f"neighbouring relation {self.neighbouring!r}: the ledger counts "
                f"{NEIGHBOURING} neighbours"
            )
        if isinstance(self.records, bool) or int(self.records) != self.records or self.records < 0:
            raise DpTrainingError(f"records must be a non-negative integer, got {self.records!r}")

    def event(self) -> DpEvent:
        """The training as the ledger charges it: ``steps`` Gaussian steps composed."""
        return SelfComposedEvent(
            GaussianEvent(STEP_SENSITIVITY, float(self.noise_multiplier)), int(self.steps)
        )

    @property
    def mu(self) -> float:
        """The training's Gaussian-DP mu (dimensionless)."""
        return STEP_SENSITIVITY * math.sqrt(int(self.steps)) / float(self.noise_multiplier)

    def spent(self, delta: float | None = None) -> float:
        """Epsilon (nats) of the training alone at ``delta`` (default: its own)."""
        return gaussian_dp.epsilon_at(self.mu, self.delta if delta is None else delta)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> DpTraining:
        """A record read from a file or a message; DpTrainingError names what is wrong.

        Strict: numbers must be JSON numbers (not strings, not booleans), integers
        integral, every field known; a record that would charge less than it claims
        is never read leniently."""
        if not isinstance(data, dict):
            raise DpTrainingError(f"a DP-training record is a JSON object, got {type(data)}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise DpTrainingError(f"a DP-training record has unknown fields {unknown}")
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise DpTrainingError(f"a DP-training record lacks {missing[0]!r}")
        neighbouring = data.get("neighbouring", NEIGHBOURING)
        if not isinstance(neighbouring, str):
            raise DpTrainingError(f"neighbouring must be a string, got {neighbouring!r}")
        try:
            return cls(
                noise_multiplier=_number(data, "noise_multiplier"),
                steps=_integer(data, "steps"),
                clip=_number(data, "clip"),
                epsilon=_number(data, "epsilon"),
                delta=_number(data, "delta"),
                sampling_rate=_number(data, "sampling_rate", FULL_BATCH),
                neighbouring=neighbouring,
                records=_integer(data, "records", 0),
            )
        except DpTrainingError:
            raise
        except (TypeError, ValueError) as err:
            raise DpTrainingError(f"a DP-training record is malformed: {err}") from err


#: The fields a record must carry (the rest have defaults).
_REQUIRED = ("noise_multiplier", "steps", "clip", "epsilon", "delta")


def _number(data: dict[str, Any], name: str, default: float | None = None) -> float:
    """``data[name]`` as a finite float; a string or a boolean is refused, naming ``name``."""
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DpTrainingError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise DpTrainingError(f"{name} must be finite, got {value!r}")
    return float(value)


def _integer(data: dict[str, Any], name: str, default: int | None = None) -> int:
    """``data[name]`` as an int (an integral float is accepted), naming ``name`` otherwise."""
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise DpTrainingError(f"{name} must be an integer, got {value!r}")
    return int(value)


def plan_training(
    epsilon: float, delta: float, steps: int, clip: float, records: int = 0
) -> DpTraining:
    """The record of a full-batch training of ``steps`` steps at (``epsilon``, ``delta``)."""
    return DpTraining(
        noise_multiplier=noise_multiplier(epsilon, delta, steps),
        steps=int(steps),
        clip=float(clip),
        epsilon=float(epsilon),
        delta=float(delta),
        records=int(records),
    )
