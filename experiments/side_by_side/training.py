"""Training for the side-by-side baselines: inputs per architecture, non-private fitting,
Opacus DP-SGD with its noise multiplier, and scoring.

Every architecture reads one (N, ...) array over all of a split's records, made once
per dataset and without any private record: images raw; the shipped DIET body's
features with its BatchNorm statistics recalibrated on the *public* records and
standardised by the public records' mean and spread; table rows standardised by the
public records. The public records are public by definition, so these transforms cost
no privacy and every method (capc's and the baselines) may use them.

DP models replace BatchNorm by GroupNorm (Opacus's ``ModuleValidator.fix``): a
BatchNorm statistic mixes the records of a batch, which per-record clipping cannot
bound. Non-private models keep BatchNorm.
"""

from __future__ import annotations

import functools
import hashlib
import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from opacus import PrivacyEngine
from opacus.accountants.utils import get_noise_multiplier
from opacus.validators import ModuleValidator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from capc.learning.last_layer import fit_linear
from capc.learning.supervised import fit
from capc.models import build, load_teacher
from capc.models.inference import features, logits, recalibrate
from experiments.side_by_side.data import Split
from services.commands.teacher_cli import SHIPPED_BODY

#: Architectures per dataset kind. ``diet-linear``: a linear head on the shipped body's
#: frozen features; ``linear``: a linear model on the table rows.
ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "animal-mnist": ("small-cnn", "diet-linear"),
    "breast-cancer": ("mlp", "linear"),
}
# Opacus's hooks on a first layer whose inputs need no gradient, and its reminder that an
# experiment's sampling uses torch's ordinary generator: both expected here, per step.
warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
warnings.filterwarnings("ignore", message="Secure RNG turned off", category=UserWarning)

#: Opacus's accountant for every DP baseline (Rényi DP, as its default).
ACCOUNTANT = "rdp"
#: Images per BatchNorm batch when the body's features are computed.
FEATURE_BATCH = 256


@dataclass(frozen=True)
class Config:
    """One point of a tuning grid.

    Either ``l2`` (a closed-form penalised linear head, :func:`fit_linear`; non-private
    only) or ``lr``/``epochs``/``batch`` (Adam). ``epochs``: passes over the records
    (DP-FedAvg: local epochs per round); ``batch``: records per step (DP: the expected
    size of a Poisson batch), capped at the record count; ``clip``: DP-SGD's per-record
    gradient norm bound; ``rounds``: DP-FedAvg's rounds.
    """

    architecture: str
    lr: float | None = None
    epochs: int | None = None
    batch: int | None = None
    clip: float | None = None
    l2: float | None = None
    rounds: int | None = None

    def __post_init__(self) -> None:
        closed = self.l2 is not None
        sgd = None not in (self.lr, self.epochs, self.batch)
        if closed == sgd:
            raise ValueError(f"{self}: give either l2, or lr, epochs and batch")
        if closed and self.architecture not in ("diet-linear", "linear"):
            raise ValueError(f"{self}: l2 fits a linear head; {self.architecture} is not one")

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @property
    def private(self) -> bool:
        return self.clip is not None


def _standardised(x: NDArray[np.float32], public: NDArray[np.int64]) -> NDArray[np.float32]:
    """(N, F) ``x`` flattened, shifted and scaled by the mean and spread of its public rows."""
    flat = x.reshape(len(x), -1)
    mean, std = flat[public].mean(0), flat[public].std(0)
    out: NDArray[np.float32] = ((flat - mean) / np.maximum(std, 1e-6)).astype(np.float32)
    return out


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()[:16]


#: Features already computed in this process, by :func:`_features_key`.
_FEATURES: dict[str, NDArray[np.float32]] = {}


def _features_key(split: Split) -> str:
    """Names the body, the records and which of them are public: what the features depend on."""
    return _digest(SHIPPED_BODY.read_bytes(), split.x.tobytes(), split.public.tobytes())


def body_features(split: Split, cache: Path | None) -> NDArray[np.float32]:
    """(N, D) features of every record of ``split``: the shipped body with BatchNorm
    statistics of the public records, standardised by the public records.

    The same for every seed (the records and the public ones are fixed), so they are
    computed once per process and, under ``cache``, kept in an npz named by the dataset
    and a digest of the body and the records.
    """
    key = _features_key(split)
    if key in _FEATURES:
        return _FEATURES[key]
    path = None if cache is None else cache / f"diet-features-{split.dataset}-{key}.npz"
    if path is not None and path.exists():
        with np.load(path) as stored:
            out: NDArray[np.float32] = np.asarray(stored["features"], dtype=np.float32)
    else:
        body = load_teacher(SHIPPED_BODY).model
        recalibrate(body, split.x[split.public], batch=FEATURE_BATCH)
        out = _standardised(features(body, split.x, batch=FEATURE_BATCH).numpy(), split.public)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, features=out)
    _FEATURES[key] = out
    return out


def inputs(split: Split, architecture: str, cache: Path | None) -> NDArray[np.float32]:
    """The (N, ...) array ``architecture`` reads, over every record of ``split``."""
    if architecture == "diet-linear":
        return body_features(split, cache)
    if architecture in ("linear", "mlp"):
        return _standardised(split.x, split.public)
    if architecture == "small-cnn":
        return split.x
    raise ValueError(f"unknown architecture {architecture!r}; choose from {ARCHITECTURES}")


