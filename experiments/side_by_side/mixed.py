"""Mixed models (issue 52, scenario c): hospitals of one consortium with different models.

The iid animal-mnist split at n = all; hospital ``i`` runs
:data:`.scenarios.MIXED_ARCHITECTURES`\\ ``[i]``: two a DIET last layer (``diet-linear``:
a linear head on the shipped body's features), two a small CNN trained from scratch
(``small-cnn``), one a closed model (``onnx``: the shipped body and a head exported as
one ONNX graph, run by onnxruntime through :func:`capc.models.foreign.load_onnx` as the
answerer runs a foreign teacher; it only answers, so it cannot join FedAvg or retrain).

What each hospital can do, and the rows it gets (``hospital``: "hospital i"):

* ``alone``: the best model it can train on its own records, non-private, tuned over
  :data:`ALONE_GRID` of its architecture, simple models included (a linear model on the
  standardised pixels for the CNN hospitals). The closed hospital's is its vendor's
  model (a DIET head on its records, tuned the same way), exported and scored as ONNX.
* ``dp_fedavg``: DP-FedAvg (Flower + Opacus, :mod:`.fedavg`) over the hospitals of its
  architecture only (:data:`FEDERATIONS`); the closed hospital has none.
* ``capc-dp-loop`` (hospitals that can retrain, not the closed one): its own model (its
  alone pick) on its records plus the 1,000 public records labelled by the plurality of
  the OTHER four hospitals' DP-trained teachers.
* ``capc-dp-pate-public`` (no hospital: a model every hospital may receive, the
  closed one as an ONNX file): a DIET head on the public records labelled by all five
  teachers' plurality.

Teachers, each charged once as capc charges a DP-trained teacher (full-batch DP-SGD,
:func:`capc.privacy.dp_training.plan_training`, replace-one): the DIET hospitals a DIET
head; the closed hospital the same, exported whole to ONNX and attested (the guardian
cannot look inside a closed model: it records the hospital's attested (eps, delta) as
for any DP-trained teacher, docs/privacy.md); the CNN hospitals a linear model on
their standardised pixels, because full-batch DP-SGD of the small CNN costs 7.0 s a step
on the machine these rows were made on (1,348 images, 1 thread; 100-300 steps a
teacher), and capc charges only full-batch DP-SGD exactly. Labels from DP-trained
teachers are post-processing: nothing more is charged per query.

Tuning (the issue's rule): every choice on the pseudo consortium of
:func:`.scenarios.tuning_split` (split.tuning, disjoint from every seed's shares),
scored on split.public: alone's configuration per architecture (the mean over that
architecture's hospitals), each teacher kind's DP-SGD configuration per eps (the
teachers' mean accuracy), DP-FedAvg's per federation and eps. The loop and the student
train on the public records, so they are not scored there: the loop reuses its
hospital's alone pick, the student the DIET alone pick's l2.
"""

from __future__ import annotations

import tempfile
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
from capc.models import load_teacher
from capc.models.foreign import load_onnx
from capc.models.inference import features, recalibrate
from capc.models.onnx_export import export_onnx
from capc.privacy.dp_training import plan_training
from capc.privacy.randomness import SecureRandom
from experiments.side_by_side import baselines, fedavg
from experiments.side_by_side.data import Split
from experiments.side_by_side.dp_capc import DELTA, NEIGHBOURING, TEACHER_GRID, TeacherConfig
from experiments.side_by_side.scenarios import MIXED_ARCHITECTURES, TUNED_ON, ScenarioSplit
from experiments.side_by_side.training import (
    FEATURE_BATCH,
    Config,
    accuracy,
    build_model,
    fit_nonprivate,
    inputs,
    predict,
)
from services.commands.teacher_cli import SHIPPED_BODY

