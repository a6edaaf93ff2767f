"""DP-trained teachers (``capc teacher fit --dp-epsilon``): one full-batch DP-SGD training
per disjoint part, charged once (:mod:`capc.privacy.dp_training`).

Everything a teacher takes from the hospital's records goes through DP-SGD
(:mod:`capc.learning.dp_sgd`); the rest is public (design.md §3):

- Images: the shared pretrained body with its *stored* BatchNorm statistics,
  which pretraining fitted on synthetic images (no real data), and a linear
  head trained by DP-SGD on the body's raw 256-d features. Nothing is
  recomputed on the records: not the statistics (a DIET teacher's own
  statistics are a non-private average of its records), not a feature
  standardisation, no early stopping, no selection. The head reads the same
  features in the answerer's real path (stored statistics), so what was
  measured on held-out records is what the teacher does there; on synthetic
  queries the answerer reads capc's bodies with the batch's own statistics,
  which changes the features (docs/hospital.md states what that costs).
- Tables: a ``linear`` model on the task-encoded rows, whose scaling comes
  from the schema's public ranges.

A record sits in one part, so k teachers on k disjoint parts cost one
training (parallel composition); every part is trained with the same record.

The defaults (:data:`STEPS`, :data:`LR`, :data:`CLIP`) were chosen on the
side-by-side split's ``tuning`` records of animal-mnist
(experiments/side_by_side/data.py, :mod:`experiments.dp_teacher`), which no
hospital share holds; nothing is tuned on a hospital's records.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.data.readers import Records
from capc.learning import dp_sgd
from capc.learning.hospital import Fitted, Split, scores
from capc.models.checkpoint import Teacher
from capc.models.ensemble import TeacherEnsemble, Voters, statistics_of
from capc.models.inference import features
from capc.models.registry import Classifier, build
from capc.privacy import dp_training
from capc.privacy.dp_training import CARD_KEY, DpTraining
from capc.privacy.randomness import SecureRandom

#: Defaults, measured on animal-mnist's side-by-side tuning records (700 trained, 300
#: scored; a linear head on the shipped body's raw features; ``python -m
#: experiments.dp_teacher tune``, experiments/results/dp-teacher-tuning.json): 300 steps
#: at lr 0.5 and clip 1 scored 0.69 at epsilon 10 and 0.50 at epsilon 2 (mean of two
#: noise draws); the best of 9 (clip, steps, lr) points scored 0.72 and 0.55, within two
#: standard errors of 300 scored records, and no point was best at both epsilons.
STEPS = 300
LR = 0.5
CLIP = 1.0
DELTA = 1e-5
#: The card kind of a body pretrained without real records (capc diet pretrain, the
#: shipped body): the only bodies a DP teacher may use.
PUBLIC_BODY = "pretrained body"
#: The architecture of a DP table teacher (no BatchNorm: DP-SGD refuses it).
TABLE_ARCHITECTURE = "linear"

Log = Callable[[str], None]
M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class DpSettings:
    """A DP training's target and hyperparameters; :meth:`check` says what is wrong."""

    epsilon: float
    delta: float = DELTA
    steps: int = STEPS
    clip: float = CLIP
    lr: float = LR

    def check(self) -> None:
        """ValueError naming the option and what to do."""
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(
                f"--dp-epsilon must be a positive number (the training's whole privacy cost, "
                f"in nats), got {self.epsilon}: pass e.g. --dp-epsilon 2"
            )
        if not 0.0 < self.delta < 1.0:
            raise ValueError(
                f"--dp-delta must lie strictly between 0 and 1, got {self.delta}: pass e.g. "
                "1e-5, well below 1 / (number of records)"
            )
        if self.steps < 1:
            raise ValueError(
                f"--dp-steps must be at least 1, got {self.steps}: leave it out for the "
                f"default {STEPS}"
            )
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(
                f"--dp-clip must be a positive number, got {self.clip}: leave it out for "
                f"the default {CLIP:g}"
            )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(
                f"--dp-lr must be a positive number, got {self.lr}: leave it out for the "
                f"default {LR:g}"
            )

    def record(self, records: int) -> DpTraining:
        """The accounting record of a training on parts of at most ``records`` records."""
        self.check()
        return dp_training.plan_training(self.epsilon, self.delta, self.steps, self.clip, records)


def _train_parts(
    inputs: NDArray[np.float32],
    y: NDArray[np.int64],
    plan: Split,
    make: Callable[[int], M],
    record: DpTraining,
    settings: DpSettings,
    rng: SecureRandom,
    seed: int,
    log: Log,
) -> list[M]:
    """One model per part, each ``record.steps`` DP-SGD steps on its records; progress on
    ``log`` (per teacher: records, steps per second, time left)."""
    models: list[M] = []
    count = len(plan.parts)
    started = time.monotonic()
    for t, part in enumerate(plan.parts):
        if len(part) < 1:
            raise ValueError(f"teacher {t + 1}'s part has no records: use fewer --teachers")
        t0 = time.monotonic()
        model = dp_sgd.train(
            make(seed * 1000 + t),
            inputs[part],
            y[part],
            record,
            lr=settings.lr,
            rng=rng,
            seed=seed * 1000 + t,
        )
        models.append(model)
        took = time.monotonic() - t0
        left = (time.monotonic() - started) / (t + 1) * (count - t - 1)
        log(
            f"DP teacher {t + 1}/{count}: {len(part)} records, {record.steps} steps, "
            f"{record.steps / max(took, 1e-9):.0f} steps/s, about {left:.0f} s left"
        )
    return models


def summary(record: DpTraining) -> dict[str, Any]:
    """What the report says of the training (epsilon spent at its delta, delta, mu)."""
    return {
        "epsilon": record.spent(),
        "delta": record.delta,
        "mu": record.mu,
        "noise_multiplier": record.noise_multiplier,
        "steps": record.steps,
        "clip": record.clip,
    }


