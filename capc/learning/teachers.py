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
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from capc.learning.last_layer import fit_linear
from capc.models.ensemble import (
    TeacherEnsemble,
    ensemble_outputs,
    hard,
    head_outputs,
    statistics_of,
)
from capc.models.inference import features, recalibrate
from capc.models.registry import Classifier


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

    def checkpoint(
        self,
        architecture: str,
        input_shape: tuple[int, ...],
        width: int | None,
        card: dict[str, Any],
    ) -> TeacherEnsemble:
        """The teachers as one party's ensemble checkpoint (:mod:`capc.models.ensemble`)."""
        return TeacherEnsemble(
            architecture,
            input_shape,
            int(self.weights.shape[1]),
            copy.deepcopy(self.body).cpu(),
            self.statistics,
            self.weights.detach().cpu(),
            self.biases.detach().cpu(),
            card,
            width=width,
            device="cpu",
        )

    def classes_of(self, feats: torch.Tensor) -> NDArray[np.int64]:
        """Every teacher's class for (N, D) body features that do not depend on a
        teacher's statistics (current statistics): (N, T). Callers that already hold
        the features of a query batch save a pass through the body."""
        return hard(head_outputs(feats, self.weights, self.biases), multi_label=False)

    def predictions(
        self, x: NDArray[np.float32], *, current_statistics: bool, batch: int = 512
    ) -> NDArray[np.int64]:
        """Every teacher's class for every input: (N, T).

        With ``current_statistics`` the features do not depend on a teacher's
        stored statistics, so they are computed once for all; otherwise once
        per teacher with its own statistics. ``batch``: inputs per BatchNorm batch.
        """
        out = ensemble_outputs(
            self.body,
            self.statistics,
            self.weights,
            self.biases,
            x,
            current_statistics=current_statistics,
            batch=batch,
        )
        return hard(out, multi_label=False)


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
    saved = statistics_of(body)
    stats, weights, biases = [], [], []
    try:
        for p in partitions:
            if len(p) < 2:
                raise ValueError("every hospital needs at least two examples")
            recalibrate(body, x[p])
            stats.append(statistics_of(body))
            head = fit_linear(features(body, x[p]), y[p], outputs, l2=l2)
            weights.append(head.weight.detach())
            biases.append(head.bias.detach())
    finally:
        body.load_state_dict(saved, strict=False)
    return HeadEnsemble(body, stats, torch.stack(weights), torch.stack(biases))
