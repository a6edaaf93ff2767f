"""capc with DP-trained teachers (issue 52), in central mode on the pieces the services
use, and the scenario baselines they are compared with.

Each hospital trains ONE teacher on all its labelled records: a linear head on the
``diet-linear`` inputs (the shipped body's features with public-record statistics and
standardisation, :func:`.training.inputs`), full-batch DP-SGD
(:func:`capc.learning.dp_sgd.train`) at the record :func:`capc.privacy.dp_training.plan_training`
makes for (eps, 1e-5): what the services charge a DP-trained teacher once, under
replace-one neighbours. Every answer of a DP-trained model is post-processing, so its
labels cost nothing more and are not noised: a query's label is the plurality of the
teachers' predictions (:func:`capc.learning.hospital.majority`, ties to the lower class,
as the secure circuit's argmax).

* ``capc-dp-student``: the DIET student (no data of its own) labels :data:`QUERIES`
  synthetic queries (the Gaussian recipe with the split's seed, as ``capc_tuning``) by
  every hospital's teacher and trains the student service's pretrained head on them
  (:meth:`.tuner.Tuner._accuracy`, the central-mode student of the grid's tuning).
* ``capc-dp-loop``: the querier (hospital 0 unless named) has its unlabelled records
  labelled by the OTHER hospitals' teachers and fits its own model (a ``diet-linear``
  head, :func:`.training.fit_nonprivate`, l2 tuned) on its labelled records plus those.
  ``accuracy_before`` is the same model on its labelled records alone.

Tuning: at most :data:`MAX_GRID` configurations a method, on the scenario's pseudo
consortium (:func:`.scenarios.tuning_split`), scored on ``split.public``; the chosen
configuration is then run once per reported seed and scored on ``split.test``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.learning import dp_sgd
from capc.learning.hospital import majority
from capc.models import load_teacher
from capc.models.inference import features, recalibrate
from capc.privacy.dp_training import plan_training
from capc.privacy.randomness import SecureRandom
from experiments.side_by_side import baselines
from experiments.side_by_side.data import Split
from experiments.side_by_side.scenarios import TUNED_ON, ScenarioSplit
from experiments.side_by_side.training import (
    FEATURE_BATCH,
    Config,
    accuracy,
    build_model,
    fit_nonprivate,
    inputs,
    predict,
)
from experiments.side_by_side.tuner import Tuner
from services.commands.teacher_cli import SHIPPED_BODY

DELTA = 1e-5
MAX_GRID = 8
#: Synthetic queries the DP student labels (free: post-processing of DP models).
QUERIES = 8192
METHODS = ("capc-dp-student", "capc-dp-loop")
NEIGHBOURING = (
    "replace-one (capc's DP-training charge); the Opacus baselines' add/remove-one is "
    "the weaker unit"
)
Log = Callable[[str], None]
Row = dict[str, Any]


@dataclass(frozen=True)
class TeacherConfig:
    """A DP-trained teacher's full-batch DP-SGD: ``steps`` steps of SGD at ``lr`` with
    per-record clipping to ``clip``."""

    steps: int
    lr: float
    clip: float = 1.0


#: The teachers' grid (the lead's measured 300 steps at lr 0.5 among them).
TEACHER_GRID = (TeacherConfig(100, 0.5), TeacherConfig(100, 2.0), TeacherConfig(300, 0.5))
#: The loop's own model: a diet-linear head's l2 (alone's family).
LOOP_L2 = (1e-3, 1e-1)


class QueryInputs:
    """The teachers' view of synthetic queries: the shipped body's features of each batch
    of :data:`.tuner.BATCH` queries read with the batch's own BatchNorm statistics
    (as DIET teachers and the student read them), standardised by the mean and spread
    of the public records' features (as the teachers' training inputs,
    :func:`.training.body_features`). Read with the public records' statistics
    instead, Gaussian queries all fall in one class (measured: 2,047 of 2,048)."""

    def __init__(self, s: Split) -> None:
        body = load_teacher(SHIPPED_BODY).model
        recalibrate(body, s.x[s.public], batch=FEATURE_BATCH)
        raw = features(body, s.x[s.public], batch=FEATURE_BATCH).numpy()
        self.mean, self.std = raw.mean(0), np.maximum(raw.std(0), 1e-6)

    def __call__(self, batch_features: torch.Tensor) -> NDArray[np.float32]:
        """(Q, D) teachers' inputs of (Q, D) features read with batch statistics."""
        out: NDArray[np.float32] = ((batch_features.numpy() - self.mean) / self.std).astype(
            np.float32
        )
        return out


