"""The central-mode DIET-PATE experiment: does a shared student learn from synthetic queries?

For each seed: hold out a test set (the student's), split the rest into
disjoint hospitals, and build every hospital's teacher from one body
pretrained on synthetic images (its own BatchNorm statistics, its own last
layer). Then, for each query generator and each way of normalising the
queries (the teachers' "original" statistics, or the query batch's
"current" statistics): generate the queries, collect the teachers' votes,
label them with Confident-GNMax until each budget is spent (a
data-independent RDP filter, :mod:`capc.learning.pate`; for plain GNMax also
the exact Gaussian-DP accountant, on the same noise), fit the student's last
layer on the answered queries and test it on the held-out real images.

Results written before the filter stopped their ``rdp`` rows where the
data-dependent epsilon of the votes passed the budget: the number of labels
was then a function of the private votes, not a DP release. Such rows (no
``stopping`` field) are read as superseded: shown marked, never counted
towards the goals (:func:`stopped_data_independently`).

Two references come with it: standard PATE without pretraining (teachers
and student of the same architecture trained from scratch, the same
synthetic queries and noise) and a non-private model on all teacher data.
No services run here; the same teachers and student code serve them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from capc.data.generators import GENERATORS, Recipe
from capc.data.offline import animal_mnist, digits, partition, skewed_partition
from capc.learning.last_layer import fit_batch_standardised, fit_linear
from capc.learning.pate import ACCOUNTANTS, LABELS_BY, ConfidentParams, label_within_budgets
from capc.learning.semi_supervised import self_train_linear
from capc.learning.simclr import PretrainConfig, pretrain
from capc.learning.supervised import fit
from capc.learning.teachers import fit_head_ensemble
from capc.mechanisms import Mechanism
from capc.models.checkpoint import Teacher, save_teacher, weights_sha256
from capc.models.inference import features, logits, run_batches
from capc.models.registry import Classifier, build
from capc.privacy.randomness import SecureRandom

DATASETS = ("animal-mnist", "digits")
STATISTICS = ("original", "current")
#: The student heads that are candidates for the goal (see ``student_accuracies``).
GOAL_HEADS = ("student_accuracy", "student_accuracy_self_trained")
#: Every student head a row reports: the goal's, and the stored-statistics reference.
STUDENT_HEADS = (*GOAL_HEADS, "student_accuracy_stored_statistics")
Log = Callable[[str], None]


def load_images(name: str) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """(N, 1, 28, 28) images in [0, 1] and (N,) classes of an offline dataset."""
    if name == "animal-mnist":
        return animal_mnist()
    if name == "digits":
        return digits(28)
    raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")


@dataclass(frozen=True)
class BodyConfig:
    """The shared body: architecture, width, and its synthetic pretraining."""

    architecture: str = "resnet10"
    width: int = 32
    input_shape: tuple[int, int, int] = (1, 28, 28)
    generators: tuple[str, ...] = ("dead_leaves", "spectral", "fractal")
    pool: int = 12_000
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)

    @property
    def key(self) -> str:
        """A short hash naming the pretrained body in a cache folder."""
        fields = asdict(self)
        if self.pretrain.precision == "fp32":
            # Bodies cached before the option existed keep their names.
            del fields["pretrain"]["precision"]
        text = json.dumps(fields, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


#: Images generated at a time for a pretraining pool: a generator's working memory
#: grows with its batch (16,000 fractals at once took 16 GB), its images do not
#: depend on how their index range is split.
POOL_CHUNK = 1000


def synthetic_pool(config: BodyConfig) -> NDArray[np.float32]:
    """The pretraining images: ``pool`` images split evenly among ``generators``."""
    per = -(-config.pool // len(config.generators))
    return np.concatenate(
        [
            Recipe(g, 10_000 + i, lo, min(POOL_CHUNK, per - lo), config.input_shape).generate()
            for i, g in enumerate(config.generators)
            for lo in range(0, per, POOL_CHUNK)
        ]
    )[: config.pool]


def pretrained_body(
    config: BodyConfig,
    cache: Path | None,
    num_classes: int,
    log: Log,
    device: str,
    deadline: float | None = None,
) -> Classifier:
    """The body pretrained on synthetic images, read from ``cache`` when it is there.

    Its initial weights come from ``config.pretrain.seed`` too, so a body is a
    function of its configuration (and of the thread count, which orders the
    floating-point sums), not of whatever drew from torch's generator before.
    With a ``cache`` the pretraining is resumable (its state is kept beside the
    body until it ends); ``deadline`` (``time.monotonic()`` seconds) pauses it
    there with :class:`capc.learning.simclr.PretrainingPausedError`.
    """
    model = build(
        config.architecture,
        config.input_shape,
        num_classes,
        config.width,
        seed=config.pretrain.seed,
    ).to(device)
    path = None if cache is None else cache / f"body-{config.key}.pt"
    if path is not None and path.exists():
        state = torch.load(path, map_location=device, weights_only=True)
        model.features.load_state_dict(state)
        log(f"pretrained body read from {path}")
        return model.eval()
    log(
        f"pretraining {config.architecture} (width {config.width}) on {config.pool} synthetic "
        f"images ({', '.join(config.generators)}), {config.pretrain.steps} steps"
    )
    state = None if path is None else path.with_suffix(".state.pt")
    if state is not None:
        state.parent.mkdir(parents=True, exist_ok=True)
    elif deadline is not None:
        raise ValueError("a pretraining deadline needs a cache to keep its state in")
    pool = _pool(config, path, deadline is not None)
    pretrain(model, pool, config.pretrain, log, state=state, deadline=deadline)
    if path is not None:
        torch.save(model.features.state_dict(), path)
        path.with_suffix(".pool.npy").unlink(missing_ok=True)
    if state is not None:
        state.unlink(missing_ok=True)
    return model.eval()


def _pool(config: BodyConfig, body: Path | None, pausable: bool) -> NDArray[np.float32]:
    """The synthetic pool; a pretraining that may pause keeps it beside its state, since
    generating 48,000 images costs minutes that each resumed part would pay again."""
    kept = None if body is None else body.with_suffix(".pool.npy")
    if kept is not None and kept.exists():
        pool = np.load(kept)
        if pool.shape == (config.pool, *config.input_shape):
            return np.asarray(pool, dtype=np.float32)
    pool = synthetic_pool(config)
    if kept is not None and pausable:
        np.save(kept, pool)
    return pool


def save_body(path: Path, model: Classifier, config: BodyConfig, half: bool = False) -> None:
    """Write a pretrained body as a model checkpoint whose card says how it was made.

    ``half``: store its floating-point tensors as float16, half the bytes (a body
    shipped in a repository); loading upcasts them, so the body used is the
    float16 rounding of the pretrained one.
    """
    card: dict[str, object] = {
        "kind": "pretrained body",
        "data": f"{config.pool} synthetic images ({', '.join(config.generators)}); no real data",
        "pretraining": {"method": "SimCLR", **config.pretrain.to_dict()},
        "note": "the head is untrained; fit the last layer before use",
        "body_config_key": config.key,
    }
    stored = copy.deepcopy(model).cpu()
    if half:
        card["stored"] = "float16 (the float16 rounding of the pretrained float32 weights)"
        stored = stored.half()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_teacher(
        path,
        Teacher(
            config.architecture,
            config.input_shape,
            model.head.out_features,
            stored,
            card,
            device="cpu",
            width=config.width,
        ),
    )


@dataclass(frozen=True)
class DietConfig:
    """Everything one run of the experiment depends on (recorded with its results)."""

    dataset: str = "animal-mnist"
    teachers: int = 100
    split: str = "iid"
    body: BodyConfig = field(default_factory=BodyConfig)
    generators: tuple[str, ...] = ("gaussian", "spectral", "dead_leaves", "fractal", "mix")
    statistics: tuple[str, ...] = STATISTICS
    epsilons: tuple[float, ...] = (5.0, 10.0, 20.0)
    delta: float = 1e-5
    seeds: tuple[int, ...] = (0, 1, 2)
    queries: int = 1024
    batch: int = 512
    #: Confident-GNMax for 100 teachers; scaled with the teacher count. A sharp test
    #: (small sigma1) keeps weak-consensus queries, the costly ones, from being answered.
    mechanism: ConfidentParams = field(
        default_factory=lambda: ConfidentParams(threshold=60.0, sigma1=20.0, sigma2=10.0)
    )
    #: ``rdp`` (data-independent RDP filter, the default) and ``gdp`` (exact Gaussian DP)
    #: each is a row of its own, on the same labels and noise
    #: (:func:`label_within_budgets`).
    accountants: tuple[str, ...] = ("rdp",)
    #: ``oracle``: the mechanism's plaintext oracle; ``2pc``: the same labels through the
    #: protocol's roles in one process with the real garbled circuit (slower)
    #: (:func:`label_within_budgets`).
    labels_by: str = "oracle"
    test_size: int = 1000
    teacher_l2: float = 1e-2
    student_l2: float = 1e-3
    #: The non-private last-layer reference keeps its own penalty, so a student
    #: penalty chosen for few noisy labels does not lower the upper bound.
    reference_l2: float = 1e-3
    baseline: bool = True
    #: Standard PATE trains every teacher from scratch: a small CNN keeps that affordable.
    baseline_architecture: str = "small-cnn"
    baseline_epochs: int = 30
    upper_bound_epochs: int = 10
    device: str = field(default_factory=lambda: "cuda" if torch.cuda.is_available() else "cpu")

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"unknown dataset {self.dataset!r}; choose from {', '.join(DATASETS)}")
        if self.split not in ("iid", "skewed"):
            raise ValueError(f"split must be iid or skewed, got {self.split!r}")
        unknown = [g for g in self.generators if g not in GENERATORS]
        if unknown:
            raise ValueError(f"unknown generators {unknown}; known: {', '.join(GENERATORS)}")
        if not set(self.statistics) <= set(STATISTICS) or not self.statistics:
            raise ValueError(f"statistics must be some of {', '.join(STATISTICS)}")
        if min(self.teachers, self.queries, self.test_size) < 1 or self.batch < 2 or not self.seeds:
            raise ValueError(
                "need teachers >= 1, queries >= 1, test_size >= 1, batch >= 2 and one seed"
            )
        if min(self.seeds) < 0 or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and >= 0, got {list(self.seeds)}")
        unknown_accountants = [a for a in self.accountants if a not in ACCOUNTANTS]
        if unknown_accountants or not self.accountants:
            raise ValueError(
                f"unknown accountants {unknown_accountants or 'none given'}; "
                f"choose from {', '.join(ACCOUNTANTS)}"
            )
        if self.labels_by not in LABELS_BY:
            raise ValueError(f"labels_by must be one of {', '.join(LABELS_BY)}")
        penalties = (self.teacher_l2, self.student_l2, self.reference_l2)
        if not all(math.isfinite(v) and v >= 0 for v in penalties):
            raise ValueError("the heads' L2 penalties must be finite and >= 0")

    @property
    def params(self) -> ConfidentParams:
        """The mechanism at this run's teacher count."""
        return self.mechanism.scaled(self.teachers)

    def voting(self, classes: int) -> Mechanism:
        """The mechanism object at this run's teacher count, over ``classes`` classes: it
        counts the votes and labels them, as a networked round does."""
        return self.params.mechanism(classes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mechanism_at_teachers"] = asdict(self.params)
        return d


def split_hospitals(
    y: NDArray[np.int64], config: DietConfig, seed: int
) -> tuple[NDArray[np.int64], list[NDArray[np.int64]], NDArray[np.int64]]:
    """Test indices, each hospital's indices, and all hospitals' indices in the order the
    non-private reference reads them (a function of ``seed``, the split and the counts)."""
    order = np.random.default_rng([seed, 1]).permutation(len(y))
    # The test set stays in random order: its features use the statistics of batches of
    # ``config.batch`` images, and the offline data sets are sorted by class.
    test, rest = order[: config.test_size], order[config.test_size :]
    if config.split == "iid":
        parts = [rest[p] for p in partition(len(rest), config.teachers, seed)]
        # i.i.d. hospitals drawn from a random order: one after another they are mixed already
        train = np.concatenate(parts)
    else:
        parts = [rest[p] for p in skewed_partition(y[rest], config.teachers, seed=seed)]
        # Label-skewed hospitals one after another would give the reference's batches a
        # few hospitals' classes each, and their own statistics would blur those classes.
        train = np.random.default_rng([seed, 2]).permutation(np.concatenate(parts))
    return test, parts, train


def query_recipe(config: DietConfig, seed: int, generator: int, draw: int = 0) -> Recipe:
    """The queries of ``config.generators[generator]`` for ``seed``.

    ``draw`` > 0 names further, independent query sets of the same generator
    (for diagnostics that vary the queries alone); the experiment asks draw 0.
    """
    if not 0 <= generator < len(config.generators) < 100 or draw < 0:
        raise ValueError(f"no generator {generator} or draw {draw} in this configuration")
    return Recipe(
        config.generators[generator],
        1000 * seed + 100 * draw + generator,
        0,
        config.queries,
        config.body.input_shape,
    )


def noise_stream(seed: int, draw: int = 0) -> SecureRandom:
    """The GNMax noise for ``seed``; ``draw`` > 0 names further, independent draws
    (for diagnostics that vary the noise alone); the experiment uses draw 0."""
    return SecureRandom.from_seed(f"diet-{seed}" if draw == 0 else f"diet-{seed}-draw-{draw}")


def _accuracy(pred: torch.Tensor, y: NDArray[np.int64]) -> float:
    return float((pred.argmax(dim=1).numpy() == y).mean())


def student_accuracies(
    body: Classifier,
    query_features: torch.Tensor,
    test_features: torch.Tensor,
    y_test: NDArray[np.int64],
    l2: float,
    batch: int,
    labels: NDArray[np.int64],
) -> dict[str, float]:
    """Test accuracies (fractions of ``y_test``) of the student's heads on the released labels.

    ``student_accuracy``: the head fitted on the answered queries, each batch of
    ``batch`` test images standardised by its own statistics, as the body's current
    statistics do (:func:`fit_batch_standardised`); ``student_accuracy_self_trained``:
    the same head self-trained on the unanswered queries too (post-processing: no
    privacy cost); ``student_accuracy_stored_statistics``: the first head with the
    queries' statistics instead (what :func:`fit_linear` gives), a reference only.
    """
    nan = float("nan")
    answered = labels >= 0
    if answered.sum() < 2 or len(np.unique(labels[answered])) < 2:
        return dict.fromkeys(STUDENT_HEADS, nan)
    classes = body.head.out_features
    head = fit_batch_standardised(
        query_features[answered], labels[answered], classes, l2=l2, balanced=True
    )
    selfish = self_train_linear(query_features, labels, classes, l2=l2)

    def accuracy(h: torch.nn.Module, current: bool) -> float:
        out = run_batches(h, h, test_features, current_statistics=current, batch=batch)
        return _accuracy(out, y_test)

    return {
        "student_accuracy": accuracy(head, True),
        "student_accuracy_self_trained": accuracy(selfish, True),
        "student_accuracy_stored_statistics": accuracy(head, False),
    }


def _label_rows(
    hist: NDArray[np.float64],
    truth: NDArray[np.int64],
    config: DietConfig,
    rng: SecureRandom,
    student: Callable[[NDArray[np.int64]], dict[str, float]],
    base: dict[str, Any],
) -> list[dict[str, Any]]:
    rows = []
    for run in label_within_budgets(
        hist,
        config.voting(hist.shape[1]),
        config.epsilons,
        config.delta,
        rng,
        num_teachers=config.teachers,
        accountants=config.accountants,
        labels_by=config.labels_by,
    ):
        answered = run.answered
        rows.append(
            {
                **base,
                "accountant": run.accountant,
                "epsilon": run.budget,
                "processed": run.processed,
                "answered": int(answered.sum()),
                "label_accuracy": float((run.labels[answered] == truth[answered]).mean())
                if answered.any()
                else float("nan"),
                **student(run.labels),
                "epsilon_spent": run.epsilon,
                "order": run.order,
                # a side figure: it decided nothing about the release
                "sanitised_data_dependent_epsilon": run.sanitised_data_dependent_epsilon,
                "stopping": DATA_INDEPENDENT,
            }
        )
    return rows


def _rows_per_labelling(config: DietConfig) -> int:
    return len(config.epsilons) * len(config.accountants)


def run_seed(
    config: DietConfig,
    seed: int,
    body: Classifier,
    x: NDArray[np.float32],
    y: NDArray[np.int64],
    log: Log,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Every DIET and baseline row of one seed, and that seed's reference accuracies."""
    classes = body.head.out_features
    test, parts, train = split_hospitals(y, config, seed)
    t0 = time.perf_counter()
    ensemble = fit_head_ensemble(
        body,
        x,
        y,
        parts,
        architecture=config.body.architecture,
        width=config.body.width,
        l2=config.teacher_l2,
    )
    test_feats = features(body, x[test], current_statistics=True, batch=config.batch)
    voting = config.voting(classes)
    test_votes = voting.summed_votes(
        ensemble.predict(x[test], current_statistics=False, batch=config.batch)
    )
    refs: dict[str, float] = {
        "teacher_ensemble_accuracy": float((test_votes.argmax(1) == y[test]).mean()),
        "non_private_last_layer_accuracy": _accuracy(
            fit_linear(
                features(body, x[train], current_statistics=True, batch=config.batch),
                y[train],
                classes,
                l2=config.reference_l2,
            )(test_feats).detach(),
            y[test],
        ),
    }
    log(
        f"seed {seed}: {config.teachers} teachers fitted in {time.perf_counter() - t0:.0f} s; "
        f"their noiseless majority gets {refs['teacher_ensemble_accuracy']:.3f} of the test set"
    )
    rows: list[dict[str, Any]] = []
    rng = noise_stream(seed)
    baseline_teachers: list[torch.nn.Module] = []
    if config.baseline:
        baseline_teachers, refs["non_private_full_training_accuracy"] = _scratch_models(
            config, x, y, parts, train, test, seed
        )
    for gi, generator in enumerate(config.generators):
        queries = query_recipe(config, seed, gi).generate()
        qf = features(body, queries, current_statistics=True, batch=config.batch)
        for stats in config.statistics:
            t1 = time.perf_counter()
            preds = (
                ensemble.predict_features(qf)
                if stats == "current"
                else ensemble.predict(queries, current_statistics=False, batch=config.batch)
            )
            hist = voting.summed_votes(preds)
            truth = hist.argmax(1).astype(np.int64)
            base = {"method": "diet", "generator": generator, "statistics": stats, "seed": seed}
            rows += _label_rows(
                hist,
                truth,
                config,
                rng,
                partial(
                    student_accuracies,
                    body,
                    qf,
                    test_feats,
                    y[test],
                    config.student_l2,
                    config.batch,
                ),
                base,
            )
            log(
                f"seed {seed} {generator:<11} {stats:<8} votes in {time.perf_counter() - t1:.0f} s: "
                + ", ".join(
                    f"{r['accountant']} eps {r['epsilon']:g}: {r['answered']} labels, "
                    f"student {r['student_accuracy']:.3f}"
                    for r in rows[-_rows_per_labelling(config) :]
                )
            )
        if baseline_teachers:
            rows += _baseline_rows(
                config, baseline_teachers, queries, x, y, test, rng, seed, generator
            )
            log(
                f"seed {seed} {generator:<11} baseline: "
                + ", ".join(
                    f"{r['accountant']} eps {r['epsilon']:g}: student {r['student_accuracy']:.3f}"
                    for r in rows[-_rows_per_labelling(config) :]
                )
            )
    return rows, refs


def _scratch_models(
    config: DietConfig,
    x: NDArray[np.float32],
    y: NDArray[np.int64],
    parts: Sequence[NDArray[np.int64]],
    train: NDArray[np.int64],
    test: NDArray[np.int64],
    seed: int,
) -> tuple[list[torch.nn.Module], float]:
    """Teachers trained from scratch on their own data, and the non-private model on all of it."""
    classes = int(y.max()) + 1

    def fresh(init: int) -> torch.nn.Module:
        # Seeded apart from the global generator, which a pretraining run moves
        # and a run that reads the body from its cache does not.
        arch, shape = config.baseline_architecture, config.body.input_shape
        return build(arch, shape, classes, seed=init).to(config.device)

    teachers = [
        fit(fresh(seed * 1000 + i), x[p], y[p], epochs=config.baseline_epochs, seed=seed * 1000 + i)
        for i, p in enumerate(parts)
    ]
    full = fit(fresh(seed), x[train], y[train], epochs=config.upper_bound_epochs, seed=seed)
    return teachers, _accuracy(logits(full, x[test]), y[test])


def _baseline_rows(
    config: DietConfig,
    teachers: Sequence[torch.nn.Module],
    queries: NDArray[np.float32],
    x: NDArray[np.float32],
    y: NDArray[np.int64],
    test: NDArray[np.int64],
    rng: SecureRandom,
    seed: int,
    generator: str,
) -> list[dict[str, Any]]:
    """Standard PATE without pretraining: scratch teachers (their own statistics) label the
    same queries; the student is trained from scratch on the answers."""
    classes = int(y.max()) + 1
    preds = np.stack([logits(t, queries).argmax(dim=1).numpy() for t in teachers], axis=1)
    hist = config.voting(classes).summed_votes(preds)

    def student(labels: NDArray[np.int64]) -> dict[str, float]:
        # A network trained from scratch: no frozen body to self-train or standardise a head on.
        accuracy = dict.fromkeys(STUDENT_HEADS, float("nan"))
        answered = labels >= 0
        if answered.sum() < 2:
            return accuracy
        model = fit(
            build(config.baseline_architecture, config.body.input_shape, classes).to(config.device),
            queries[answered],
            labels[answered],
            epochs=config.baseline_epochs,
            seed=seed,
        )
        accuracy["student_accuracy"] = _accuracy(logits(model, x[test]), y[test])
        return accuracy

    base = {
        "method": "pate-scratch",
        "generator": generator,
        "statistics": "original",
        "seed": seed,
    }
    return _label_rows(hist, hist.argmax(1).astype(np.int64), config, rng, student, base)


def _accountant(entry: dict[str, Any]) -> str:
    # Results written before the gdp accountant existed were all rdp.
    return str(entry.get("accountant", "rdp"))


#: The ``stopping`` of a row whose number of labels no data-dependent quantity decided.
DATA_INDEPENDENT = "data-independent"

#: The summary's per-seed means of the side figure; old results have the first.
SIDE_FIGURES = ("sanitised_epsilon", "sanitised_data_dependent_epsilon")


def stopped_data_independently(entry: dict[str, Any]) -> bool:
    """Whether a row or summary entry's stop was a DP release.

    ``gdp`` always stopped on the budget alone. ``rdp`` rows written before the
    data-independent filter (no ``stopping`` field) stopped where the data-dependent
    epsilon of the noiseless votes passed the budget: not a DP release.
    """
    return _accountant(entry) == "gdp" or entry.get("stopping") == DATA_INDEPENDENT


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard deviation over seeds of each (method, generator, statistics,
    accountant, epsilon)."""
    groups: dict[tuple[str, str, str, str, float], list[dict[str, Any]]] = {}
    for r in rows:
        group = (r["method"], r["generator"], r["statistics"], _accountant(r), r["epsilon"])
        groups.setdefault(group, []).append(r)
    table = []
    for (method, generator, stats, accountant, eps), rs in groups.items():
        entry: dict[str, Any] = {
            "method": method,
            "generator": generator,
            "statistics": stats,
            "accountant": accountant,
            "epsilon": eps,
            "seeds": len(rs),
        }
        stopping = {r.get("stopping") for r in rs}
        if stopping != {None}:
            # One rule per group; a mix would be summarised under the weaker one.
            entry["stopping"] = (
                DATA_INDEPENDENT
                if stopping == {DATA_INDEPENDENT} or accountant == "gdp"
                else "data-dependent"
            )
        # A side figure is averaged only where the rows report it, so a saved summary
        # is remade exactly from its rows.
        side = [k for k in SIDE_FIGURES if any(k in r for r in rs)]
        for key in ("answered", "label_accuracy", *STUDENT_HEADS, *side):
            vals = np.array([r.get(key, np.nan) for r in rs], dtype=np.float64)
            entry[key] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
            entry[f"{key}_std"] = (
                float(np.nanstd(vals)) if np.isfinite(vals).any() else float("nan")
            )
        table.append(entry)
    return table


def goals(table: Sequence[dict[str, Any]], epsilons: Sequence[float]) -> dict[str, Any]:
    """The issue's two measurable goals, checked on the summary table.

    Current statistics beat original ones for a (noise-like generator,
    accountant, epsilon) triple when their student is more accurate, or when original statistics gave
    no student (NaN: no labels, or labels of one class only, which fit no
    classifier and leave a constant guess) and current ones did.

    Only entries whose labels were a DP release count
    (:func:`stopped_data_independently`).
    """
    diet = {
        (t["generator"], t["statistics"], _accountant(t), t["epsilon"]): t
        for t in table
        if t["method"] == "diet" and stopped_data_independently(t)
    }
    pairs = []
    for g in ("gaussian", "spectral"):
        for accountant in ACCOUNTANTS:
            for eps in epsilons:
                cur = diet.get((g, "current", accountant, eps))
                orig = diet.get((g, "original", accountant, eps))
                if cur is None or orig is None:
                    continue
                c, o = float(cur["student_accuracy"]), float(orig["student_accuracy"])
                beats = bool(np.isfinite(c) and (not np.isfinite(o) or c > o))
                pairs.append(
                    {
                        "generator": g,
                        "accountant": accountant,
                        "epsilon": eps,
                        "current": c,
                        "original": o,
                        "beats": beats,
                    }
                )
    # either head counts: self-training is post-processing of the released labels
    candidates = [
        {
            **t,
            "accountant": _accountant(t),
            "student": key,
            "accuracy": t[key],
            "accuracy_std": t[f"{key}_std"],
        }
        for t in diet.values()
        if t["epsilon"] <= 10
        for key in GOAL_HEADS
        if np.isfinite(t[key])
    ]
    best = max(candidates, key=lambda t: t["accuracy"], default=None)
    return {
        "current_beats_original_on_noise": {
            "pairs": pairs,
            "holds": bool(pairs) and all(p["beats"] for p in pairs),
        },
        "best_student_at_eps_10": None
        if best is None
        else {
            k: best[k]
            for k in (
                "generator",
                "statistics",
                "accountant",
                "epsilon",
                "student",
                "accuracy",
                "accuracy_std",
                "answered",
            )
        },
        "reaches_75_percent": best is not None and best["accuracy"] >= 0.75,
    }


def run(config: DietConfig, cache: Path | None = None, log: Log = print) -> dict[str, Any]:
    """The whole experiment: rows per seed, the summary table, references and goals (JSON-safe)."""
    start = time.perf_counter()
    torch.manual_seed(0)
    x, y = load_images(config.dataset)
    classes = int(y.max()) + 1
    body = pretrained_body(config.body, cache, classes, log, config.device)
    rows: list[dict[str, Any]] = []
    refs: list[dict[str, float]] = []
    for seed in config.seeds:
        seed_rows, seed_refs = run_seed(config, seed, body, x, y, log)
        rows += seed_rows
        refs.append(seed_refs)
    table = summarise(rows)
    references = {
        k: {
            "mean": float(np.mean([r[k] for r in refs])),
            "std": float(np.std([r[k] for r in refs])),
        }
        for k in refs[0]
    }
    return {
        "experiment": "diet",
        "config": config.to_dict(),
        # The configuration does not name the body bit for bit (thread count and
        # device order the floating-point sums of pretraining); its digest does.
        "body_sha256": weights_sha256(body.features),
        "references": references,
        "table": table,
        "goals": goals(table, config.epsilons),
        "rows": rows,
        "seconds": time.perf_counter() - start,
        "device": config.device,
    }


def format_table(result: dict[str, Any], markdown: bool = False) -> str:
    """The summary, one line per (method, generator, statistics, eps): fixed-width or markdown.

    Accuracies are fractions of the test set, mean +- standard deviation over seeds.
    ``eps`` is the budget (nats, at the run's delta), which every row's labels stay
    within by a data-independent accountant; ``sanitised dd eps`` is the side figure
    of ``rdp`` rows (mean over seeds, nats): the data-dependent epsilon released with
    smooth-sensitivity noise, which decided nothing. An accountant marked ``*``
    stopped on the data-dependent epsilon (results saved before the filter).
    """
    head: tuple[str, ...] = ("method", "generator", "statistics", "accountant", "eps")
    head += ("labels", "label acc")
    head += ("student acc", "self-trained", "stored stats", "sanitised dd eps")

    def cell(t: dict[str, Any], key: str) -> str:
        # Results written before a head was reported lack its column.
        return f"{t.get(key, math.nan):.3f} +- {t.get(key + '_std', math.nan):.3f}"

    def side(t: dict[str, Any]) -> str:
        value = float(t.get("sanitised_data_dependent_epsilon", math.nan))
        return f"{value:.2f}" if math.isfinite(value) else "-"

    rows = [
        (
            t["method"],
            t["generator"],
            t["statistics"],
            _accountant(t) + ("" if stopped_data_independently(t) else "*"),
            f"{t['epsilon']:g}",
            f"{t['answered']:.0f}",
            f"{t['label_accuracy']:.3f}",
            *(cell(t, key) for key in STUDENT_HEADS),
            side(t),
        )
        for t in sorted(
            result["table"],
            key=lambda t: (
                t["method"],
                t["generator"],
                t["statistics"],
                _accountant(t),
                t["epsilon"],
            ),
        )
    ]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        lines.append("")
    else:
        widths = [max(len(r[i]) for r in [head, *rows]) + 2 for i in range(len(head))]
        lines = [
            "".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in [head, *rows]
        ]
    notes = [f"{k}: {v['mean']:.3f} +- {v['std']:.3f}" for k, v in result["references"].items()]
    if not all(stopped_data_independently(t) for t in result["table"]):
        notes.append(
            "accountant*: stopped where the data-dependent epsilon of the votes passed the "
            "budget (saved before the data-independent filter): not a DP release, superseded, "
            "left out of the goals"
        )
    g = result["goals"]
    best = g["best_student_at_eps_10"]
    if best is not None:
        notes.append(
            f"best student at eps <= 10: {best['accuracy']:.3f} +- {best['accuracy_std']:.3f} "
            f"({best['generator']}, {best['statistics']} statistics, "
            f"{best.get('accountant', 'rdp')} accountant, eps {best['epsilon']:g}, "
            f"{'self-trained head' if best['student'].endswith('self_trained') else 'head'})"
        )
    noise = g["current_beats_original_on_noise"]
    # a run of one kind of statistics only has nothing to compare: neither yes nor no
    verdict = "yes" if noise["holds"] else "no" if noise["pairs"] else "not measured"
    notes.append(f"current statistics beat original ones on noise-like queries: {verdict}")
    # in markdown the lines after the table are a list
    return "\n".join(lines + [f"- {n}" if markdown else n for n in notes])


def load_result(path: Path) -> dict[str, Any]:
    """A saved experiment result, its goals recomputed from its summary table."""
    result: dict[str, Any] = json.loads(path.read_text())
    result["goals"] = goals(result["table"], result["config"]["epsilons"])
    return result


def quick(config: DietConfig) -> DietConfig:
    """A small version of ``config`` for smoke tests (seconds, not minutes)."""
    body = replace(
        config.body,
        width=4,
        pool=512,
        pretrain=replace(config.body.pretrain, steps=3, batch=32),
    )
    return replace(
        config,
        teachers=5,
        body=body,
        seeds=config.seeds[:1],
        queries=256,
        batch=128,
        test_size=200,
        baseline_epochs=1,
        upper_bound_epochs=1,
    )
