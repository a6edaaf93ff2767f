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
    # max_mu rounds mu down; one ulp up on sigma keeps the product on the safe side.
    while not gaussian_dp.within(STEP_SENSITIVITY * math.sqrt(int(steps)) / sigma, eps, d):
        sigma = math.nextafter(sigma, math.inf)
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
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise DpTrainingError(
                f"the noise multiplier must be finite and > 0, got {self.noise_multiplier!r}"
            )
        if isinstance(self.steps, bool) or int(self.steps) != self.steps or self.steps < 1:
            raise DpTrainingError(f"steps must be a positive integer, got {self.steps!r}")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise DpTrainingError(f"the clipping norm must be finite and > 0, got {self.clip!r}")
        check.positive(self.epsilon, "epsilon")
        check.delta(self.delta)
        if self.sampling_rate != FULL_BATCH:
            raise DpTrainingError(
                f"sampling rate {self.sampling_rate}: capc charges full-batch DP-SGD "
                "(rate 1) exactly; a subsampled step is not a Gaussian mechanism its "
                "ledgers' budget filters are proven for (docs/privacy.md)"
            )
        if self.neighbouring != NEIGHBOURING:
            raise DpTrainingError(
                f"neighbouring relation {self.neighbouring!r}: the ledger counts "
                f"{NEIGHBOURING} neighbours"
            )

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
        """A record read from a file or a message; DpTrainingError names what is wrong."""
        if not isinstance(data, dict):
            raise DpTrainingError(f"a DP-training record is a JSON object, got {type(data)}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise DpTrainingError(f"a DP-training record has unknown fields {unknown}")
        try:
            return cls(
                noise_multiplier=float(data["noise_multiplier"]),
                steps=data["steps"],
                clip=float(data["clip"]),
                epsilon=float(data["epsilon"]),
                delta=float(data["delta"]),
                sampling_rate=float(data.get("sampling_rate", FULL_BATCH)),
                neighbouring=str(data.get("neighbouring", NEIGHBOURING)),
                records=int(data.get("records", 0)),
            )
        except KeyError as err:
            raise DpTrainingError(f"a DP-training record lacks {err.args[0]!r}") from err
        except (TypeError, ValueError) as err:
            if isinstance(err, DpTrainingError):
                raise
            raise DpTrainingError(f"a DP-training record is malformed: {err}") from err


def plan(epsilon: float, delta: float, steps: int, clip: float, records: int = 0) -> DpTraining:
    """The record of a full-batch training of ``steps`` steps at (``epsilon``, ``delta``)."""
    return DpTraining(
        noise_multiplier=noise_multiplier(epsilon, delta, steps),
        steps=int(steps),
        clip=float(clip),
        epsilon=float(epsilon),
        delta=float(delta),
        records=int(records),
    )