def train_teacher(
    s: Split,
    i: int,
    n: int | None,
    x: NDArray[np.float32],
    epsilon: float,
    config: TeacherConfig,
) -> nn.Module:
    """Hospital ``i``'s DP-trained head on its labelled records' (N, D) inputs ``x[idx]``."""
    idx = s.labelled(i, n)
    record = plan_training(epsilon, DELTA, config.steps, config.clip, len(idx))
    model = build_model("diet-linear", x.shape[1:], s.classes, seed=1000 * s.seed + i, private=True)
    scenario = getattr(s, "scenario", "iid")
    rng = SecureRandom.from_seed(f"side-by-side-dp-teacher-{scenario}-{s.seed}-{i}-{epsilon}")
    return dp_sgd.train(model, x[idx], s.y[idx], record, lr=config.lr, rng=rng, seed=s.seed)


def plurality(
    teachers: Sequence[nn.Module], x: NDArray[np.float32], classes: int
) -> NDArray[np.int64]:
    """(N,) plurality of the teachers' predictions on (N, D) inputs (ties: lower class)."""
    votes = np.stack([predict(t, x) for t in teachers], axis=1)
    return majority(votes, classes)


@dataclass
class Context:
    """One split's shared pieces: inputs, the student's tuner and the queries' views."""

    split: Split
    score_on: NDArray[np.int64]
    cache: Path | None
    log: Log
    queries: int = QUERIES

    def __post_init__(self) -> None:
        self.x = inputs(self.split, "diet-linear", self.cache)
        self._tuner: Tuner | None = None

    @property
    def tuner(self) -> Tuner:
        """The central-mode student's trainer, the queries' features shared per seed."""
        if self._tuner is None:
            self._tuner = Tuner(self.split, self.queries, self.log, self.score_on)
            self._tuner._queries = self._cached()[0]
        return self._tuner

    def query_inputs(self) -> NDArray[np.float32]:
        """(Q, D): the synthetic queries as the teachers read them."""
        return self._cached()[1]

    def _cached(self) -> tuple[torch.Tensor, NDArray[np.float32]]:
        key = (self.split.dataset, self.split.seed, self.queries)
        if key not in _QUERIES:
            t = time.perf_counter()
            view = Tuner(self.split, self.queries, self.log, self.score_on).query_features()
            _QUERIES[key] = (view, QueryInputs(self.split)(view))
            self.log(f"{self.queries} queries' two views in {time.perf_counter() - t:.0f} s")
        return _QUERIES[key]


def student(ctx: Context, teachers: Sequence[nn.Module]) -> tuple[float | None, float]:
    """The DIET student's accuracy on ``ctx.score_on``, and its labels' agreement with
    nothing private: the fraction of queries labelled by the most common class (a
    diagnostic of degenerate labels)."""
    labels = plurality(teachers, ctx.query_inputs(), ctx.split.classes)
    qf = ctx.tuner.query_features()
    acc = ctx.tuner._accuracy(qf, labels)
    top = float(np.bincount(labels, minlength=ctx.split.classes).max() / len(labels))
    return acc, top


