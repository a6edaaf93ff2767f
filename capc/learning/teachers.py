"""DIET teachers: one shared pretrained body, each hospital's own statistics and head.

Every hospital starts from the same body (pretrained on synthetic images, so
sharing it costs no privacy), replaces its BatchNorm statistics by those of
its own data and fits only the last layer on its labels. In central-mode
experiments the body is stored once; a teacher is its statistics and head.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray

from capc.learning.last_layer import fit_linear
from capc.models.inference import features, recalibrate
from capc.models.registry import Classifier


def _statistics(model: Classifier) -> dict[str, torch.Tensor]:
    return {
        k: v.detach().clone()
        for k, v in model.state_dict().items()
        if k.endswith(("running_mean", "running_var", "num_batches_tracked"))
    }


@dataclass
class HeadEnsemble:
    """Teachers that share ``body``'s weights.

    ``statistics[i]``: teacher i's BatchNorm buffers; ``weights`` (T, K, D) and
    ``biases`` (T, K): the teachers' linear heads.
    """

    body: Classifier
    statistics: list[dict[str, torch.Tensor]]
    weights: torch.Tensor
    biases: torch.Tensor

    def __len__(self) -> int:
        return len(self.statistics)

    def teacher(self, i: int) -> Classifier:
        """Teacher ``i`` as a stand-alone model (what a hospital's party loads)."""
        model = copy.deepcopy(self.body)
        model.load_state_dict(self.statistics[i], strict=False)
        with torch.no_grad():
            model.head = torch.nn.Linear(self.weights.shape[2], self.weights.shape[1])
            model.head.weight.copy_(self.weights[i])
            model.head.bias.copy_(self.biases[i])
        return model.to(next(self.body.parameters()).device).eval()

    def classes_of(self, feats: torch.Tensor) -> NDArray[np.int64]:
        """Every teacher's class for (N, D) body features that do not depend on a
        teacher's statistics (current statistics): (N, T). Callers that already hold
        the features of a query batch save a pass through the body."""
        out = torch.einsum("nd,tkd->ntk", feats, self.weights) + self.biases[None]
        return out.argmax(dim=2).numpy().astype(np.int64)

    def predictions(
        self, x: NDArray[np.float32], *, current_statistics: bool, batch: int = 512
    ) -> NDArray[np.int64]:
        """Every teacher's class for every input: (N, T).

        With ``current_statistics`` the features do not depend on a teacher's
        stored statistics, so they are computed once for all; otherwise once
        per teacher with its own statistics. ``batch``: inputs per BatchNorm batch.
        """
        if current_statistics:
            return self.classes_of(features(self.body, x, current_statistics=True, batch=batch))
        saved = _statistics(self.body)
        preds = []
        try:
            for i, stats in enumerate(self.statistics):
                self.body.load_state_dict(stats, strict=False)
                f = features(self.body, x, current_statistics=False, batch=batch)
                preds.append((f @ self.weights[i].T + self.biases[i]).argmax(dim=1))
        finally:
            self.body.load_state_dict(saved, strict=False)
        return torch.stack(preds, dim=1).numpy().astype(np.int64)


def fit_head_ensemble(
    body: Classifier,
    x: NDArray[np.float32],
    y: NDArray[np.integer],
    partitions: Sequence[NDArray[np.int64]],
    *,
    l2: float = 1e-2,
) -> HeadEnsemble:
    """One teacher per index set of ``partitions`` over (N, *shape) ``x`` and (N,) ``y``.

    ``body`` is not changed (its statistics are restored afterwards). ``l2``:
    penalty of each head (see :func:`capc.learning.last_layer.fit_linear`);
    a larger one keeps small hospitals' heads from fitting noise.
    """
    outputs = body.head.out_features
    saved = _statistics(body)
    stats, weights, biases = [], [], []
    try:
        for p in partitions:
            if len(p) < 2:
                raise ValueError("every hospital needs at least two examples")
            recalibrate(body, x[p])
            stats.append(_statistics(body))
            head = fit_linear(features(body, x[p]), y[p], outputs, l2=l2)
            weights.append(head.weight.detach())
            biases.append(head.bias.detach())
    finally:
        body.load_state_dict(saved, strict=False)
    return HeadEnsemble(body, stats, torch.stack(weights), torch.stack(biases))
