"""One split's capc tuning run, shared by the images' and the tables' tuners: the
configurations (:class:`Candidate`), their pricing by the guardian's rounds
(:func:`admitted`), the student's and the loop's scoring, and :class:`Tuner`, the
images' tuner that :class:`.table_tuning.TableTuner` builds on. What each does and why:
:mod:`.capc_tuning`, the experiment's command.

Labels: one round of :func:`capc.round.central.label_histograms` (oracle mode) per
configuration on the summed votes, the guardian's noise from a seeded stream; each eps
is a prefix of it, where :func:`capc.round.central_budget.budget_filter` (the guardian's
rounds of :data:`BATCH`) stops.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
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
from capc.privacy.randomness import SecureRandom
from capc.round.central import label_histograms
from capc.round.central_budget import budget_filter
from experiments.side_by_side.capc_runs import DELTA, CapcConfig, image_ensemble
from experiments.side_by_side.data import Split
from experiments.side_by_side.tuned import OWN_WEIGHT
from services.commands.demo import DEMO_TASK, SHIPPED_BODY
from services.commands.up import accountant, queries_fit
from services.common.limits import MAX_REFERENCE_RECORDS
from services.student.training import OWN_BATCH, STUDENT_L2

DATASET = "animal-mnist"
EPSILONS = CapcConfig().epsilons
#: Queries a round holds (capc_runs' batch size): the BatchNorm batch of synthetic queries.
BATCH = CapcConfig().batch
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


# -- pricing --------------------------------------------------------------------------
def admitted(answered: NDArray[np.bool_], mechanism: Mechanism, epsilon: float) -> int:
    """Queries a fresh cap of ``epsilon`` (nats, at delta 1e-5) admits when rounds run in
    order over queries whose outcomes are ``answered`` (N,): each round's worst case
    must fit on top of what was charged, then the round is charged what happened (the
    module's docstring). The largest round is :data:`BATCH`; a smaller one runs where a
    whole one no longer fits. The votes are not an argument."""
    return budget_filter(answered, mechanism, epsilon, DELTA, accountant(), rounds=BATCH).processed


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
        teachers = sum(int(p.shape[1]) for p in predictions)
        labels, answered = label_histograms(votes, mech, teachers, rng, mode="oracle")
        rows = []
        for e in EPSILONS:
            done = admitted(answered, mech, e)
            if not mech.confident and done != min(len(qf), queries_fit(c.task(self.base_task), e)):
                raise RuntimeError(f"{c.name}: {done} queries at eps {e:g}, not queries_fit's")
            use = np.flatnonzero(answered[:done])
            acc = self._accuracy(qf[use], labels[use])
            rows.append(self._row(method, n, c, e, acc, done, len(use)))
            rows[-1]["pool_exhausted"] = done == len(qf)
            rows[-1]["label_agreement"] = agreement(votes[use], labels[use])
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
            voters = (s.hospitals - 1) * c.teachers
            labels, answered = label_histograms(votes, mech, voters, rng, mode="oracle")
            for e in EPSILONS:
                done, use, copies = bought(c, mech, answered, labels, own_view, e)
                f = torch.cat([own_f.repeat(copies, 1), uf[use]])
                y = np.concatenate([np.tile(own_y[order], copies), labels[use]])
                acc = scorer.accuracy(scorer.head(f, y))
                row = self._row("capc-loop", n, c, e, acc, done, len(use))
                row["accuracy_alone"], row["gain"] = alone, acc - alone
                row["label_agreement"] = agreement(votes[use], labels[use])
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


def agreement(votes: NDArray[np.float64], labels: NDArray[np.int64]) -> float | None:
    """Fraction of released labels equal to the noiseless plurality (a diagnostic: it
    reads the private votes, so it is never a release and decides nothing)."""
    return float((votes.argmax(1) == labels).mean()) if len(labels) else None
