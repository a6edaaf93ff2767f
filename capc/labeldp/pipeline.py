"""One label-DP training run with its canary audit: data, public body, method, row.

A run (what ``capc labeldp alibi|rr|pate-fm`` and experiments/labeldp_table.py
do): split an offline dataset into a training pool and a held-out test set;
plant canaries (records with a random wrong label, :mod:`capc.audit.canaries`)
in the training labels; train a body self-supervised on the pool's images
(free under label-DP: features are public; cached); train with the method at
its epsilon; report test accuracy, the method's provable epsilon, and the
empirical epsilon the canary attack certifies on the released model.

Models: ALIBI and randomized response fine-tune the whole network (the
public body plus a new head), as the paper trains its whole model; PATE-FM
fits FixMatch heads over the frozen body (:mod:`capc.labeldp.pate_fm`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch.nn import functional

from capc.audit import canaries as canary_audit
from capc.audit.canaries import Canaries
from capc.data.offline import animal_mnist, digits
from capc.labeldp import alibi, pate_fm, rr
from capc.labeldp.training import TrainConfig
from capc.learning.fixmatch import (
    FixMatchConfig,
    ProjectedClassifier,
    Projection,
    ViewBank,
    head_module,
    view_bank,
)
from capc.learning.randaugment import StrongAugmentation, WeakAugmentation, strong, weak
from capc.learning.simclr import PretrainConfig, pretrain
from capc.mechanisms import from_config
from capc.models import build
from capc.models.inference import logits as model_logits
from capc.models.registry import Classifier
from capc.privacy import accountants
from capc.privacy.randomness import SecureRandom

DATASETS = ("digits", "animal-mnist")
METHODS = ("alibi", "rr", "pate-fm")
Log = Callable[[str], None]


@dataclass(frozen=True)
class DataConfig:
    """``dataset`` (digits at 8x8, or animal-mnist at 28x28), at most ``subset`` records of
    it, ``test`` of them held out; ``canaries`` training records get a random wrong label."""

    dataset: str = "digits"
    subset: int | None = None
    test: float = 0.2
    canaries: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        if not 0.0 < self.test < 1.0 or self.canaries < 0:
            raise ValueError("test is a fraction in (0, 1) and canaries a count >= 0")
        if self.subset is not None and self.subset < 20:
            raise ValueError(f"subset must be at least 20 records, got {self.subset}")


@dataclass(frozen=True)
class PublicBodyConfig:
    """The public body: ``architecture`` of ``width`` trained by SimCLR for ``steps``."""

    architecture: str = "small-cnn"
    width: int = 32
    steps: int = 300
    batch: int = 256
    seed: int = 0


@dataclass(frozen=True)
class CanarySplit:
    """Images ``x`` (N, C, H, W), the labels trained on ``y`` (canaries planted), the true
    labels ``truth``, and the ``train``/``test`` index sets; ``canaries`` in ``train``."""

    x: NDArray[np.float32]
    y: NDArray[np.int64]
    truth: NDArray[np.int64]
    train: NDArray[np.int64]
    test: NDArray[np.int64]
    canaries: Canaries
    classes: int


def load(config: DataConfig) -> CanarySplit:
    """The dataset split, with canaries planted among the training records."""
    x, y = digits(8) if config.dataset == "digits" else animal_mnist()
    rng = np.random.default_rng(config.seed)
    if config.subset is not None and config.subset < len(x):
        keep = np.sort(rng.permutation(len(x))[: config.subset])
        x, y = x[keep], y[keep]
    order = rng.permutation(len(x))
    held = max(1, round(config.test * len(x)))
    test, train = np.sort(order[:held]), np.sort(order[held:])
    if config.canaries > len(train) // 2:
        raise ValueError(
            f"{config.canaries} canaries are more than half the {len(train)} training records"
        )
    classes = int(y.max()) + 1
    chosen = np.sort(rng.choice(train, config.canaries, replace=False))
    planted, canaries = canary_audit.plant(y, classes, chosen, rng)
    return CanarySplit(x, planted, y.astype(np.int64), train, test, canaries, classes)


def _simclr_view(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return strong(weak(x, gen), gen, StrongAugmentation(ops=1, cutout=0.3))


def _digest(x: NDArray[np.float32]) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()[:12]


def public_body(
    split: CanarySplit, config: PublicBodyConfig, cache: Path | None = None, log: Log | None = None
) -> Classifier:
    """A body trained by SimCLR on the training pool's images (no label is read), from
    ``cache`` when a body of the same configuration and pool is there."""
    pool = split.x[split.train]
    key = hashlib.sha256(
        json.dumps([asdict(config), _digest(pool)], sort_keys=True).encode()
    ).hexdigest()[:16]
    path = None if cache is None else cache / f"labeldp-body-{key}.pt"
    model = build(
        config.architecture, tuple(pool.shape[1:]), split.classes, config.width, seed=config.seed
    )
    if path is not None and path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    batch = min(config.batch, len(pool))
    pretrain(
        model,
        pool,
        PretrainConfig(steps=config.steps, batch=batch, lr=2e-3, seed=config.seed),
        log,
        view=_simclr_view,
    )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path)
    return model.eval()


def _probabilities(model: torch.nn.Module, x: NDArray[np.float32]) -> NDArray[np.float64]:
    out = model_logits(model, x) if len(x) else torch.zeros((0, 1))
    return functional.softmax(out.double(), dim=1).numpy()


def _row(
    method: str,
    split: CanarySplit,
    claimed: float,
    delta: float,
    accuracy: float,
    probabilities: NDArray[np.float64],
    released: NDArray[np.int64] | None,
    started: float,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    audit = canary_audit.audit(split.canaries, probabilities, released, delta=delta)
    return {
        "method": method,
        "epsilon": claimed,
        "delta": delta,
        "accuracy": accuracy,
        "canaries": len(split.canaries),
        "audit": audit.to_dict(),
        "flagged": audit.exceeds(claimed)
        or any(
            isinstance(a, dict) and a.get("refuting_lower", 0.0) > claimed
            for a in (extra.get("release_audit"), extra.get("support_audit"))
        ),
        "seconds": time.perf_counter() - started,
        **extra,
    }


def _finetuned(body: Classifier, classes: int, seed: int) -> Classifier:
    model = copy.deepcopy(body)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.head = torch.nn.Linear(model.dim, classes)
    return model


def _canary_positions(split: CanarySplit) -> NDArray[np.int64]:
    """Where each canary sits among the training records."""
    return np.searchsorted(split.train, split.canaries.index).astype(np.int64)


def run_alibi(
    split: CanarySplit,
    body: Classifier,
    epsilon: float,
    config: TrainConfig,
    rng: SecureRandom,
    *,
    released: NDArray[np.float64] | None = None,
    train_scale: float | None = None,
) -> dict[str, Any]:
    """ALIBI at ``epsilon``: the labels released on its grid with exact discrete Laplace
    noise (:func:`capc.labeldp.alibi.release`). ``released`` replaces the noisy vectors
    (label units) and ``train_scale`` the scale the trainer assumes: tests build broken
    mechanisms with them, and the claim stays that of ``epsilon``. Three audits: the
    model's (``audit``), the released vectors' own at the likelihood ratio's extreme
    (``release_audit``, exact) and their floating-point support (``support_audit``,
    which refutes any float-noise release and never guesses on the grid)."""
    started = time.perf_counter()
    tr = split.train
    g = alibi.grid(epsilon)
    scale = g.scale
    noisy = (
        alibi.noisy_labels(split.y[tr], split.classes, epsilon, rng)
        if released is None
        else released
    )
    model = alibi.train_alibi(
        _finetuned(body, split.classes, config.seed),
        split.x[tr],
        noisy,
        scale if train_scale is None else train_scale,
        config,
    )
    acc = float(
        (_probabilities(model, split.x[split.test]).argmax(1) == split.truth[split.test]).mean()
    )
    probs = _probabilities(model, split.x[split.canaries.index])
    claimed = alibi.label_event(epsilon).epsilon
    c = split.canaries
    vectors = noisy[_canary_positions(split)]
    odds = alibi.log_odds(vectors, c.planted, c.alternative, scale)
    # The ratio's extreme is the grid's exact epsilon 2s/t <= claimed; a hair under it
    # so that the rounding of the float ratio cannot hide a vector that reaches it.
    release = canary_audit.audit_scores(c, odds, float(g.epsilon) * (1 - 1e-9))
    # At the scale a float sampler would have used for this claim (what the old ALIBI did).
    support = canary_audit.audit_support(c, vectors, scale)
    return _row(
        "alibi",
        split,
        claimed,
        0.0,
        acc,
        probs,
        None,
        started,
        {
            "laplace_scale": scale,
            "grid": g.to_dict(),
            "release_audit": release.to_dict(),
            "support_audit": support.to_dict(),
        },
    )


def run_rr(
    split: CanarySplit, body: Classifier, epsilon: float, config: TrainConfig, rng: SecureRandom
) -> dict[str, Any]:
    """Randomized response at ``epsilon``, then supervised fine-tuning on the noisy labels.
    Two audits: the model's and the released labels' own."""
    started = time.perf_counter()
    tr = split.train
    noisy = rr.randomize(split.y[tr], split.classes, epsilon, rng)
    model = rr.train_rr(
        _finetuned(body, split.classes, config.seed), split.x[tr], noisy, split.classes, config
    )
    acc = float(
        (_probabilities(model, split.x[split.test]).argmax(1) == split.truth[split.test]).mean()
    )
    probs = _probabilities(model, split.x[split.canaries.index])
    release = canary_audit.audit(split.canaries, None, noisy[_canary_positions(split)])
    return _row(
        "rr",
        split,
        rr.event(epsilon).epsilon,
        0.0,
        acc,
        probs,
        None,
        started,
        {
            "keep_probability": rr.keep_probability(epsilon, split.classes),
            "release_audit": release.to_dict(),
        },
    )


@dataclass(frozen=True)
class PoolFeatures:
    """The pool's view bank through the frozen body, and the projection for new images."""

    bank: ViewBank
    projection: Projection
    body: Classifier


