"""PATE-FM: PATE whose teachers and student learn by FixMatch (Malek et al. 2021, Alg. 1-2).

Under label-DP the features are public, so the unlabelled pool is the
training set itself without its labels. Teachers are trained on disjoint
partitions of the labelled records, each with the whole pool unlabelled;
the student sends a number of pool images, fixed in advance, to the
ensemble; a mechanism from :mod:`capc.mechanisms` (Confident-GNMax by
default) aggregates the votes, in one central round
(:func:`capc.round.central.label_histograms`, oracle mode: what the circuit
releases); the student learns from the answered queries and the pool, again
by FixMatch.

Privacy. One record's label taints one teacher, so each query is the
mechanism's event for one teacher (its threshold test and, where
answered, its noisy argmax): Gaussian mechanisms, which the ledger's
accountant composes (``gdp``, exact Gaussian DP, by default). How many
queries run is fixed before any vote is cast: as many as the budget
admits if every query were answered (:meth:`Mechanism.worst_case`), so no
data-dependent quantity decides how much is released; the charge reported
is that of what actually happened (the tests, and the answers that were
released), never above the budget. The queries are chosen from the public
features alone (random pool images, or k-means prototypes of the pool).

Compute. The teachers and the student are linear heads over a body trained
self-supervised on the pool (free under label-DP), fitted by FixMatch on
features of augmented views computed once (:func:`capc.learning.fixmatch.fit_heads`):
hundreds of teachers then fit in CPU minutes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from capc.learning.fixmatch import FixMatchConfig, ViewBank, fit_heads
from capc.mechanisms import Mechanism, from_config
from capc.models.ensemble import head_predictions
from capc.privacy import accountants
from capc.privacy.accountants import Accounting
from capc.privacy.events import DpEvent
from capc.privacy.randomness import SecureRandom
from capc.round.central import label_histograms

#: How queries are picked from the pool (public features only).
SELECTIONS = ("prototypes", "random")


@dataclass(frozen=True)
class PateFmConfig:
    """``epsilon`` (nats) at ``delta`` per record, by ``accountant``; ``teachers`` disjoint
    partitions; ``mechanism`` a task-style mechanism object in votes ({"name": ...,
    parameters}); at most ``queries`` queries (None: as many as the budget admits),
    chosen by ``selection``."""

    epsilon: float
    mechanism: Mapping[str, Any]
    teachers: int = 100
    delta: float = 1e-5
    queries: int | None = None
    selection: str = "prototypes"
    accountant: str = accountants.DEFAULT_ACCOUNTANT
    teacher: FixMatchConfig = field(default_factory=FixMatchConfig)
    student: FixMatchConfig = field(default_factory=FixMatchConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.epsilon > 0 or not 0 < self.delta < 1:
            raise ValueError(
                f"need epsilon > 0 and delta in (0, 1), got {self.epsilon}, {self.delta}"
            )
        if self.teachers < 1:
            raise ValueError(f"PATE-FM needs at least one teacher, got {self.teachers}")
        if self.queries is not None and self.queries < 1:
            raise ValueError(f"queries must be positive or None, got {self.queries}")
        if self.selection not in SELECTIONS:
            raise ValueError(
                f"selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}"
            )


@dataclass(frozen=True)
class PateFmResult:
    """``queries`` (K,) pool indices sent; ``labels`` (K,) the released label or -1;
    ``answered`` (K,); ``event`` what was charged per record; ``epsilon`` (nats, at
    ``delta``) its cost by the accountant; ``budget_queries`` how many queries the budget
    admitted in the worst case; ``student`` (weights (1, C, D), biases (1, C)) the student's
    head; ``teacher_votes`` (K, T) every teacher's class per query (for diagnostics)."""

    queries: NDArray[np.int64]
    labels: NDArray[np.int64]
    answered: NDArray[np.bool_]
    event: DpEvent
    epsilon: float
    delta: float
    accountant: str
    budget_queries: int
    student: tuple[torch.Tensor, torch.Tensor]
    teacher_votes: NDArray[np.int64]


def mechanism(config: PateFmConfig, classes: int) -> Mechanism:
    """The aggregation mechanism the configuration names. ValueError for one that adds no
    noise because its teachers were trained with DP-SGD: these teachers are FixMatch heads
    fitted on the records without it, so its labels would be released unnoised and
    charged nothing."""
    mech = from_config(config.mechanism, classes)
    if mech.trained_teachers_only:
        raise ValueError(
            f"{mech.name} charges nothing per answer and is only for teachers trained with "
            "DP-SGD; PATE-FM's teachers are not: use gnmax or confident-gnmax"
        )
    return mech


