"""capc tuned as the baselines are: at most 8 configurations per (dataset, n) cell,
trained on the tuning seed's shares and scored on ``split.tuning`` only (issue 43).

Run (animal-mnist; about 40 minutes on 2 shared cores; every finished cell is saved)::

    python -m experiments.side_by_side.capc_tuning --out experiments/results/side-by-side-capc-tuning.json \
        --sizes all 1000 --loop-sizes 1000 200 --pool 32768
    python -m experiments.side_by_side.capc_tuning --out experiments/results/side-by-side-capc-tuning.json \
        --sizes 200 50 --loop-sizes --pool 32768 --add-to

PATE with public records, on the student's grid (the queries are the split's public
records, at most all of them; every cell about a minute)::

    python -m experiments.side_by_side.capc_tuning --out experiments/results/side-by-side-capc-tuning.json \
        --sizes --loop-sizes --pate-sizes all 1000 200 50 --add-to

The CaPC loop at n = 50, and breast-cancer (:mod:`.table_tuning`: the same grid at its
task's share of the vote; minutes)::

    python -m experiments.side_by_side.capc_tuning --out experiments/results/side-by-side-capc-tuning.json \
        --sizes --loop-sizes 50 --add-to
    python -m experiments.side_by_side.capc_tuning --out experiments/results/side-by-side-capc-tuning.json \
        --dataset breast-cancer --sizes all 50 --pate-sizes all 50 --pool 32768 --add-to

The loop on breast-cancer (n = 50: at n = all a hospital has no unlabelled rows)::

    python -m experiments.side_by_side.capc_tuning --out experiments/results/side-by-side-capc-tuning.json \
        --dataset breast-cancer --sizes --loop-sizes 50 --add-to

No services run: this is central mode on the library pieces the services use.

* Teachers: each hospital's ``m`` heads on the shipped body
  (:func:`.capc_runs.image_ensemble`, what ``capc_runs.fit_image_teachers`` saves for
  a hospital's party).
* Queries: the DIET student's Gaussian recipe with the split's seed from record 0,
  as ``capc_runs`` submits it; each batch of :data:`BATCH` queries is read with its
  own BatchNorm statistics, by the teachers (one pass for every head, as a party's
  ensemble does) and by the student. The services' rounds start at each job's first
  query, so where a job's length is not a multiple of :data:`BATCH` their batches
  are cut elsewhere; nothing else differs.
  PATE with public records asks about the split's public records in their order:
  the teachers read them with their own stored statistics (a party reads a
  submitted file's records so), the student in batches of :data:`BATCH` with their
  own statistics (the student service reads every job's queries so).
* Labels: the mechanism object's noise draw and plaintext oracle on the summed
  votes (``mechanism.draw_noise``, ``mechanism.oracle``: the two calls of
  :func:`capc.learning.pate.label_within_budgets`, whose labels are bit for bit a
  networked round's for the same votes and noise).
* The student: what the student service's trainer does for a pretrained body
  (``services.student.training.ModelTrainer._fit_pretrained``, default options):
  a batch-standardised, class-balanced head with L2 :data:`STUDENT_L2` on the
  answered queries' features, the reference batch's statistics stored, then scored.
  The loop's model is the same head on the hospital's own records (features in
  batches of :data:`OWN_BATCH`, in the trainer's order) and its bought labels, with
  the statistics of a batch of its own records.

Pricing (every eps is a prefix of one run per configuration). The guardian's
ledger and each hospital's own charge the guardian's accountant (``gdp``, exact
Gaussian DP, ``services.commands.up.accountant``) at delta 1e-5; before a round runs its
worst case (every query answered) must fit the cap on top of what earlier rounds
were actually charged, and afterwards the round is charged what happened: the
threshold test of every query, GNMax on the answered ones. Under ``gdp`` that is a
privacy filter under fully adaptive composition (Smith and Thakurta 2022: adaptively
chosen Gaussian mechanisms whose sum of mu**2 is kept within the cap before each
step are mu-GDP). So the labels a configuration buys at eps ``e`` are those of the
rounds a fresh cap of ``e`` admits (:func:`admitted`): rounds of :data:`BATCH`
queries while a whole round's worst case fits, then the largest round whose worst
case still fits, until none does. What decides the stop is data-independent apart
from the answered counts, which are DP outputs charged inside the cap. For GNMax
every query is answered and this is exactly ``queries_fit(task, e)``, the count
``capc_runs`` prices its rows at (checked at run time). A confident mechanism runs
as robust-confident-gnmax, the one distributed rounds take (the guardian refuses
confident-gnmax's single shared test noise); its test has L2 sensitivity sqrt(2).
Through the services today a confident task's rows would be priced by its worst
case (``capc_runs.counts``), fewer queries than this filter: a student that keeps
submitting rounds until the guardian refuses one gets these.

Configurations (:func:`student_grid`, :func:`loop_grid`): teachers per hospital
``m`` around the grid's rule ``m0 = teachers_per_hospital``; GNMax with sigma a
multiple of the shipped share of the vote (sigma = 40 x voters / 250); and
robust-confident-gnmax with threshold and test noise as fractions of the voters.
The loop (hospital 0 buying labels for its unlabelled records from the others'
teachers) is also tried with two post-processings of its labels: keeping only those
its own model agrees with, and weighting its own records four times (they enter
the fit four times). Its "alone" is its model on its own records, scored on the
same tuning records.
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from capc.data.generators import Recipe
from capc.learning.last_layer import fit_batch_standardised
from capc.mechanisms import Mechanism, from_config
from capc.models import load_teacher
from capc.models.ensemble import TeacherEnsemble
from capc.models.inference import features, reference_statistics
from capc.models.registry import Classifier
from capc.mpc.mechanism_circuits import CIRCUIT_FRAC_BITS
from capc.privacy.randomness import SecureRandom
from experiments.side_by_side.capc_runs import (
    DELTA,
    TABLE_VOTERS,
    CapcConfig,
    image_ensemble,
    scaled_task,
    teachers_per_hospital,
)
from experiments.side_by_side.data import DATASETS, TUNING_SEED, Split, split
from experiments.side_by_side.tuned import OWN_WEIGHT
from services.commands.demo import DEMO_TASK, DEMO_VOTERS, SHIPPED_BODY
from services.commands.up import accountant, queries_fit
from services.common.limits import MAX_REFERENCE_RECORDS
from services.student.training import OWN_BATCH, STUDENT_L2

DATASET = "animal-mnist"
#: Datasets of table rows (no body: MLP teachers, students and loop models).
TABLES = ("breast-cancer",)
EPSILONS = CapcConfig().epsilons
#: Queries a round holds (capc_runs' batch size): the BatchNorm batch of synthetic queries.
BATCH = CapcConfig().batch
#: At most this many configurations per (dataset, n) cell, as the baselines.
MAX_GRID = 8
#: Largest number of synthetic queries a configuration may use (a recipe's limit).
MAX_POOL = 65_536
#: The shipped GNMax sigma per voter (the demo's 40 of 250).
SIGMA_SHARE = float(DEMO_TASK["mechanism"]["sigma"]) / DEMO_VOTERS
#: Each dataset's shipped sigma per voter: images the demo's; breast-cancer its task's
#: 23 for 3 hospitals x 8 teachers (``capc_runs.scaled_task``).
SIGMA_SHARES = {
    DATASET: SIGMA_SHARE,
    "breast-cancer": float(scaled_task("breast-cancer", TABLE_VOTERS)["mechanism"]["sigma"])
    / TABLE_VOTERS,
}
Log = Callable[[str], None]


@dataclass(frozen=True)
class Candidate:
    """One configuration: teachers per hospital, the mechanism (a :mod:`capc.mechanisms`
    config, its numbers in votes) and, for the loop, what it does with its labels
    (``retrain``: the services' way; ``agree``: only labels its own model agrees with;
    ``own-x4``: its own records weighted four times)."""

    name: str
    teachers: int
    mechanism: dict[str, Any]
    labels: str = "retrain"

    def build(self, classes: int = int(DEMO_TASK["num_classes"])) -> Mechanism:
        """The mechanism for a task of ``classes`` classes (default: the demo's)."""
        return from_config(self.mechanism, classes)

    def task(self, base: dict[str, Any] = DEMO_TASK) -> dict[str, Any]:
        """``base`` (default: the demo's task) with this mechanism."""
        return {**base, "mechanism": dict(self.mechanism)}


def gnmax(voters: int, factor: float = 1.0, share: float = SIGMA_SHARE) -> dict[str, Any]:
    """GNMax with sigma ``factor`` times the shipped ``share`` (per voter) of ``voters``."""
    return {"name": "gnmax", "sigma": round(share * voters * factor, 4)}


def robust(
    voters: int, threshold: float, sigma1: float, factor: float = 1.0, share: float = SIGMA_SHARE
) -> dict[str, Any]:
    """robust-confident-gnmax: threshold and test noise as fractions of ``voters``, the
    answer's sigma ``factor`` times the shipped ``share``."""
    return {
        "name": "robust-confident-gnmax",
        "sigma": round(share * voters * factor, 4),
        "threshold": round(threshold * voters, 4),
        "sigma1": round(sigma1 * voters, 4),
    }


def student_grid(n: int, hospitals: int, dataset: str = DATASET) -> list[Candidate]:
    """The DIET student's (and PATE's) configurations for ``n`` labelled records a
    hospital of ``dataset``; the first is the shipped rule (``capc_runs``)."""
    m0 = teachers_per_hospital(dataset, n)
    few, many = max(1, m0 // 5), 2 * m0
    v0, vf, vm = hospitals * m0, hospitals * few, hospitals * many
    share = SIGMA_SHARES[dataset]
    return [
        Candidate("shipped: m0, gnmax at the share", m0, gnmax(v0, share=share)),
        Candidate("m0, gnmax at 2x the share", m0, gnmax(v0, 2.0, share)),
        Candidate("m0, gnmax at 4x the share", m0, gnmax(v0, 4.0, share)),
        Candidate("2 m0, gnmax at the share", many, gnmax(vm, share=share)),
        Candidate("m0/5, gnmax at the share", few, gnmax(vf, share=share)),
        Candidate("m0/5, gnmax at m0's sigma", few, gnmax(v0, share=share)),
        Candidate("m0, confident T .5 s1 .2", m0, robust(v0, 0.5, 0.2, share=share)),
        Candidate("m0, confident T .6 s1 .3 at 2x", m0, robust(v0, 0.6, 0.3, 2.0, share)),
    ]


def loop_grid(n: int, hospitals: int, dataset: str = DATASET) -> list[Candidate]:
    """The CaPC loop's configurations for ``n`` labelled records a hospital of ``dataset``
    (sigma for every hospital's teachers, as the consortium's task sets it; hospital 0's
    own never vote)."""
    m0 = teachers_per_hospital(dataset, n)
    v0, voting = hospitals * m0, (hospitals - 1) * m0
    share = SIGMA_SHARES[dataset]
    confident = robust(voting, 0.7, 0.15)
    confident["sigma"] = gnmax(v0, share=share)["sigma"]
    shipped = gnmax(v0, share=share)
    return [
        Candidate("shipped: gnmax, retrain", m0, shipped),
        Candidate("gnmax, agree", m0, shipped, "agree"),
        Candidate("gnmax, own x4", m0, shipped, "own-x4"),
        Candidate("confident T .7 s1 .15, retrain", m0, confident),
        Candidate("confident T .7 s1 .15, agree", m0, confident, "agree"),
        Candidate("confident T .7 s1 .15, own x4", m0, confident, "own-x4"),
    ]


# -- pricing --------------------------------------------------------------------------
def admitted(answered: NDArray[np.bool_], mechanism: Mechanism, epsilon: float) -> int:
    """Queries a fresh cap of ``epsilon`` (nats, at delta 1e-5) admits when rounds run in
    order over queries whose outcomes are ``answered`` (N,): each round's worst case
    must fit on top of what was charged, then the round is charged what happened (the
    module's docstring). The largest round is :data:`BATCH`; a smaller one runs where a
    whole one no longer fits. The votes are not an argument."""
    acct = accountant()
    unit = acct.filter_cost(mechanism.per_query())
    spent, done = acct.zero(), 0
    while done < len(answered):
        size = min(BATCH, len(answered) - done, acct.max_count_of(unit, epsilon, DELTA, spent))
        if size < 1:
            break
        worst = acct.filter_cost(mechanism.worst_case(size))
        if not acct.fits(spent + worst, epsilon, DELTA):
            raise RuntimeError(f"a round of {size} does not fit although max_count said so")
        spent = spent + acct.filter_cost(mechanism.event(answered[done : done + size]))
        done += size
    return done


def bought(
    c: Candidate,
    mechanism: Mechanism,
    answered: NDArray[np.bool_],
    labels: NDArray[np.int64],
    own_view: NDArray[np.int64],
    epsilon: float,
) -> tuple[int, NDArray[np.int64], int]:
    """What the loop's configuration ``c`` gets at a fresh cap of ``epsilon``: the
    queries asked (:func:`admitted`), the indices (K,) of the labels it trains on
    (answered ones; with "agree" only those ``own_view`` (N,) agrees with) and the
    copies of its own records in the fit (the services' ``own_weight``)."""
    done = admitted(answered, mechanism, epsilon)
    use = np.flatnonzero(answered[:done])
    if c.labels == "agree":
        use = use[own_view[use] == labels[use]]
    return done, use, OWN_WEIGHT.get(c.labels, 1)


# -- scoring ----------------------------------------------------------------------------
#: Records a batch when ``capc.learning.supervised.accuracy`` reads a model (its default).
SCORE_BATCH = 1024


class Scorer:
    """Heads on the body with ``reference``'s statistics stored, scored on ``score``.

    What the student service's trainer stores (``reference_statistics`` of a model
    with a fitted head) is, for the body, the same whatever the head: the reference
    batch's pass through the body does not read it. So the body's statistics, the
    features the reference batch gives the head and the features of the scored
    records are computed once here, and a head then costs its fit alone; every
    accuracy is bit for bit ``accuracy`` of the whole model (the same passes, the
    same batches)."""

    def __init__(
        self,
        body: Classifier,
        reference: NDArray[np.float32],
        score: tuple[NDArray[np.float32], NDArray[np.int64]],
    ) -> None:
        self.model = copy.deepcopy(body)
        seen: list[torch.Tensor] = []
        hook = self.model.features.register_forward_hook(lambda _m, _i, out: seen.append(out))
        try:
            reference_statistics(self.model, reference)
        finally:
            hook.remove()
        (self.reference,) = seen
        self.features = features(self.model, score[0], batch=SCORE_BATCH)
        self.labels = score[1]

    def head(self, feats: torch.Tensor, labels: NDArray[np.int64]) -> torch.nn.Module:
        """The student service's pretrained head fitted to (N, D) ``feats`` and their
        labels, with the reference batch's statistics stored."""
        head = fit_batch_standardised(
            feats, labels, self.model.head.out_features, l2=STUDENT_L2, balanced=True
        )
        reference_statistics(head, self.reference.numpy())
        return head

    def predict(
        self, head: torch.nn.Module, x: NDArray[np.float32] | None = None
    ) -> NDArray[np.int64]:
        """The classes the body and ``head`` give (N, *input_shape) ``x`` (default: the
        scored records), read in batches as ``logits`` reads them."""
        f = self.features if x is None else features(self.model, x, batch=SCORE_BATCH)
        with torch.no_grad():
            out = [head.eval()(f[lo : lo + SCORE_BATCH]) for lo in range(0, len(f), SCORE_BATCH)]
        return torch.cat(out).argmax(1).numpy()

    def accuracy(self, head: torch.nn.Module) -> float:
        """``head``'s accuracy on the scored records."""
        return float((self.predict(head) == self.labels).mean())


@dataclass
class Tuner:
    """One split's tuning run: the body, the query pool's features and teachers, cached."""

    split: Split
    pool: int
    log: Log
    #: Records every score is taken on: the tuning records (a test passes others).
    score_on: NDArray[np.int64] | None = None
    #: The task the candidates' mechanisms are set in (its classes; ``queries_fit``'s).
    base_task: dict[str, Any] = field(default_factory=lambda: dict(DEMO_TASK))

    def __post_init__(self) -> None:
        self.classes = int(self.base_task["num_classes"])
        self.base = load_teacher(SHIPPED_BODY)
        self.body = self.base.model.eval()
        self._ensembles: dict[tuple[int, int], list[TeacherEnsemble]] = {}
        self._queries: torch.Tensor | None = None
        self._public: torch.Tensor | None = None
        self._public_votes: dict[tuple[int, int], list[NDArray[np.int64]]] = {}
        self._scorers: dict[tuple[str, int], Scorer] = {}
        idx = self.split.tuning if self.score_on is None else self.score_on
        self.score = (self.split.x[idx], self.split.y[idx])

    def query_features(self) -> torch.Tensor:
        """(pool, D) features of the synthetic queries, batches of :data:`BATCH` read with
        their own statistics (what the teachers and the student both see)."""
        if self._queries is None:
            t = time.perf_counter()
            x = Recipe("gaussian", self.split.seed, 0, self.pool, (1, 28, 28)).generate()
            self._queries = features(self.body, x, current_statistics=True, batch=BATCH)
            self.log(f"{self.pool} queries' features in {time.perf_counter() - t:.0f} s")
        return self._queries

    def ensembles(self, n: int, m: int) -> list[TeacherEnsemble]:
        if (n, m) not in self._ensembles:
            t = time.perf_counter()
            self._ensembles[(n, m)] = [
                image_ensemble(self.split, n, m, i, self.base) for i in range(self.split.hospitals)
            ]
            self.log(f"n={n}: {m} teachers a hospital in {time.perf_counter() - t:.0f} s")
        return self._ensembles[(n, m)]

    def public_features(self) -> torch.Tensor:
        """(public, D) features of the split's public records in their order, batches of
        :data:`BATCH` read with their own statistics (as the student service reads a
        job's queries to train on)."""
        if self._public is None:
            self._public = features(
                self.body, self.split.x[self.split.public], current_statistics=True, batch=BATCH
            )
        return self._public

    def public_predictions(self, n: int, m: int) -> list[NDArray[np.int64]]:
        """Each hospital's teachers' predictions (public, m) on the public records, each
        teacher reading them with its own statistics, as a party reads a submitted file's
        records (``services.answerer.party``: tensors under stored statistics)."""
        if (n, m) not in self._public_votes:
            x = self.split.x[self.split.public]
            self._public_votes[(n, m)] = [
                e.predict(x, current_statistics=False) for e in self.ensembles(n, m)
            ]
        return self._public_votes[(n, m)]

    def student(self, n: int, c: Candidate) -> list[dict[str, Any]]:
        """The DIET student of ``c`` at every eps (rows scored on the tuning records)."""
        qf = self.query_features()
        # Synthetic queries: the teachers read them with the batch's own statistics,
        # as the student does, so one pass of the body serves both.
        predictions = [
            np.concatenate(
                [e.predict_features(qf[lo : lo + 8192]) for lo in range(0, len(qf), 8192)]
            )
            for e in self.ensembles(n, c.teachers)
        ]
        return self._student("capc-diet-student", qf, predictions, n, c)

    def pate_public(self, n: int, c: Candidate) -> list[dict[str, Any]]:
        """PATE with public records for ``c`` at every eps: the student labels the split's
        public records (at most all of them) and trains on them, as the DIET student."""
        predictions = self.public_predictions(n, c.teachers)
        return self._student("capc-pate-public", self.public_features(), predictions, n, c)

    def _student(
        self,
        method: str,
        qf: torch.Tensor,
        predictions: Sequence[NDArray[np.int64]],
        n: int,
        c: Candidate,
    ) -> list[dict[str, Any]]:
        """``method``'s rows for ``c``: the student's query features ``qf`` (N, D) and
        each hospital's teachers' predictions on those queries (N, m)."""
        mech = c.build(self.classes)
        votes = np.zeros((len(qf), mech.outputs))
        for p in predictions:
            for lo in range(0, len(qf), 8192):
                votes[lo : lo + 8192] += mech.summed_votes(p[lo : lo + 8192])
        seed = f"side-by-side-capc-tuning-{n}-{c.name}"
        if method != "capc-diet-student":
            seed = f"{seed}-{method}"  # the DIET student's seed stays what it was
        if self.split.dataset != DATASET:
            seed = f"{seed}-{self.split.dataset}"  # and so do animal-mnist's
        rng = SecureRandom.from_seed(seed)
        labels, answered = mech.oracle(votes, mech.draw_noise(len(votes), rng), CIRCUIT_FRAC_BITS)
        rows = []
        for e in EPSILONS:
            done = admitted(answered, mech, e)
            if not mech.confident and done != min(len(qf), queries_fit(c.task(self.base_task), e)):
                raise RuntimeError(f"{c.name}: {done} queries at eps {e:g}, not queries_fit's")
            use = np.flatnonzero(answered[:done])
            acc = self._accuracy(qf[use], labels[use])
            rows.append(self._row(method, n, c, e, acc, done, len(use)))
            rows[-1]["pool_exhausted"] = done == len(qf)
            rows[-1]["label_agreement"] = _agreement(votes[use], labels[use])
        return rows

    def scorer(self, key: tuple[str, int], reference: NDArray[np.float32]) -> Scorer:
        """The :class:`Scorer` of the models whose reference batch ``key`` names."""
        if key not in self._scorers:
            self._scorers[key] = Scorer(self.body, reference, self.score)
        return self._scorers[key]

    def _accuracy(self, qf: torch.Tensor, labels: NDArray[np.int64]) -> float | None:
        """The student trained on the answered queries' (N, D) features ``qf`` and their
        labels, scored (None: the student service would refuse to train)."""
        if len(labels) < 2 or len(np.unique(labels)) < 2:
            return None
        scorer = self.scorer(("student", 0), self.split.x[self.split.reference])
        return scorer.accuracy(scorer.head(qf, labels))

    def loop(self, n: int, grid: Sequence[Candidate]) -> list[dict[str, Any]]:
        """Hospital 0's CaPC loop for every candidate, and its model alone."""
        s = self.split
        own = s.labelled(0, n)
        own_x, own_y = s.x[own], s.y[own]
        unlabelled = s.x[s.unlabelled(0, n)]
        # ModelTrainer's orders: features of its own records, and its reference batch.
        order = np.random.default_rng(1).permutation(len(own_x))
        own_f = features(self.body, own_x[order], current_statistics=True, batch=OWN_BATCH)
        ref_order = np.random.default_rng(0).permutation(len(own_x))
        reference = own_x[ref_order[:MAX_REFERENCE_RECORDS]]
        uf = features(self.body, unlabelled, current_statistics=True, batch=BATCH)
        scorer = self.scorer(("loop", n), reference)
        alone_head = scorer.head(own_f, own_y[order])
        alone = scorer.accuracy(alone_head)
        own_view = scorer.predict(alone_head, unlabelled)
        rows = [self._row("alone (hospital 0)", n, None, None, alone, 0, 0)]
        votes_by_m: dict[int, NDArray[np.float64]] = {}
        for c in grid:
            mech = c.build()
            if c.teachers not in votes_by_m:
                t = time.perf_counter()
                # Real records: each teacher reads them with its own statistics, as a
                # party's ensemble does for tensors; hospital 0's teachers never vote.
                others = self.ensembles(n, c.teachers)[1:]
                votes_by_m[c.teachers] = sum(
                    (
                        mech.summed_votes(e.predict(unlabelled, current_statistics=False))
                        for e in others
                    ),
                    np.zeros((len(unlabelled), mech.outputs)),
                )
                self.log(f"loop n={n}: votes in {time.perf_counter() - t:.0f} s")
            votes = votes_by_m[c.teachers]
            rng = SecureRandom.from_seed(f"side-by-side-capc-tuning-loop-{n}-{c.mechanism}")
            labels, answered = mech.oracle(
                votes, mech.draw_noise(len(votes), rng), CIRCUIT_FRAC_BITS
            )
            for e in EPSILONS:
                done, use, copies = bought(c, mech, answered, labels, own_view, e)
                f = torch.cat([own_f.repeat(copies, 1), uf[use]])
                y = np.concatenate([np.tile(own_y[order], copies), labels[use]])
                acc = scorer.accuracy(scorer.head(f, y))
                row = self._row("capc-loop", n, c, e, acc, done, len(use))
                row["accuracy_alone"], row["gain"] = alone, acc - alone
                row["label_agreement"] = _agreement(votes[use], labels[use])
                row["label_accuracy"] = (
                    float((labels[use] == s.y[s.unlabelled(0, n)][use]).mean())
                    if len(use)
                    else None
                )
                rows.append(row)
        return rows

    def _row(
        self,
        method: str,
        n: int,
        c: Candidate | None,
        e: float | None,
        acc: float | None,
        queries: int,
        labels: int,
    ) -> dict[str, Any]:
        return {
            "dataset": self.split.dataset,
            "method": method,
            "n": n,
            "epsilon": e,
            "delta": DELTA,
            "seed": self.split.seed,
            "config": None if c is None else asdict(c),
            "tuning_accuracy": acc,
            "queries": queries,
            "labels": labels,
        }


def _agreement(votes: NDArray[np.float64], labels: NDArray[np.int64]) -> float | None:
    """Fraction of released labels equal to the noiseless plurality (a diagnostic: it
    reads the private votes, so it is never a release and decides nothing)."""
    return float((votes.argmax(1) == labels).mean()) if len(labels) else None


def chosen(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (dataset, method, n, eps): the configuration with the best tuning accuracy, and the
    shipped rule's for comparison. On a tie the first that the services can run (a loop
    that does not filter its labels, :data:`.tuned.OWN_WEIGHT`), else the first, as
    the baselines: tied configurations score the same, so which of them is reported
    reads nothing more of the data."""
    out = []
    cells: dict[tuple[str, str, int, float], list[dict[str, Any]]] = {}
    for r in rows:
        if r["epsilon"] is not None:
            cells.setdefault((r["dataset"], r["method"], r["n"], r["epsilon"]), []).append(r)
    for (dataset, method, n, e), rs in cells.items():
        scored = [r for r in rs if r["tuning_accuracy"] is not None]
        top = max((r["tuning_accuracy"] for r in scored), default=None)
        tied = [r for r in scored if r["tuning_accuracy"] == top]
        runnable = [r for r in tied if r["config"].get("labels", "retrain") in OWN_WEIGHT]
        best = (runnable or tied)[0] if tied else None
        shipped = next(r for r in rs if r["config"]["name"].startswith("shipped"))
        out.append(
            {
                "dataset": dataset,
                "method": method,
                "n": n,
                "epsilon": e,
                "chosen": None if best is None else best["config"]["name"],
                "tuning_accuracy": None if best is None else best["tuning_accuracy"],
                "shipped_tuning_accuracy": shipped["tuning_accuracy"],
                "chosen_config": None if best is None else best["config"],
            }
        )
    return out


def run(
    s: Split,
    sizes: Sequence[int | None],
    loop_sizes: Sequence[int],
    pool: int,
    log: Log,
    score_on: NDArray[np.int64] | None = None,
    grid: Callable[[int, int], list[Candidate]] | None = None,
    loops: Callable[[int, int], list[Candidate]] | None = None,
    tuner: Tuner | None = None,
    pate_sizes: Sequence[int | None] = (),
) -> list[dict[str, Any]]:
    """Every tuning row of ``s`` (only its hospitals' shares, its public records and
    ``score_on``, by default the tuning records, are read). ``grid``: the student's
    configurations (default: :func:`student_grid` of ``s``'s dataset). ``tuner``: one
    whose features and teachers to reuse. ``pate_sizes``: n for PATE with public records,
    tried on the student's grid. ``loops``: the loop's configurations (default:
    :func:`loop_grid` of ``s``'s dataset)."""
    grid = grid or partial(student_grid, dataset=s.dataset)
    loops = loops or partial(loop_grid, dataset=s.dataset)
    tuner = tuner or tuner_for(s, pool, log, score_on)
    rows: list[dict[str, Any]] = []
    students = [("student", size, tuner.student) for size in sizes]
    students += [("pate-public", size, tuner.pate_public) for size in pate_sizes]
    for what, size, method in students:
        n = s.size(size)
        candidates = grid(n, s.hospitals)
        if len(candidates) > MAX_GRID:
            raise ValueError(f"{len(candidates)} configurations for n={n}; at most {MAX_GRID}")
        for c in candidates:
            rows += method(n, c)
            log(
                f"{what} n={n} {c.name}: "
                + ", ".join(
                    f"eps {r['epsilon']:g} {r['labels']} labels {r['tuning_accuracy']}"
                    for r in rows[-len(EPSILONS) :]
                )
            )
    for n in loop_sizes:
        candidates = loops(n, s.hospitals)
        if len(candidates) > MAX_GRID:
            raise ValueError(f"{len(candidates)} loop configurations for n={n}")
        rows += tuner.loop(n, candidates)
        log(f"loop n={n} done")
    return rows


def tuner_for(s: Split, pool: int, log: Log, score_on: NDArray[np.int64] | None = None) -> Tuner:
    """The tuner of ``s``'s kind: images' (:class:`Tuner`) or a table's
    (:class:`.table_tuning.TableTuner`)."""
    if s.dataset not in TABLES:
        return Tuner(s, pool, log, score_on)
    from experiments.side_by_side.table_tuning import TableTuner  # it builds on this module

    return TableTuner(s, pool, log, score_on)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.side_by_side.capc_tuning")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file of rows")
    parser.add_argument(
        "--dataset",
        choices=DATASETS,
        default=DATASET,
        help="the dataset whose capc to tune (its rows join the file's others)",
    )
    parser.add_argument(
        "--sizes",
        nargs="*",
        default=["all", "1000", "200", "50"],
        help="labelled records per hospital for the student ('all': a whole share)",
    )
    parser.add_argument(
        "--pate-sizes",
        nargs="*",
        default=[],
        help="labelled records per hospital for PATE with public records ('all': a share)",
    )
    parser.add_argument(
        "--loop-sizes",
        nargs="*",
        type=int,
        default=None,
        help="n for the loop (default: 200 1000 on images; none on tables, as before they had one)",
    )
    parser.add_argument(
        "--pool", type=int, default=MAX_POOL, help="synthetic queries at most (<= 65,536)"
    )
    parser.add_argument(
        "--add-to",
        action="store_true",
        help="merge into the saved rows (a row of the same method, n, eps and config replaced)",
    )
    parser.add_argument(
        "--rows-from",
        type=Path,
        nargs="+",
        default=None,
        help="saved tuning files whose rows to merge in (with --add-to); nothing is run",
    )
    return parser


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    config = row["config"]
    name = None if config is None else config["name"]
    return (row["dataset"], row["method"], row["n"], row["epsilon"], name)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 1 <= args.pool <= MAX_POOL:
        raise SystemExit(f"--pool must lie in [1, {MAX_POOL}]")
    torch.set_num_threads(1)
    command = shlex.join(
        ["python", "-m", "experiments.side_by_side.capc_tuning", *(argv or sys.argv[1:])]
    )
    start = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - start:6.0f} s] {text}", file=sys.stderr, flush=True)

    sizes = [None if v == "all" else int(v) for v in args.sizes]
    pate_sizes = [None if v == "all" else int(v) for v in args.pate_sizes]
    saved = json.loads(args.out.read_text()) if args.add_to and args.out.exists() else {}
    rows: list[dict[str, Any]] = list(saved.get("rows", []))
    commands = [*saved.get("commands", []), command]
    seconds = saved.get("seconds", 0.0)
    if args.rows_from:
        # Cells run apart (in parallel, into their own files) merged without running.
        for path in args.rows_from:
            other = json.loads(path.read_text())
            rows = _merged(rows, other["rows"])
            commands += [c for c in other["commands"] if c not in commands]
            seconds += other.get("seconds", 0.0)
        _write(args.out, rows, commands, seconds)
        return 0
    s = split(args.dataset, TUNING_SEED)
    tuner = tuner_for(s, args.pool, log)
    loop_sizes = args.loop_sizes
    if loop_sizes is None:
        loop_sizes = [] if s.dataset in TABLES else [200, 1000]
    # Each cell is saved as it ends, so a run that is stopped keeps what it finished.
    cells: list[tuple[list[int | None], list[int], list[int | None]]]
    cells = [([v], [], []) for v in sizes]
    cells += [([], [n], []) for n in loop_sizes]
    cells += [([], [], [v]) for v in pate_sizes]
    for cell_sizes, cell_loops, cell_pate in cells:
        new = run(s, cell_sizes, cell_loops, args.pool, log, tuner=tuner, pate_sizes=cell_pate)
        rows = _merged(rows, new)
        _write(args.out, rows, commands, seconds + time.perf_counter() - start)
    return 0


def _merged(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``old`` with ``new`` added, a new row replacing an old one of its key."""
    fresh = {_key(r) for r in new}
    return [r for r in old if _key(r) not in fresh] + list(new)


def _write(path: Path, rows: list[dict[str, Any]], commands: list[str], seconds: float) -> None:
    result = {
        "experiment": "side_by_side_capc_tuning",
        "commands": commands,
        "datasets": sorted({r["dataset"] for r in rows}),
        "seed": TUNING_SEED,
        "scored_on": "split.tuning",
        "accountant": "gdp (services.commands.up.accountant), delta 1e-5, rounds admitted by worst case",
        "rows": rows,
        "chosen": chosen(rows),
        "seconds": seconds,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    raise SystemExit(main())