def pool_features(split: CanarySplit, body: Classifier, seed: int = 0) -> PoolFeatures:
    """Features of the training pool and of its weak and strong views (computed once)."""
    bank, proj = view_bank(body.features, split.x[split.train], dim=64, seed=seed)
    return PoolFeatures(bank, proj, body)


@dataclass(frozen=True)
class PateFmSettings:
    """PATE-FM's knobs in fractions of the ensemble, so they scale with ``teachers``:
    ``sigma``, ``sigma1`` and ``threshold`` are multiplied by the number of teachers
    (``sigma1`` 0: plain GNMax, no threshold test). Every noise is raised, where needed,
    until ``min_queries`` queries fit the budget; at most ``queries`` are asked. Both rules
    read only epsilon, delta and these constants: never the data."""

    teachers: int = 100
    sigma: float = 0.4
    sigma1: float = 0.3
    threshold: float = 0.5
    queries: int | None = None
    min_queries: int = 1
    selection: str = "prototypes"
    delta: float = 1e-5
    accountant: str = "gdp"
    teacher: FixMatchConfig = field(
        default_factory=lambda: FixMatchConfig(steps=200, unlabelled_ratio=8)
    )
    student: FixMatchConfig = field(
        default_factory=lambda: FixMatchConfig(steps=300, unlabelled_ratio=8)
    )

    def mechanism(self, epsilon: float, classes: int) -> dict[str, Any]:
        """The mechanism's configuration in votes at ``epsilon``: the base noise, scaled up
        by the smallest factor that lets ``min_queries`` queries fit."""
        base = self._base()
        mech = from_config(base, classes)
        acct = accountants.make(self.accountant)
        room = acct.max_multiplier(mech.per_query(), self.min_queries, epsilon, self.delta)
        if room >= 1.0:
            return base
        # A Gaussian's loss falls with the square of its noise; a hair more, for rounding.
        factor = (1.0 + 1e-9) / math.sqrt(room)
        return mech.scaled_noise(factor).to_config()

    def _base(self) -> dict[str, Any]:
        t = float(self.teachers)
        if self.sigma1 > 0:
            # A task configuration names the mechanism; capc.mechanisms owns the name.
            from capc.mechanisms.confident_gnmax import ConfidentGNMax

            return {
                "name": ConfidentGNMax.name,
                "sigma": self.sigma * t,
                "sigma1": self.sigma1 * t,
                "threshold": self.threshold * t,
            }
        from capc.mechanisms.gnmax import GNMax

        return {"name": GNMax.name, "sigma": self.sigma * t}