def build_model(
    architecture: str, shape: tuple[int, ...], classes: int, *, seed: int, private: bool
) -> nn.Module:
    """A fresh model for (B, *shape) inputs; ``private`` swaps BatchNorm for GroupNorm."""
    if architecture in ("diet-linear", "linear"):
        torch.manual_seed(seed)
        return nn.Linear(int(np.prod(shape)), classes)
    model: nn.Module = build(architecture, shape, classes, seed=seed)
    return ModuleValidator.fix(model) if private else model


def fit_nonprivate(
    config: Config, x: NDArray[np.float32], y: NDArray[np.int64], classes: int, seed: int
) -> nn.Module:
    """A non-private model on (n, ...) inputs ``x`` and (n,) labels ``y``."""
    if config.l2 is not None:
        return fit_linear(torch.from_numpy(x), y, classes, l2=config.l2)
    require_sgd(config)
    model = build_model(config.architecture, x.shape[1:], classes, seed=seed, private=False)
    return fit(
        model,
        x,
        y,
        epochs=int(config.epochs or 0),
        batch_size=min(int(config.batch or 0), len(x)),
        lr=float(config.lr or 0.0),
        seed=seed,
        device="cpu",
    )


def require_sgd(config: Config) -> None:
    """Refuse a closed-form configuration where gradient steps are needed."""
    if config.lr is None or config.epochs is None or config.batch is None:
        raise ValueError(f"{config}: this method trains by gradient steps; give lr, epochs, batch")


def steps_per_epoch(records: int, batch: int) -> int:
    """Opacus's Poisson steps per epoch: its sample rate is 1 / this."""
    return math.ceil(records / min(batch, records))


@functools.cache
def noise_multiplier(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The Gaussian noise (std / clip) for which ``steps`` Poisson-sampled steps at
    ``sample_rate`` spend at most (``epsilon``, ``delta``) under Opacus's accountant.

    Remembered: Opacus's search takes seconds, and every hospital of a FedAvg run and
    every seed of a cell asks for the same schedule."""
    if not (epsilon > 0 and 0 < delta < 1 and 0 < sample_rate <= 1 and steps >= 1):
        raise ValueError(
            f"need epsilon > 0, 0 < delta < 1, 0 < sample rate <= 1 and steps >= 1; got "
            f"{epsilon}, {delta}, {sample_rate}, {steps}"
        )
    return float(
        get_noise_multiplier(
            target_epsilon=epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant=ACCOUNTANT,
        )
    )


class PrivateTrainer:
    """Opacus DP-SGD (Adam) on one party's (n, ...) records, for a fixed number of epochs
    decided up front: the noise multiplier covers all of them, and the accountant
    composes every step taken, over however many calls of :meth:`epochs`."""

    def __init__(
        self,
        config: Config,
        x: NDArray[np.float32],
        y: NDArray[np.int64],
        classes: int,
        *,
        seed: int,
        epsilon: float,
        delta: float,
        total_epochs: int,
    ) -> None:
        require_sgd(config)
        if config.clip is None:
            raise ValueError(f"{config}: DP-SGD needs a clipping norm")
        self.config, self.delta = config, delta
        per_epoch = steps_per_epoch(len(x), int(config.batch or 0))
        self.sigma = noise_multiplier(epsilon, delta, 1 / per_epoch, per_epoch * total_epochs)
        gen = torch.Generator().manual_seed(seed)
        module = build_model(config.architecture, x.shape[1:], classes, seed=seed, private=True)
        loader = DataLoader(
            TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
            batch_size=min(int(config.batch or 0), len(x)),
            generator=gen,
        )
        self.engine = PrivacyEngine(accountant=ACCOUNTANT)
        self.model, self.optimizer, self.loader = self.engine.make_private(
            module=module,
            optimizer=torch.optim.Adam(module.parameters(), lr=float(config.lr or 0.0)),
            data_loader=loader,
            noise_multiplier=self.sigma,
            max_grad_norm=float(config.clip),
            poisson_sampling=True,
            noise_generator=torch.Generator().manual_seed(seed + 1),
        )
        self.module = module

    def epochs(self, count: int) -> None:
        """``count`` passes of Poisson-sampled steps (an empty batch still steps: the
        noise is added all the same, so the batch sizes reveal nothing)."""
        self.model.train()
        loss_fn = nn.CrossEntropyLoss()
        for _ in range(count):
            for xb, yb in self.loader:
                self.optimizer.zero_grad()
                loss_fn(self.model(xb), yb).backward()
                self.optimizer.step()

    def reset_optimizer(self) -> None:
        """Forget Adam's moments (a FedAvg client starts each round afresh)."""
        self.optimizer.original_optimizer.state.clear()

    def history(self) -> list[tuple[float, float, int]]:
        """Every (noise multiplier, sample rate, steps) the accountant composed."""
        return [(float(s), float(q), int(t)) for s, q, t in self.engine.accountant.history]

    def spent(self) -> float:
        """Epsilon spent so far at ``delta``, by the accountant that composed every step."""
        return float(self.engine.get_epsilon(self.delta))


def predict(model: nn.Module, x: NDArray[np.float32]) -> NDArray[np.int64]:
    """(N,) classes of (N, ...) inputs, in evaluation mode."""
    return logits(model, x).argmax(1).numpy().astype(np.int64)


def accuracy(model: nn.Module, x: NDArray[np.float32], y: NDArray[np.int64]) -> float:
    return float((predict(model, x) == y).mean())