SCENARIO = "mixed-models"
CLOSED = "onnx"
#: Alone's grid per architecture (non-private; ``linear``: the standardised pixels).
ALONE_GRID: dict[str, tuple[Config, ...]] = {
    "diet-linear": tuple(Config("diet-linear", l2=l2) for l2 in (1e-4, 1e-3, 1e-2, 1e-1)),
    "small-cnn": (
        Config("small-cnn", lr=1e-3, epochs=15, batch=32),
        Config("small-cnn", lr=3e-3, epochs=15, batch=64),
        Config("linear", l2=1e-2),
        Config("linear", l2=1e-1),
    ),
    CLOSED: tuple(Config("diet-linear", l2=l2) for l2 in (1e-4, 1e-3, 1e-2, 1e-1)),
}
#: The inputs each architecture's DP-trained teacher reads (see the module docstring).
TEACHER_INPUTS = {"diet-linear": "diet-linear", "small-cnn": "linear", CLOSED: "diet-linear"}
#: The DP-SGD grid of the pixel teachers (a linear model on 784 standardised pixels
#: takes smaller steps than a head on the body's features).
PIXEL_TEACHER_GRID = (
    TeacherConfig(100, 0.1),
    TeacherConfig(300, 0.1),
    TeacherConfig(100, 0.5),
    TeacherConfig(300, 0.5),
)
#: Teacher grids by the inputs a teacher reads.
TEACHER_GRIDS = {"diet-linear": TEACHER_GRID, "linear": PIXEL_TEACHER_GRID}
#: The loop keeps a bought label only where the querier's own (alone) model predicts the
#: same class: measured without it (seed 1, eps 10) the others' labels (plurality of
#: weaker DP teachers) pulled every querier 0.01-0.03 below its own model alone.
AGREEMENT = True
#: Who can federate with whom: one model architecture a federation.
FEDERATIONS: dict[str, tuple[int, ...]] = {
    arch: tuple(i for i, a in enumerate(MIXED_ARCHITECTURES) if a == arch)
    for arch in ("diet-linear", "small-cnn")
}
Log = Callable[[str], None]
Row = dict[str, Any]


def hospital_name(i: int) -> str:
    return f"hospital {i}"


def architecture(i: int) -> str:
    return MIXED_ARCHITECTURES[i]


# -- the closed model ---------------------------------------------------------------------
class Standardise(nn.Module):
    """(N, D) -> (N, D): shift and scale by fixed (D,) ``mean`` and ``std``."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: NDArray[np.float32], std: NDArray[np.float32]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.from_numpy(mean.astype(np.float32)))
        self.register_buffer("std", torch.from_numpy(std.astype(np.float32)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class ClosedBuilder:
    """Makes a closed model: the shipped body (BatchNorm statistics of the public
    records, as :func:`.training.body_features`) + their standardisation + a head on the
    body's features, exported as one ONNX graph over images, loaded back through
    :func:`load_onnx`. Its votes are what onnxruntime computes, not torch."""

    def __init__(self, s: Split, folder: Path) -> None:
        self.body = load_teacher(SHIPPED_BODY).model
        recalibrate(self.body, s.x[s.public], batch=FEATURE_BATCH)
        raw = features(self.body, s.x[s.public], batch=FEATURE_BATCH).numpy()
        self.mean = raw.mean(0).astype(np.float32)
        self.std = np.maximum(raw.std(0), 1e-6).astype(np.float32)
        self.folder = folder
        self.shape = tuple(int(d) for d in s.x.shape[1:])
        self.count = 0

    def __call__(self, head: nn.Module) -> Callable[[NDArray[np.float32]], NDArray[np.int64]]:
        """The ONNX model of ``head`` as a function of (N, *image) -> (N,) classes."""
        whole = nn.Sequential(self.body.features, Standardise(self.mean, self.std), head).eval()
        self.count += 1
        path = export_onnx(whole, self.shape, self.folder / f"closed-{self.count}.onnx")
        teacher = load_onnx(path)

        def classes(x: NDArray[np.float32]) -> NDArray[np.int64]:
            out = [teacher.outputs(x[i : i + 256]) for i in range(0, len(x), 256)]
            got: NDArray[np.int64] = np.concatenate(out).argmax(1).astype(np.int64)
            return got

        return classes


# -- pieces ---------------------------------------------------------------------------------
def _predictor(
    model: nn.Module, arch: str, s: Split, cache: Path | None
) -> Callable[[NDArray[np.int64]], NDArray[np.int64]]:
    """(N,) record indices -> (N,) classes, for a torch model reading ``arch``'s inputs."""
    x = inputs(s, arch, cache)
    return lambda idx: predict(model, x[idx])