def loop(
    ctx: Context, teachers: dict[int, nn.Module], n: int | None, l2: float, querier: int = 0
) -> dict[str, Any]:
    """The querier's loop with the other hospitals' ``teachers``: accuracy, before, gain."""
    s, x = ctx.split, ctx.x
    own, unl = s.labelled(querier, n), s.unlabelled(querier, n)
    others = [t for i, t in teachers.items() if i != querier]
    labels = plurality(others, x[unl], s.classes) if len(unl) else np.zeros(0, np.int64)
    config = Config("diet-linear", l2=l2)
    before = fit_nonprivate(config, x[own], s.y[own], s.classes, s.seed)
    after = fit_nonprivate(
        config,
        np.concatenate([x[own], x[unl]]),
        np.concatenate([s.y[own], labels]),
        s.classes,
        s.seed,
    )
    score = (x[ctx.score_on], s.y[ctx.score_on])
    a, b = accuracy(after, *score), accuracy(before, *score)
    return {
        "accuracy": a,
        "accuracy_before": b,
        "gain": a - b,
        "labels": len(unl),
        "label_accuracy": float((labels == s.y[unl]).mean()) if len(unl) else None,
    }


def _evaluate(
    ctx: Context,
    n: int | None,
    epsilon: float,
    configs: Sequence[TeacherConfig],
    l2s: Sequence[float],
    methods: Sequence[str],
    querier: int,
) -> dict[tuple[str, int, float | None], dict[str, Any]]:
    """Every (method, teacher config index, l2) outcome on ``ctx``."""
    out: dict[tuple[str, int, float | None], dict[str, Any]] = {}
    s = ctx.split
    for k, c in enumerate(configs):
        t0 = time.perf_counter()
        teachers = {i: train_teacher(s, i, n, ctx.x, epsilon, c) for i in range(s.hospitals)}
        solo = [accuracy(t, ctx.x[ctx.score_on], s.y[ctx.score_on]) for t in teachers.values()]
        train_s = time.perf_counter() - t0
        if "capc-dp-student" in methods:
            t1 = time.perf_counter()
            acc, top = student(ctx, list(teachers.values()))
            out[("capc-dp-student", k, None)] = {
                "accuracy": acc,
                "top_label_share": top,
                "teacher_accuracy": solo,
                "seconds": train_s + time.perf_counter() - t1,
            }
        # At n = all there is no loop (a share's odd record left over is not one).
        if "capc-dp-loop" in methods and n is not None and len(s.unlabelled(querier, n)):
            for l2 in l2s:
                t1 = time.perf_counter()
                r = loop(ctx, teachers, n, l2, querier)
                r["teacher_accuracy"] = solo
                r["seconds"] = train_s + time.perf_counter() - t1
                out[("capc-dp-loop", k, l2)] = r
    return out


def _config_dict(c: TeacherConfig, l2: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"teacher": {"architecture": "diet-linear", **asdict(c)}}
    if l2 is not None:
        out["own_model"] = Config("diet-linear", l2=l2).as_dict()
    return out