def fit_dp_diet(
    records: Records,
    plan: Split,
    body: tuple[Teacher, Classifier],
    name: str,
    card: dict[str, Any],
    log: Log,
    settings: DpSettings,
    *,
    rng: SecureRandom,
    seed: int = 0,
) -> tuple[Fitted, DpTraining]:
    """One linear head per part on the shared ``body`` (:func:`capc.learning.hospital.body_for`)
    with the body's stored (public) statistics, trained by DP-SGD; one ensemble.

    ``rng``: the noise source (``SecureRandom()`` for a hospital's records); ``seed`` fixes
    the heads' initial weights only."""
    base, model = body
    if base.card.get("kind") != PUBLIC_BODY:
        # A teacher's checkpoint as --body would bring its records' statistics (and maybe
        # weights) in, outside the accounting: only a body trained without them may serve.
        raise ValueError(
            f"the body {name} is not a pretrained body (its card's kind is "
            f"{base.card.get('kind')!r}, not {PUBLIC_BODY!r}): a DP teacher takes nothing "
            "from real records but what DP-SGD trains, so pass a body from capc diet "
            "pretrain (synthetic images) or the shipped one"
        )
    classes = model.head.out_features
    model.to("cpu").eval()
    record = settings.record(max(len(p) for p in plan.parts))
    # The body's own statistics, from its synthetic pretraining: public, never recomputed.
    stats = statistics_of(model)
    log(
        f"DP-training {len(plan.parts)} linear head(s) on the shared body {name} "
        f"(epsilon {settings.epsilon:g}, delta {settings.delta:g}, noise multiplier "
        f"{record.noise_multiplier:.3g})"
    )
    feats = features(model, records.x).numpy().astype(np.float32)
    heads = _train_parts(
        feats,
        records.y,
        plan,
        lambda s: _linear(feats.shape[1], classes, s),
        record,
        settings,
        rng,
        seed,
        log,
    )
    weights = torch.stack([h.weight.detach().clone() for h in heads])
    biases = torch.stack([h.bias.detach().clone() for h in heads])
    ensemble = TeacherEnsemble(
        base.architecture,
        tuple(records.x.shape[1:]),
        classes,
        model,
        [dict(stats) for _ in heads],
        weights,
        biases,
        width=base.width,
        device="cpu",
    )
    held = plan.held_out
    each, vote, current = None, None, None
    if len(held):
        # The answerer's real path: stored statistics, what the heads were trained on.
        each, vote = scores(
            ensemble.predict(records.x[held], current_statistics=False), records.y[held], classes
        )
        # Its synthetic path reads capc's bodies with each batch's own statistics: measured
        # here on the held-out records, to say what that does to these heads.
        current, _ = scores(
            ensemble.predict(records.x[held], current_statistics=True), records.y[held], classes
        )
    ensemble.card = {
        **card,
        "method": (
            f"pretrained body {name} with its stored (synthetic-pretraining) BatchNorm "
            f"statistics; {len(plan.parts)} linear head(s) trained by full-batch DP-SGD, "
            "each on its own disjoint part of the data"
        ),
        "teachers": len(plan.parts),
        "held_out": {
            "records": len(held),
            "accuracy": each,
            "majority_vote": vote,
            "accuracy_current_statistics": current,
        },
        CARD_KEY: record.to_dict(),
    }
    return Fitted(ensemble, [len(p) for p in plan.parts], len(held), each, vote), record


def fit_dp_table(
    records: Records,
    plan: Split,
    classes: int,
    card: dict[str, Any],
    log: Log,
    settings: DpSettings,
    *,
    rng: SecureRandom,
    seed: int = 0,
) -> tuple[Fitted, DpTraining]:
    """One :data:`TABLE_ARCHITECTURE` model per part on the task-encoded rows, trained by
    DP-SGD; one :class:`Teacher` each, every card carrying the record."""
    shape = tuple(records.x.shape[1:])
    record = settings.record(max(len(p) for p in plan.parts))
    log(
        f"DP-training {len(plan.parts)} {TABLE_ARCHITECTURE} teacher(s) (epsilon "
        f"{settings.epsilon:g}, delta {settings.delta:g}, noise multiplier "
        f"{record.noise_multiplier:.3g})"
    )
    models = _train_parts(
        records.x,
        records.y,
        plan,
        lambda s: build(TABLE_ARCHITECTURE, shape, classes, seed=s),
        record,
        settings,
        rng,
        seed,
        log,
    )
    teachers = [
        Teacher(TABLE_ARCHITECTURE, shape, classes, m, {**card}, device="cpu") for m in models
    ]
    held = plan.held_out
    predictions = (
        Voters(teachers).predict(records.x[held])
        if len(held)
        else np.zeros((0, len(teachers)), dtype=np.int64)
    )
    each, vote = scores(predictions, records.y[held], classes)
    for t, teacher in enumerate(teachers):
        teacher.card.update(
            {
                "method": (
                    f"{TABLE_ARCHITECTURE} model trained by full-batch DP-SGD on its own "
                    "disjoint part of the data"
                ),
                "teacher": t,
                "teachers": len(teachers),
                "examples": len(plan.parts[t]),
                "held_out": {
                    "records": len(held),
                    "accuracy": None if each is None else each[t],
                    "majority_vote": vote,
                },
                CARD_KEY: record.to_dict(),
            }
        )
    return Fitted(teachers, [len(p) for p in plan.parts], len(held), each, vote), record


def _linear(dim: int, classes: int, seed: int) -> nn.Linear:
    """A fresh (dim -> classes) layer whose initial weights come from ``seed`` alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Linear(dim, classes)