def pate_config(
    epsilon: float, settings: PateFmSettings, seed: int, classes: int
) -> pate_fm.PateFmConfig:
    """The library's configuration for ``settings`` at ``epsilon``."""
    return pate_fm.PateFmConfig(
        epsilon=epsilon,
        mechanism=settings.mechanism(epsilon, classes),
        teachers=settings.teachers,
        delta=settings.delta,
        queries=settings.queries,
        selection=settings.selection,
        accountant=settings.accountant,
        teacher=settings.teacher,
        student=settings.student,
        seed=seed,
    )


def pate_teachers(
    split: CanarySplit, features: PoolFeatures, settings: PateFmSettings, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """PATE-FM's teacher heads (they serve every epsilon)."""
    config = pate_config(1.0, settings, seed, split.classes)
    w, b, _ = pate_fm.train_head_teachers(
        features.bank, np.arange(len(split.train)), split.y[split.train], split.classes, config
    )
    return w, b


def run_pate_fm(
    split: CanarySplit,
    features: PoolFeatures,
    epsilon: float,
    settings: PateFmSettings,
    rng: SecureRandom,
    seed: int = 0,
    teachers: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """PATE-FM at ``epsilon`` (nats, at ``settings.delta``) on the pool's features;
    ``teachers`` from :func:`pate_teachers` with the same settings and seed, or None."""
    started = time.perf_counter()
    config = pate_config(epsilon, settings, seed, split.classes)
    # Pool positions are indices into split.train; the labels are read there.
    pool_labels = split.y[split.train]
    result = pate_fm.label_pool(
        features.bank,
        np.arange(len(split.train)),
        pool_labels,
        split.classes,
        config,
        rng,
        teachers,
    )
    head = head_module(*result.student)
    student = ProjectedClassifier(features.body.features, features.projection, head).eval()
    acc = float(
        (_probabilities(student, split.x[split.test]).argmax(1) == split.truth[split.test]).mean()
    )
    canary_pos = _canary_positions(split)
    probs = _probabilities(student, split.x[split.canaries.index])
    # What the student was told about each canary: its released label, if it was a query.
    released = np.full(len(canary_pos), canary_audit.NO_LABEL, dtype=np.int64)
    asked = {int(q): k for k, q in enumerate(result.queries)}
    for j, p in enumerate(canary_pos):
        if int(p) in asked:
            released[j] = result.labels[asked[int(p)]]
    truth_q = split.truth[split.train][result.queries]
    answered = result.answered
    votes = result.teacher_votes
    return _row(
        "pate-fm",
        split,
        result.epsilon,
        result.delta,
        acc,
        probs,
        released,
        started,
        {
            "teachers": settings.teachers,
            "mechanism": config.mechanism,
            "accountant": result.accountant,
            "queries": len(result.queries),
            "budget_queries": result.budget_queries,
            "answered": int(answered.sum()),
            "label_accuracy": float((result.labels[answered] == truth_q[answered]).mean())
            if answered.any()
            else None,
            "teacher_accuracy": float((votes == truth_q[:, None]).mean()),
            "selection": settings.selection,
        },
    )


def default_train_config(dataset: str, seed: int = 0) -> TrainConfig:
    """ALIBI's and randomized response's optimisation for ``dataset`` (CPU minutes)."""
    return TrainConfig(
        epochs=30 if dataset == "digits" else 15,
        batch=64,
        lr=0.01,
        seed=seed,
        weak=WeakAugmentation(shift=0.125, flip=dataset != "digits"),
    )