def fit_alone(
    s: Split, i: int, config: Config, cache: Path | None, closed: ClosedBuilder | None
) -> Callable[[NDArray[np.int64]], NDArray[np.int64]]:
    """Hospital ``i``'s non-private model on its labelled records (the closed one's as ONNX)."""
    x = inputs(s, config.architecture, cache)
    idx = s.labelled(i, None)
    model = fit_nonprivate(config, x[idx], s.y[idx], s.classes, 1000 * s.seed + i)
    if architecture(i) == CLOSED and closed is not None:
        run = closed(model)
        return lambda ix: run(s.x[ix])
    return _predictor(model, config.architecture, s, cache)


def fit_teacher(
    s: Split,
    i: int,
    epsilon: float,
    config: TeacherConfig,
    cache: Path | None,
    closed: ClosedBuilder | None,
) -> Callable[[NDArray[np.int64]], NDArray[np.int64]]:
    """Hospital ``i``'s DP-trained teacher (full-batch DP-SGD at ``epsilon``, one charge)."""
    arch = TEACHER_INPUTS[architecture(i)]
    x = inputs(s, arch, cache)
    idx = s.labelled(i, None)
    record = plan_training(epsilon, DELTA, config.steps, config.clip, len(idx))
    model = build_model(arch, x.shape[1:], s.classes, seed=1000 * s.seed + i, private=True)
    rng = SecureRandom.from_seed(f"side-by-side-mixed-teacher-{s.seed}-{i}-{epsilon}")
    model = dp_sgd.train(model, x[idx], s.y[idx], record, lr=config.lr, rng=rng, seed=s.seed)
    if architecture(i) == CLOSED and closed is not None:
        run = closed(model)
        return lambda ix: run(s.x[ix])
    return _predictor(model, arch, s, cache)


Predict = Callable[[NDArray[np.int64]], NDArray[np.int64]]


def plurality(
    teachers: Sequence[Predict], idx: NDArray[np.int64], classes: int
) -> NDArray[np.int64]:
    """(N,) plurality of the teachers' classes of records ``idx`` (ties: lower class)."""
    return majority(np.stack([t(idx) for t in teachers], axis=1), classes)


def score(p: Predict, s: Split, on: NDArray[np.int64]) -> float:
    return float((p(on) == s.y[on]).mean())


def fit_on(
    s: Split,
    config: Config,
    idx: NDArray[np.int64],
    labels: NDArray[np.int64],
    seed: int,
    cache: Path | None,
) -> Predict:
    """A non-private ``config`` model on records ``idx`` with ``labels`` (any source)."""
    x = inputs(s, config.architecture, cache)
    model = fit_nonprivate(config, x[idx], labels, s.classes, seed)
    return _predictor(model, config.architecture, s, cache)


def federate(
    s: Split,
    members: Sequence[int],
    config: Config,
    epsilon: float,
    on: NDArray[np.int64],
    cache: Path | None,
) -> dict[str, Any]:
    """DP-FedAvg over ``members``' labelled records: accuracy on ``on`` and its accounting."""
    x = inputs(s, config.architecture, cache)
    parts = [(x[s.labelled(i, None)], s.y[s.labelled(i, None)]) for i in members]
    run = fedavg.run(config, parts, s.classes, seed=s.seed, epsilon=epsilon, delta=DELTA)
    if max(run.spent) > epsilon * (1 + 1e-6):
        raise RuntimeError(f"DP-FedAvg spent {max(run.spent)} > {epsilon}")
    return {
        "accuracy": accuracy(run.model, x[on], s.y[on]),
        "epsilon_spent": max(run.spent),
        "noise_multiplier": run.noise_multiplier,
        "bytes_sent": run.bytes_sent,
        "seconds": run.seconds,
    }