def cell(
    s_by_seed: Callable[[int], ScenarioSplit],
    tuning: ScenarioSplit,
    n: int | None,
    epsilon: float,
    seeds: Sequence[int],
    cache: Path | None,
    log: Log,
    methods: Sequence[str] = METHODS,
    querier: int = 0,
    contexts: dict[tuple[str, int], Context] | None = None,
) -> list[Row]:
    """One (scenario, n, eps) cell of the DP-teacher methods: tuned on ``tuning`` (at most
    :data:`MAX_GRID` configurations each), then a row per seed of ``s_by_seed``."""
    contexts = {} if contexts is None else contexts
    grid = [(k, l2) for k in range(len(TEACHER_GRID)) for l2 in LOOP_L2]
    if len(grid) > MAX_GRID or len(TEACHER_GRID) > MAX_GRID:
        raise ValueError(f"more than {MAX_GRID} configurations")
    t0 = time.perf_counter()
    tn = tuning.grid_n
    tctx = _context(contexts, tuning, tuning.tuning, cache, log)
    tuned = _evaluate(tctx, tn, epsilon, TEACHER_GRID, LOOP_L2, methods, querier)
    tuning_seconds = time.perf_counter() - t0
    picks: dict[str, tuple[int, float | None, list[Any]]] = {}
    for method in methods:
        scored = [(key, r["accuracy"]) for key, r in tuned.items() if key[0] == method]
        if not scored:
            continue
        best = max(scored, key=lambda kv: -1.0 if kv[1] is None else kv[1])[0]
        picks[method] = (best[1], best[2], [(k[1], k[2], a) for k, a in scored])
        log(f"  tuned {method} {tuning.scenario} n={n} eps={epsilon}: {best} of {scored}")
    rows: list[Row] = []
    for seed in seeds:
        s = s_by_seed(seed)
        ctx = _context(contexts, s, s.test, cache, log)
        for method, (k, l2, scores) in picks.items():
            made = _evaluate(
                ctx, n, epsilon, [TEACHER_GRID[k]], [] if l2 is None else [l2], [method], querier
            )
            r = made[(method, 0, l2)]
            row: Row = {
                "dataset": s.dataset,
                "method": method,
                "scenario": s.scenario,
                "n": s.size(n),
                "epsilon": epsilon,
                "delta": DELTA,
                "seed": seed,
                **r,
                "hyperparameters": _config_dict(TEACHER_GRID[k], l2),
                "accountant": "capc.privacy.dp_training.plan_training (gdp, full-batch DP-SGD)",
                "neighbouring": NEIGHBOURING,
                "bytes_sent": None,
                "queries": QUERIES if method == "capc-dp-student" else r.get("labels"),
                "querier": querier if method == "capc-dp-loop" else None,
                "tuned_on": TUNED_ON,
                "tuning_n": tn,
                "tuning_grid": [
                    {**_config_dict(TEACHER_GRID[kk], ll), "accuracy": a} for kk, ll, a in scores
                ],
                "tuning_seconds": tuning_seconds,
                "central_mode": "library pieces, no services (capc_tuning's student)",
            }
            log(f"{method} {s.scenario} n={row['n']} eps={epsilon} seed={seed}: {row['accuracy']}")
            rows.append(row)
    return rows


#: Per (dataset, seed, queries): the synthetic queries as the student reads them (batch
#: statistics) and as the teachers do; the same for every scenario of a seed.
_QUERIES: dict[tuple[str, int, int], tuple[torch.Tensor, NDArray[np.float32]]] = {}


def _context(
    contexts: dict[tuple[str, int], Context],
    s: Split,
    score_on: NDArray[np.int64],
    cache: Path | None,
    log: Log,
) -> Context:
    """The split's :class:`Context` (one per scenario, size and seed)."""
    key = (f"{getattr(s, 'scenario', 'iid')}-{getattr(s, 'grid_n', None)}", s.seed)
    if key not in contexts:
        contexts[key] = Context(s, score_on, cache, log)
    return contexts[key]


