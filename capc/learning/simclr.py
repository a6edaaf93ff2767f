"""Self-supervised pretraining of a model's body on synthetic images (SimCLR-style).

Two augmented views of each image go through the body and a small
projection head; the NT-Xent loss pulls the two views of an image together
and pushes the other 2B - 2 images of the batch away. No label and no real
image is involved, so the body can be shared with every hospital and the
student without any privacy cost. The projection head is thrown away.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn import functional

from capc.learning.augment import Augmentation, augment
from capc.models.registry import Classifier

#: Arithmetic a pretraining can run in.
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class PretrainConfig:
    """Optimisation settings: ``steps`` AdamW steps of ``batch`` images (2 views each),
    one-cycle learning rate peaking at ``lr``, NT-Xent ``temperature``.

    ``precision`` "bf16" runs the body and projection under bfloat16 autocast
    in channels-last layout (the loss stays float32): on a CPU with bf16
    instructions a step takes a half (width 32) to two fifths (width 64) of
    the float32 time (``benchmarks/diet_throughput.py``), so a wider body
    fits the same hours. "fp32" is the default because the
    published bodies were made with it and their digests name them.
    """

    steps: int = 1500
    batch: int = 256
    lr: float = 2e-3
    weight_decay: float = 1e-4
    temperature: float = 0.2
    projection_dim: int = 64
    seed: int = 0
    augmentation: Augmentation = field(default_factory=Augmentation)
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 2:
            raise ValueError("pretraining needs steps >= 1 and batch >= 2")
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if not self.temperature > 0 or not self.lr > 0:
            raise ValueError("temperature and lr must be positive")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class PretrainingPausedError(RuntimeError):
    """Pretraining reached its deadline; its state is saved and the same call resumes it."""

    def __init__(self, step: int, steps: int, state: Path) -> None:
        super().__init__(
            f"pretraining paused after step {step} of {steps}; its state is in {state}: "
            "run the same command again to resume it"
        )
        self.step = step
        self.steps = steps
        self.state = state


#: Steps between two saves of a resumable pretraining's state.
SAVE_EVERY = 100


def _save_state(path: Path, state: dict[str, Any]) -> None:
    # Written beside the target and renamed, so a crash never leaves half a state.
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """NT-Xent loss of two (B, P) projections of the same B images (mean over 2B anchors, nats)."""
    if z1.shape != z2.shape or z1.ndim != 2:
        raise ValueError(
            f"two (B, P) projections needed, got {tuple(z1.shape)} and {tuple(z2.shape)}"
        )
    n = z1.shape[0]
    z = functional.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.T / temperature
    # An image is never its own negative.
    sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), -math.inf)
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return functional.cross_entropy(sim, target)


def pretrain(
    model: Classifier,
    pool: NDArray[np.float32],
    config: PretrainConfig = PretrainConfig(),
    log: Callable[[str], None] | None = None,
    view: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
    *,
    state: Path | None = None,
    deadline: float | None = None,
) -> list[float]:
    """Train ``model.features`` in place on batches drawn from ``pool`` (N, C, H, W) in [0, 1].

    ``view`` makes one random view of a batch (default :func:`capc.learning.augment.augment`
    with ``config.augmentation``; label-DP's public pools pass views without flips).
    Returns the loss (nats) of every step. The head is left as it was; the
    model ends in evaluation mode on the device it started on.

    ``state``: a file that makes the pretraining resumable. When it exists the
    run continues from it (the body, projection, optimiser, schedule, random
    generator and losses saved there), and it is rewritten every
    :data:`SAVE_EVERY` steps; a resumed run computes what an uninterrupted one
    does. ``deadline`` (``time.monotonic()`` seconds; needs ``state``): past
    it, the state is saved and :class:`PretrainingPausedError` raised, so a long
    pretraining can run as several bounded jobs.
    """
    if deadline is not None and state is None:
        raise ValueError("a pretraining deadline needs a state file to resume from")
    if pool.ndim != 4 or len(pool) < config.batch:
        raise ValueError(
            f"the pool must hold at least one batch of (N, C, H, W) images, got {pool.shape}"
        )
    dev = next(model.parameters()).device
    gen = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    projection = nn.Sequential(
        nn.Linear(model.dim, model.dim), nn.ReLU(), nn.Linear(model.dim, config.projection_dim)
    ).to(dev)
    params = [*model.features.parameters(), *projection.parameters()]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=config.lr, total_steps=config.steps, pct_start=0.1
    )
    images = torch.from_numpy(np.ascontiguousarray(pool, dtype=np.float32))
    bf16 = config.precision == "bf16"
    layout = torch.channels_last if bf16 else torch.contiguous_format
    # torch's stubs leave out Module.to's memory_format keyword.
    model.to(memory_format=layout)  # type: ignore[call-overload]
    losses: list[float] = []
    first = 0
    if state is not None and state.exists():
        saved = torch.load(state, map_location=dev, weights_only=True)
        if saved["config"] != repr(config) or int(saved["pool"]) != len(pool):
            raise ValueError(
                f"{state} belongs to another pretraining ({saved['config']}, pool "
                f"{saved['pool']}); remove it or name another state file"
            )
        model.features.load_state_dict(saved["features"])
        projection.load_state_dict(saved["projection"])
        opt.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        gen.set_state(saved["generator"])
        losses = [float(v) for v in saved["losses"].tolist()]
        first = int(saved["step"])
        if log is not None:
            log(f"pretraining resumed at step {first + 1}/{config.steps} from {state}")

    def save(step: int) -> None:
        assert state is not None
        _save_state(
            state,
            {
                "config": repr(config),
                "pool": len(pool),
                "step": step,
                "features": model.features.state_dict(),
                "projection": projection.state_dict(),
                "optimizer": opt.state_dict(),
                "schedule": schedule.state_dict(),
                "generator": gen.get_state(),
                "losses": torch.tensor(losses, dtype=torch.float64),
            },
        )

    start = time.perf_counter()
    model.train()
    try:
        for step in range(first, config.steps):
            if deadline is not None and time.monotonic() >= deadline and step > first:
                save(step)
                raise PretrainingPausedError(step, config.steps, state)  # type: ignore[arg-type]
            idx = torch.randint(0, len(images), (config.batch,), generator=gen)
            x = images[idx]
            v1, v2 = (
                (augment(x, gen, config.augmentation) if view is None else view(x, gen))
                .contiguous(memory_format=layout)
                .to(dev, non_blocking=True)
                for _ in range(2)
            )
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                p1, p2 = projection(model.features(v1)), projection(model.features(v2))
            loss = nt_xent(p1.float(), p2.float(), config.temperature)
            opt.zero_grad(set_to_none=True)
            torch.autograd.backward(loss)
            opt.step()
            schedule.step()
            losses.append(float(loss.detach()))
            if log is not None and (step % 100 == 0 or step == config.steps - 1):
                log(
                    f"pretraining step {step + 1}/{config.steps}: loss {losses[-1]:.3f} "
                    f"({time.perf_counter() - start:.0f} s)"
                )
            if state is not None and (step + 1) % SAVE_EVERY == 0 and step + 1 < config.steps:
                save(step + 1)
    finally:
        model.to(memory_format=torch.contiguous_format)  # type: ignore[call-overload]
        model.eval()
    return losses