# -- tuning ---------------------------------------------------------------------------------
def tune_alone(
    t: ScenarioSplit, cache: Path | None, log: Log
) -> dict[str, tuple[Config, list[float]]]:
    """Per architecture: the alone configuration with the best mean accuracy of that
    architecture's pseudo hospitals on ``t.tuning``, and every configuration's score."""
    out: dict[str, tuple[Config, list[float]]] = {}
    for arch, grid in ALONE_GRID.items():
        members = [i for i in range(t.hospitals) if architecture(i) == arch]
        scores = []
        for c in grid:
            # Scored as torch here: the ONNX export is exact up to float rounding and
            # tuning picks by a mean over hospitals.
            accs = [score(fit_alone(t, i, c, cache, None), t, t.tuning) for i in members]
            scores.append(float(np.mean(accs)))
            log(f"  tune alone {arch}: {c.as_dict()} -> {scores[-1]:.3f}")
        out[arch] = (grid[int(np.argmax(scores))], scores)
    return out


def tune_teachers(
    t: ScenarioSplit, epsilon: float, cache: Path | None, log: Log
) -> dict[str, tuple[TeacherConfig, list[float]]]:
    """Per teacher input kind: the DP-SGD configuration whose teachers score best (mean
    over the pseudo hospitals of that kind) on ``t.tuning``."""
    out: dict[str, tuple[TeacherConfig, list[float]]] = {}
    for kind in sorted(set(TEACHER_INPUTS.values())):
        members = [i for i in range(t.hospitals) if TEACHER_INPUTS[architecture(i)] == kind]
        scores = []
        grid = TEACHER_GRIDS[kind]
        for c in grid:
            accs = [score(fit_teacher(t, i, epsilon, c, cache, None), t, t.tuning) for i in members]
            scores.append(float(np.mean(accs)))
            log(f"  tune teacher {kind} eps={epsilon}: {asdict(c)} -> {scores[-1]:.3f}")
        out[kind] = (grid[int(np.argmax(scores))], scores)
    return out


def tune_fedavg(
    t: ScenarioSplit, epsilon: float, cache: Path | None, log: Log
) -> dict[str, tuple[Config, list[float]]]:
    """Per federation: the baselines' DP-FedAvg grid points of its architecture, scored
    by the federated model's accuracy on ``t.tuning``."""
    out: dict[str, tuple[Config, list[float]]] = {}
    for arch, members in FEDERATIONS.items():
        grid = baselines.grid(t.dataset, "dp_fedavg", (arch,))
        scores = []
        for c in grid:
            scores.append(federate(t, members, c, epsilon, t.tuning, cache)["accuracy"])
            log(f"  tune dp_fedavg {arch} eps={epsilon}: {c.as_dict()} -> {scores[-1]:.3f}")
        out[arch] = (grid[int(np.argmax(scores))], scores)
    return out


# -- rows -----------------------------------------------------------------------------------
def _row(s: ScenarioSplit, method: str, epsilon: float | None, hospital: int | None) -> Row:
    return {
        "dataset": s.dataset,
        "method": method,
        "scenario": SCENARIO,
        "n": s.size(None),
        "epsilon": epsilon,
        "delta": DELTA,
        "seed": s.seed,
        "hospital": None if hospital is None else hospital_name(hospital),
        "architecture": "diet-linear (student)" if hospital is None else architecture(hospital),
        "tuned_on": TUNED_ON,
    }


