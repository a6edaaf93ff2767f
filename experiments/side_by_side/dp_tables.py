"""capc with DP-trained teachers on a table dataset (breast-cancer; issue 52, scenario d),
in central mode on the pieces the services use.

Each hospital trains ONE teacher on its ``n`` labelled rows: a linear model on the rows
standardised by the public rows (:func:`.training.inputs` ``linear``), full-batch
DP-SGD (:func:`capc.learning.dp_sgd.train`) at the record
:func:`capc.privacy.dp_training.plan_training` makes for (eps, 1e-5), charged once;
its answers are post-processing, so a query's label is the plain plurality of the
teachers (:func:`capc.learning.hospital.majority`). What is trained on the labels is
what the student service trains for a table task (:class:`.table_tuning.TableTuner`):

* ``capc-dp-student``: an MLP from scratch on :data:`QUERIES` generated ``beta`` rows
  (the DIET student's table queries) labelled by every hospital's teacher;
* ``capc-dp-pate-public``: the same student on the split's public rows;
* ``capc-dp-loop`` (n < all): hospital 0's MLP from scratch on its labelled rows and
  its unlabelled rows labelled by the OTHER hospitals' teachers; ``accuracy_before``
  is the same MLP on its labelled rows alone.

Tuning: the teachers' DP-SGD configuration (:data:`.dp_capc.TEACHER_GRID`) is picked
per (n, eps) by the teachers' mean accuracy on the scenario's pseudo consortium
(:func:`.scenarios.tuning_split`: split.tuning dealt into pseudo shares, scored on
split.public, which no teacher reads); the students and the loop train as the service
does (not tuned). The pseudo shares are 19 rows a hospital, so this tuning is weak.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.learning import dp_sgd
from capc.learning.hospital import majority
from capc.privacy.dp_training import plan_training
from capc.privacy.randomness import SecureRandom
from experiments.side_by_side.capc_runs import CapcConfig
from experiments.side_by_side.dp_capc import DELTA, NEIGHBOURING, TEACHER_GRID, TeacherConfig
from experiments.side_by_side.scenarios import TUNED_ON, ScenarioSplit
from experiments.side_by_side.training import build_model, inputs, predict

#: Generated rows the table student labels (free: post-processing of DP models).
QUERIES = 4096
METHODS = ("capc-dp-student", "capc-dp-pate-public", "capc-dp-loop")
Log = Callable[[str], None]
Row = dict[str, Any]


def train_teacher(
    s: ScenarioSplit,
    i: int,
    n: int | None,
    x: NDArray[np.float32],
    epsilon: float,
    c: TeacherConfig,
) -> nn.Module:
    """Hospital ``i``'s DP-trained linear model on its labelled rows' (N, F) ``x[idx]``."""
    idx = s.labelled(i, n)
    record = plan_training(epsilon, DELTA, c.steps, c.clip, len(idx))
    model = build_model("linear", x.shape[1:], s.classes, seed=1000 * s.seed + i, private=True)
    rng = SecureRandom.from_seed(f"side-by-side-dp-table-{s.scenario}-{s.seed}-{i}-{epsilon}")
    return dp_sgd.train(model, x[idx], s.y[idx], record, lr=c.lr, rng=rng, seed=s.seed)


class Standardised:
    """Raw (N, F) rows -> the teachers' inputs (standardised by the public rows)."""

    def __init__(self, s: ScenarioSplit) -> None:
        pub = s.x[s.public].reshape(len(s.public), -1)
        self.mean, self.std = pub.mean(0), np.maximum(pub.std(0), 1e-6)

    def __call__(self, rows: NDArray[np.float32]) -> NDArray[np.float32]:
        out: NDArray[np.float32] = ((rows - self.mean) / self.std).astype(np.float32)
        return out


def plurality(
    teachers: Sequence[nn.Module], x: NDArray[np.float32], classes: int
) -> NDArray[np.int64]:
    return majority(np.stack([predict(t, x) for t in teachers], axis=1), classes)


def tune(
    t: ScenarioSplit, n: int | None, epsilon: float, log: Log
) -> tuple[TeacherConfig, list[float]]:
    """The teacher configuration whose pseudo teachers score best on ``t.tuning``."""
    x = inputs(t, "linear", None)
    scores = []
    for c in TEACHER_GRID:
        accs = []
        for i in range(t.hospitals):
            m = train_teacher(t, i, n, x, epsilon, c)
            accs.append(float((predict(m, x[t.tuning]) == t.y[t.tuning]).mean()))
        scores.append(float(np.mean(accs)))
        log(f"  tune dp table teacher n={n} eps={epsilon}: {asdict(c)} -> {scores[-1]:.3f}")
    return TEACHER_GRID[int(np.argmax(scores))], scores


