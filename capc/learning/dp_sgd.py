"""Full-batch DP-SGD with Opacus: the one training routine of every DP-trained teacher.

Each step takes every record (a full batch, the sampling rate 1 that
:mod:`capc.privacy.dp_training` charges exactly), clips each record's gradient
over all parameters to L2 norm ``record.clip`` (Opacus's per-sample
gradients) and adds Gaussian noise of standard deviation
``record.noise_multiplier * record.clip`` to their sum. The model may hold no
BatchNorm, trainable or frozen (a batch statistic mixes records, which
per-record clipping cannot bound), nor any norm layer tracking running
statistics (the records' averages, stored and read at inference): this
function refuses them (Opacus checks trainable modules only).

Shapes: ``x`` (N, ...) float32 inputs, ``y`` (N,) int64 classes.
"""

from __future__ import annotations

import warnings
from typing import TypeVar

import numpy as np
import torch
from numpy.typing import NDArray
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from opacus.validators import ModuleValidator
from torch import nn

from capc.privacy.dp_training import DpTraining
from capc.privacy.randomness import SecureRandom

M = TypeVar("M", bound=nn.Module)

# Opacus's hook warning on a first layer whose inputs need no gradient: expected here.
warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)


# Opacus ships no type information, so its optimizer is Any to mypy.
class _SecureNoise(DPOptimizer):  # type: ignore[misc]
    """Opacus's optimizer with its noise drawn from capc's AES-CTR source rather than
    torch's Mersenne Twister, whose state earlier outputs would give away."""

    def __init__(self, *args: object, rng: SecureRandom, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._rng = rng

    def add_noise(self) -> None:
        std = float(self.noise_multiplier) * float(self.max_grad_norm)
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            draw = self._rng.normal(tuple(p.summed_grad.shape), scale=std)
            noise = torch.from_numpy(draw).to(p.summed_grad.dtype)
            p.grad = (p.summed_grad + noise).view_as(p)
            _mark_as_processed(p.summed_grad)


def _records_statistics(module: nn.Module) -> bool:
    """Whether ``module`` reads or stores statistics over several records."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return True
    return isinstance(module, nn.modules.batchnorm._NormBase) and module.track_running_stats


def train(
    model: M,
    x: NDArray[np.float32],
    y: NDArray[np.int64],
    record: DpTraining,
    *,
    lr: float,
    rng: SecureRandom,
    seed: int = 0,
    momentum: float = 0.0,
) -> M:
    """``record.steps`` full-batch DP-SGD steps of plain SGD (``lr``, ``momentum``) on
    ``model``, in place; the trained model in evaluation mode.

    The noise comes from ``rng`` (``SecureRandom()`` for a hospital's records;
    ``SecureRandom.from_seed`` only for experiments); ``seed`` fixes the initial
    weights, which are data-independent.
    """
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"need as many labels as inputs (>0), got {len(x)} and {len(y)}")
    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise ValueError(f"this model cannot be trained with DP-SGD: {errors[0]}")
    # Opacus checks trainable modules only: a frozen BatchNorm would still normalise
    # each step by the batch's statistics (every record moves every other's gradient,
    # which clipping cannot bound), and any norm layer that tracks running statistics
    # (BatchNorm, InstanceNorm with track_running_stats) stores the records' averages
    # in the model, read at inference outside the training's charge.
    stats = [n for n, m in model.named_modules() if _records_statistics(m)]
    if stats:
        raise ValueError(
            f"this model cannot be trained with DP-SGD: its layer {stats[0] or 'model'} "
            "keeps batch or running statistics of the records (BatchNorm, trainable or "
            "not, or a norm layer with track_running_stats); train a head on the body's "
            "features instead, or use GroupNorm or LayerNorm"
        )
    torch.manual_seed(seed)
    # What each submodule holds before Opacus wraps it: whatever it adds is removed after.
    own = {name: set(vars(m)) for name, m in model.named_modules()}
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64))
    wrapped = GradSampleModule(model)
    optimizer = _SecureNoise(
        torch.optim.SGD(wrapped.parameters(), lr=lr, momentum=momentum),
        noise_multiplier=float(record.noise_multiplier),
        max_grad_norm=float(record.clip),
        expected_batch_size=len(xt),
        rng=rng,
    )
    loss_fn = nn.CrossEntropyLoss(reduction="mean")
    wrapped.train()
    for _ in range(int(record.steps)):
        optimizer.zero_grad()
        loss_fn(wrapped(xt), yt).backward()
        optimizer.step()
    wrapped.eval()
    # Drop Opacus's hooks and the attributes it set on each parameter (grad_sample and
    # its counters): what is saved and pickled is the plain model.
    wrapped._close()
    for p in model.parameters():
        p.grad = None
    # Opacus leaves attributes on the submodules, among them ``activations``: the last
    # forward pass's inputs, i.e. the training records' features, which a pickled or
    # copied model would carry along. Every attribute it added goes.
    for name, m in model.named_modules():
        for attr in set(vars(m)) - own.get(name, set()):
            delattr(m, attr)
    return model.eval()