def budget_queries(mech: Mechanism, acct: Accounting, epsilon: float, delta: float) -> int:
    """Queries the budget admits if every one were answered: fixed before any vote."""
    return acct.max_count(mech.per_query(), epsilon, delta)


def select_queries(bank: ViewBank, count: int, selection: str, seed: int) -> NDArray[np.int64]:
    """``count`` distinct pool indices chosen from the features alone: uniformly at random,
    or the pool image nearest each centre of a k-means clustering of the pool."""
    n = len(bank)
    count = min(count, n)
    rng = np.random.default_rng(seed)
    if selection == "random" or count >= n:
        return np.sort(rng.permutation(n)[:count]).astype(np.int64)
    from sklearn.cluster import KMeans

    feats = bank.clean.numpy().astype(np.float64)
    km = KMeans(n_clusters=count, n_init=1, random_state=seed).fit(feats)
    dist = (
        ((feats[:, None, :] - km.cluster_centers_[None]) ** 2).sum(axis=2)
        if n * count <= 4_000_000
        else None
    )
    chosen: list[int] = []
    taken = np.zeros(n, dtype=bool)
    for c in range(count):
        d = dist[:, c] if dist is not None else ((feats - km.cluster_centers_[c]) ** 2).sum(axis=1)
        d = np.where(taken, np.inf, d)
        i = int(d.argmin())
        taken[i] = True
        chosen.append(i)
    return np.sort(np.asarray(chosen, dtype=np.int64))


def train_head_teachers(
    bank: ViewBank,
    train_index: NDArray[np.int64],
    labels: NDArray[np.integer],
    classes: int,
    config: PateFmConfig,
) -> tuple[torch.Tensor, torch.Tensor, list[NDArray[np.int64]]]:
    """Algorithm 1: ``config.teachers`` FixMatch heads on disjoint random partitions of the
    labelled pool records ``train_index`` (labels ``labels[train_index]``).
    Returns weights (T, C, D), biases (T, C) and the partitions."""
    if config.teachers > len(train_index):
        raise ValueError(f"{config.teachers} teachers need at least as many labelled records")
    order = np.random.default_rng(config.seed).permutation(np.asarray(train_index, dtype=np.int64))
    parts = [np.sort(p) for p in np.array_split(order, config.teachers)]
    y = np.asarray(labels)
    w, b = fit_heads(bank, parts, [y[p] for p in parts], classes, config.teacher)
    return w, b, parts


def label_pool(
    bank: ViewBank,
    train_index: NDArray[np.int64],
    labels: NDArray[np.integer],
    classes: int,
    config: PateFmConfig,
    rng: SecureRandom,
    teachers: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> PateFmResult:
    """Algorithms 1 and 2 on a pool ``bank``: teachers on ``train_index`` (labels
    ``labels`` (N,) over the whole pool; only those of ``train_index`` are read),
    queries, noisy aggregation with noise from ``rng``, accounting, and the student.

    ``teachers``: heads (weights, biases) already trained by :func:`train_head_teachers` with
    this configuration (an ensemble serves every budget: it does not depend on epsilon)."""
    mech = mechanism(config, classes)
    acct = accountants.make(config.accountant)
    fit = budget_queries(mech, acct, config.epsilon, config.delta)
    if fit < 1:
        raise ValueError(
            f"epsilon {config.epsilon} at delta {config.delta} does not pay for one query of "
            f"{mech.name} with these parameters; add noise or raise the budget"
        )
    count = min(fit, config.queries or fit, len(bank))
    if teachers is None:
        w, b, _ = train_head_teachers(bank, train_index, labels, classes, config)
    else:
        w, b = teachers
        if w.shape[0] != config.teachers:
            raise ValueError(
                f"got {w.shape[0]} teachers, the configuration names {config.teachers}"
            )
    queries = select_queries(bank, count, config.selection, config.seed)
    votes = head_predictions(bank.clean[torch.from_numpy(queries)], w, b)
    hist = mech.summed_votes(votes)
    released, answered = label_histograms(hist, mech, config.teachers, rng, mode="oracle")
    event = mech.event(answered)
    spent = acct.spent(acct.cost(event), config.delta)
    keep = np.asarray(answered, dtype=bool)
    if keep.any():
        student = fit_heads(bank, [queries[keep]], [released[keep]], classes, config.student)
    else:
        student = (torch.zeros((1, classes, bank.dim)), torch.zeros((1, classes)))
    return PateFmResult(
        queries=queries,
        labels=np.asarray(released, dtype=np.int64),
        answered=keep,
        event=event,
        epsilon=spent.epsilon,
        delta=config.delta,
        accountant=acct.name,
        budget_queries=fit,
        student=student,
        teacher_votes=votes,
    )