# -- scenario baselines -------------------------------------------------------------------
def baseline_cell(
    method: str,
    s_by_seed: Callable[[int], ScenarioSplit],
    tuning: ScenarioSplit,
    n: int | None,
    epsilon: float | None,
    seeds: Sequence[int],
    cache: Path | None,
    log: Log,
    architectures: Sequence[str] | None,
) -> list[Row]:
    """``alone`` or ``dp_fedavg`` in a scenario: tuned on ``tuning`` with the baselines'
    grid, then a row per seed (``alone``: hospital 0's accuracy, the mean in
    ``mean_accuracy``; tuned on hospital 0's for ``small-querier``)."""
    t0 = time.perf_counter()
    configs = baselines.grid(tuning.dataset, method, architectures)
    scores = []
    for c in configs:
        extra: dict[str, Any] = {} if epsilon is None else {"epsilon": epsilon}
        r = baselines.METHODS[method](
            tuning, tuning.grid_n, c, score_on=tuning.tuning, cache=cache, **extra
        )
        score = (
            r["accuracy"]
            if tuning.scenario == "small-querier"
            else r["mean_accuracy"]
            if "mean_accuracy" in r
            else r["accuracy"]
        )
        scores.append(float(score))
        log(f"  tune {method} {tuning.scenario} eps={epsilon}: {c.as_dict()} -> {scores[-1]:.3f}")
    best = int(np.argmax(scores))
    tuning_seconds = time.perf_counter() - t0
    rows = []
    for seed in seeds:
        s = s_by_seed(seed)
        extra = {} if epsilon is None else {"epsilon": epsilon}
        row = baselines.METHODS[method](s, n, configs[best], score_on=s.test, cache=cache, **extra)
        row |= {
            "scenario": s.scenario,
            "tuned_on": TUNED_ON,
            "tuning_n": tuning.grid_n,
            "tuning_accuracy": scores[best],
            "tuning_grid": [c.as_dict() for c in configs],
            "tuning_grid_accuracy": scores,
            "tuning_seconds": tuning_seconds,
            "labelled_per_hospital": list(s.counts),
        }
        log(f"{method} {s.scenario} n={row['n']} eps={epsilon} seed={seed}: {row['accuracy']:.3f}")
        rows.append(row)
    return rows


# -- today's CaPC loop (partitioned teachers, GNMax) in a scenario -----------------------------
def partitioned_loop(s: ScenarioSplit, n: int | None, log: Log) -> list[Row]:
    """Today's ``capc-loop`` for querier 0 in central mode (:meth:`.tuner.Tuner.loop`
    at the grid's shipped rule, not tuned): each other hospital's
    ``teachers_per_hospital`` heads on disjoint parts of all its labelled records vote
    through GNMax with sigma the shipped share of every hospital's teachers; priced by
    the guardian's accountant at every eps. Rows scored on ``s.test``."""
    from experiments.side_by_side.capc_runs import teachers_per_hospital
    from experiments.side_by_side.capc_tuning import SIGMA_SHARES, gnmax
    from experiments.side_by_side.tuner import Candidate

    t0 = time.perf_counter()
    m = teachers_per_hospital(s.dataset, min(s.counts[1:]))
    c = Candidate(
        "shipped: gnmax, retrain", m, gnmax(s.hospitals * m, share=SIGMA_SHARES[s.dataset])
    )
    from experiments.side_by_side.capc_runs import image_ensemble

    tuner = Tuner(s, QUERIES, log, s.test)
    # Hospital 0's teachers never vote in its own loop: built at its own size's rule (m
    # heads would leave them a record each), the others' at theirs.
    own_m = teachers_per_hospital(s.dataset, s.size(n))
    tuner._ensembles[(s.size(n), m)] = [
        image_ensemble(s, s.size(n), own_m if i == 0 else m, i, tuner.base)
        for i in range(s.hospitals)
    ]
    made = tuner.loop(s.size(n), [c])
    rows = []
    for r in made:
        if r["method"] != "capc-loop":
            continue
        rows.append(
            {
                "dataset": s.dataset,
                "method": "capc-loop",
                "scenario": s.scenario,
                "n": s.size(n),
                "epsilon": r["epsilon"],
                "delta": DELTA,
                "seed": s.seed,
                "accuracy": r["tuning_accuracy"],
                "accuracy_before": r["accuracy_alone"],
                "gain": r["gain"],
                "queries": r["queries"],
                "labels": r["labels"],
                "label_accuracy": r["label_accuracy"],
                "hyperparameters": {"teachers_per_hospital": m, "mechanism": c.mechanism},
                "accountant": "the guardian's ledger accountant (gdp), rounds admitted by worst case",
                "bytes_sent": None,
                "configuration": c.name,
                "tuned_on": "not tuned: the grid's shipped rule (capc_runs)",
                "central_mode": "capc_tuning.Tuner.loop (library pieces, no services)",
                "seconds": time.perf_counter() - t0,
            }
        )
    return rows