class Mixed:
    """One reported seed's consortium: alone's models, then per eps its teachers, loops,
    student and federations."""

    def __init__(
        self,
        s: ScenarioSplit,
        picks: dict[str, tuple[Config, list[float]]],
        cache: Path | None,
        folder: Path,
        log: Log,
    ) -> None:
        self.s, self.picks, self.cache, self.log = s, picks, cache, log
        self.closed = ClosedBuilder(s, folder)
        self._alone: dict[int, Predict] = {}

    def alone(self, i: int) -> Predict:
        """Hospital ``i``'s alone model (its pick), made once per consortium."""
        if i not in self._alone:
            config = self.picks[architecture(i)][0]
            self._alone[i] = fit_alone(self.s, i, config, self.cache, self.closed)
        return self._alone[i]

    def alone_rows(self) -> list[Row]:
        s, rows = self.s, []
        for i in range(s.hospitals):
            t0 = time.perf_counter()
            config, scores = self.picks[architecture(i)]
            acc = score(self.alone(i), s, s.test)
            row = _row(s, "alone", None, i) | {
                "accuracy": acc,
                "hyperparameters": config.as_dict(),
                "tuning_grid": [c.as_dict() for c in ALONE_GRID[architecture(i)]],
                "tuning_grid_accuracy": scores,
                "scored_through": "onnxruntime" if architecture(i) == CLOSED else "torch",
                "accountant": "none",
                "bytes_sent": 0,
                "seconds": time.perf_counter() - t0,
            }
            self.log(f"alone mixed h{i} ({architecture(i)}) seed={s.seed}: {acc:.3f}")
            rows.append(row)
        return rows

    def capc_rows(
        self, epsilon: float, teachers: dict[str, tuple[TeacherConfig, list[float]]]
    ) -> list[Row]:
        s, rows = self.s, []
        t0 = time.perf_counter()
        made = {
            i: fit_teacher(
                s, i, epsilon, teachers[TEACHER_INPUTS[architecture(i)]][0], self.cache, self.closed
            )
            for i in range(s.hospitals)
        }
        solo = [score(made[i], s, s.test) for i in range(s.hospitals)]
        train_s = time.perf_counter() - t0
        public = s.public
        common = {
            "teacher_accuracy": solo,
            "teachers": {
                hospital_name(i): {
                    "inputs": TEACHER_INPUTS[architecture(i)],
                    "closed_onnx": architecture(i) == CLOSED,
                    **asdict(teachers[TEACHER_INPUTS[architecture(i)]][0]),
                }
                for i in range(s.hospitals)
            },
            "teacher_tuning_accuracy": {k: v[1] for k, v in teachers.items()},
            "accountant": "capc.privacy.dp_training.plan_training (gdp, full-batch DP-SGD), "
            "charged once per teacher; the labels are post-processing",
            "neighbouring": NEIGHBOURING,
            "bytes_sent": None,
            "queries": len(public),
            "central_mode": "library pieces, no services; the closed teacher through onnxruntime",
        }
        for i in range(s.hospitals):
            if architecture(i) == CLOSED:
                continue
            t1 = time.perf_counter()
            others = [made[j] for j in range(s.hospitals) if j != i]
            labels = plurality(others, public, s.classes)
            own = s.labelled(i, None)
            config = self.picks[architecture(i)][0]
            # The querier keeps a bought label where its own model agrees (see AGREEMENT).
            mine = self.alone(i)(public)
            keep = mine == labels if AGREEMENT else np.ones(len(public), dtype=bool)
            model = fit_on(
                s,
                config,
                np.concatenate([own, public[keep]]),
                np.concatenate([s.y[own], labels[keep]]),
                1000 * s.seed + i,
                self.cache,
            )
            acc = score(model, s, s.test)
            rows.append(
                _row(s, "capc-dp-loop", epsilon, i)
                | common
                | {
                    "accuracy": acc,
                    "querier": i,
                    "labels": len(public),
                    "label_accuracy": float((labels == s.y[public]).mean()),
                    "kept": int(keep.sum()),
                    "kept_label_accuracy": float((labels[keep] == s.y[public][keep]).mean()),
                    "agreement_filter": AGREEMENT,
                    "hyperparameters": {"own_model": config.as_dict()},
                    "seconds": train_s + time.perf_counter() - t1,
                }
            )
            self.log(f"capc-dp-loop mixed h{i} eps={epsilon} seed={s.seed}: {acc:.3f}")
        t1 = time.perf_counter()
        labels = plurality(list(made.values()), public, s.classes)
        config = Config("diet-linear", l2=self.picks["diet-linear"][0].l2)
        student = fit_on(s, config, public, labels, 1000 * s.seed, self.cache)
        acc = score(student, s, s.test)
        rows.append(
            _row(s, "capc-dp-pate-public", epsilon, None)
            | common
            | {
                "accuracy": acc,
                "labels": len(public),
                "label_accuracy": float((labels == s.y[public]).mean()),
                "hyperparameters": {"student": config.as_dict()},
                "seconds": train_s + time.perf_counter() - t1,
            }
        )
        self.log(f"capc-dp-pate-public mixed eps={epsilon} seed={s.seed}: {acc:.3f}")
        return rows

    def fedavg_rows(
        self, epsilon: float, picks: dict[str, tuple[Config, list[float]]]
    ) -> list[Row]:
        s, rows = self.s, []
        for arch, members in FEDERATIONS.items():
            config, scores = picks[arch]
            r = federate(s, members, config, epsilon, s.test, self.cache)
            for i in members:
                rows.append(
                    _row(s, "dp_fedavg", epsilon, i)
                    | r
                    | {
                        "federation": [hospital_name(j) for j in members],
                        "hyperparameters": config.as_dict(),
                        "tuning_grid": [
                            c.as_dict() for c in baselines.grid(s.dataset, "dp_fedavg", (arch,))
                        ],
                        "tuning_grid_accuracy": scores,
                        "accountant": "opacus-rdp",
                    }
                )
            self.log(f"dp_fedavg mixed {arch} eps={epsilon} seed={s.seed}: {r['accuracy']:.3f}")
        return rows


