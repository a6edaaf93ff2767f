"""Teacher ensembles for central-mode experiments: one model per disjoint partition."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.learning.supervised import fit
from capc.models import build


def train_teachers(
    x: NDArray[np.float32],
    y: NDArray[np.integer],
    partitions: Sequence[NDArray[np.int64]],
    *,
    architecture: str = "small-cnn",
    epochs: int = 10,
    seed: int = 0,
) -> list[nn.Module]:
    """One model per index set in ``partitions``; ``y`` is (N,) classes or (N, k) 0/1 labels."""
    outputs = int(y.shape[1]) if y.ndim == 2 else int(y.max()) + 1
    return [
        fit(
            build(architecture, tuple(x.shape[1:]), outputs),
            x[p],
            y[p],
            epochs=epochs,
            seed=seed + i,
        )
        for i, p in enumerate(partitions)
    ]


def ensemble_predictions(
    models: Sequence[nn.Module], x: NDArray[np.float32], multi_label: bool = False
) -> NDArray[np.int64]:
    """Every model's hard prediction with training statistics: (B, teachers) classes,
    or (B, teachers, k) 0/1 labels when ``multi_label``."""
    xt = torch.from_numpy(np.asarray(x, dtype=np.float32))
    out = []
    with torch.no_grad():
        for m in models:
            dev = next(m.parameters()).device
            logits = m.eval()(xt.to(dev)).cpu()
            out.append((logits > 0).long() if multi_label else logits.argmax(dim=1))
    return torch.stack(out, dim=1).numpy().astype(np.int64)