def rows_for(
    s: ScenarioSplit,
    n: int | None,
    epsilon: float,
    config: TeacherConfig,
    methods: Sequence[str],
    log: Log,
) -> list[Row]:
    """One reported seed's rows of ``methods`` at ``config``, scored on ``s.test``."""
    from experiments.side_by_side.table_tuning import TableTuner

    t0 = time.perf_counter()
    x = inputs(s, "linear", None)
    teachers = [train_teacher(s, i, n, x, epsilon, config) for i in range(s.hospitals)]
    solo = [float((predict(t, x[s.test]) == s.y[s.test]).mean()) for t in teachers]
    train_s = time.perf_counter() - t0
    tuner = TableTuner(s, QUERIES, log, s.test, config=CapcConfig())
    view = Standardised(s)
    base: Row = {
        "dataset": s.dataset,
        "scenario": s.scenario,
        "n": s.size(n),
        "epsilon": epsilon,
        "delta": DELTA,
        "seed": s.seed,
        "teacher_accuracy": solo,
        "hyperparameters": {"teacher": {"architecture": "linear", **asdict(config)}},
        "accountant": "capc.privacy.dp_training.plan_training (gdp, full-batch DP-SGD)",
        "neighbouring": NEIGHBOURING,
        "bytes_sent": None,
        "tuned_on": TUNED_ON,
        "central_mode": "library pieces, no services (table_tuning's student and loop)",
    }
    out: list[Row] = []
    for method in methods:
        t1 = time.perf_counter()
        if method in ("capc-dp-student", "capc-dp-pate-public"):
            rows = tuner.query_rows() if method == "capc-dp-student" else s.x[s.public]
            labels = plurality(teachers, view(rows), s.classes)
            acc = tuner._accuracy(torch.from_numpy(np.asarray(rows, np.float32)), labels)
            extra: Row = {"accuracy": acc, "queries": len(rows)}
        elif method == "capc-dp-loop":
            own, unl = s.labelled(0, n), s.unlabelled(0, n)
            if not len(unl):
                continue
            labels = plurality(teachers[1:], x[unl], s.classes)
            epochs = CapcConfig().table_loop_epochs
            before = tuner._mlp(s.x[own], s.y[own], epochs)
            after = tuner._mlp(
                np.concatenate([s.x[own], s.x[unl]]), np.concatenate([s.y[own], labels]), epochs
            )
            a = _score(after, s)
            b = _score(before, s)
            extra = {
                "accuracy": a,
                "accuracy_before": b,
                "gain": a - b,
                "labels": len(unl),
                "label_accuracy": float((labels == s.y[unl]).mean()),
                "queries": len(unl),
                "querier": 0,
            }
        else:
            raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
        row = {**base, "method": method, **extra, "seconds": train_s + time.perf_counter() - t1}
        log(f"{method} {s.dataset} n={row['n']} eps={epsilon} seed={s.seed}: {row['accuracy']}")
        out.append(row)
    return out


def _score(model: nn.Module, s: ScenarioSplit) -> float:
    with torch.no_grad():
        got = model.eval()(torch.from_numpy(s.x[s.test])).argmax(1).numpy()
    return float((got == s.y[s.test]).mean())


def cell(
    s_by_seed: Callable[[int], ScenarioSplit],
    tuning: ScenarioSplit,
    n: int | None,
    epsilon: float,
    seeds: Sequence[int],
    cache: Path | None,
    log: Log,
    methods: Sequence[str] = METHODS,
) -> list[Row]:
    """One (n, eps) cell: the teachers tuned on ``tuning``, then a row per seed and method."""
    t0 = time.perf_counter()
    config, scores = tune(tuning, tuning.grid_n, epsilon, log)
    tuning_s = time.perf_counter() - t0
    rows = []
    for seed in seeds:
        for r in rows_for(s_by_seed(seed), n, epsilon, config, methods, log):
            r["tuning_n"] = tuning.grid_n
            r["tuning_grid"] = [
                {**asdict(c), "accuracy": a} for c, a in zip(TEACHER_GRID, scores, strict=True)
            ]
            r["tuning_seconds"] = tuning_s
            rows.append(r)
    return rows
