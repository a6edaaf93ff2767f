"""DP-trained: the plain argmax of the votes of teachers trained with DP-SGD.

Every voter of such a round trained its teachers once with full-batch DP-SGD and
charged that training once in its own ledger and the guardian's
(:mod:`capc.privacy.dp_training`). A teacher's predictions are then
post-processing of its training, and so is the argmax of the vote histogram
over any set of such teachers: the round adds no noise and charges nothing per
query (its event is a no-op). A record sits in one hospital's training; a
deviating party's offset moves the histogram but cannot undo post-processing
of the honest parties' trainings, so the mechanism is offset-robust.

Votes, vote statements and proofs, and the circuit are GNMax's with zero noise:
the circuit adds an all-zero noise word, its histogram checks hold every count
to [0, W] exactly, and ties go to the lowest class, as :meth:`decide` (the
plaintext oracle) breaks them.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import Field

from capc.mechanisms.argmax import ArgmaxMechanism
from capc.mechanisms.base import MechanismError, Noise, NoisyParams
from capc.onehot import one_hot
from capc.privacy import events
from capc.privacy.randomness import SecureRandom


class DpTrainedParams(NoisyParams):
    sigma: float = Field(
        default=0.0,
        ge=0.0,
        le=0.0,
        description="no noise: every answer is post-processing of the teachers' DP-SGD",
    )


class DpTrained(ArgmaxMechanism):
    name = "dp-trained"
    params_model = DpTrainedParams
    trained_teachers_only: ClassVar[bool] = True

    def unit_votes(self, predictions: ArrayLike) -> NDArray[np.float64]:
        return one_hot(predictions, self.outputs, what="predictions", error=MechanismError)

    def draw_noise(self, batch: int, rng: SecureRandom) -> Noise:
        # No randomness is drawn: the guardian's noise input is the zero word.
        return {"eta2": np.zeros((batch, self.vote_width), dtype=np.float64)}

    def _event(self, answered: NDArray[np.bool_]) -> events.DpEvent:
        # Post-processing of the trainings, charged once each at registration.
        return events.NoOpEvent()