def run(
    s_by_seed: Callable[[int], ScenarioSplit],
    tuning: ScenarioSplit,
    epsilons: Sequence[float],
    seeds: Sequence[int],
    cache: Path | None,
    log: Log,
    save: Callable[[list[Row]], None],
    methods: Sequence[str] = ("baselines", "capc-dp"),
) -> None:
    """Every mixed-models row: tuned on ``tuning``, then per eps (in the order given)
    every seed, each (eps, seed)'s rows handed to ``save`` as soon as they are made."""
    with tempfile.TemporaryDirectory(prefix="mixed-onnx-") as tmp:
        t0 = time.perf_counter()
        picks = tune_alone(tuning, cache, log)
        alone_s = time.perf_counter() - t0
        consortia: dict[int, Mixed] = {}
        for e in epsilons:
            t1 = time.perf_counter()
            teachers = tune_teachers(tuning, e, cache, log) if "capc-dp" in methods else {}
            feds = tune_fedavg(tuning, e, cache, log) if "baselines" in methods else {}
            tuning_s = time.perf_counter() - t1
            for seed in seeds:
                if seed not in consortia:
                    consortia[seed] = Mixed(s_by_seed(seed), picks, cache, Path(tmp), log)
                    if "baselines" in methods:
                        save(_tag(consortia[seed].alone_rows(), alone_s))
                m = consortia[seed]
                rows = []
                if "capc-dp" in methods:
                    rows += m.capc_rows(e, teachers)
                if "baselines" in methods:
                    rows += m.fedavg_rows(e, feds)
                save(_tag(rows, alone_s + tuning_s))


def _tag(rows: list[Row], tuning_seconds: float) -> list[Row]:
    return [r | {"tuning_seconds": tuning_seconds, "tuning_n": None} for r in rows]
