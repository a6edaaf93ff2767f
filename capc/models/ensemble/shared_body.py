"""m teachers on one shared body: the body once, each teacher's BatchNorm statistics and
linear head, and every teacher's prediction for a batch of queries.

Under current statistics (synthetic queries) the features do not depend on a
teacher's statistics, so one pass through the body serves all m heads; under
stored statistics each teacher reads the queries with its own.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from capc.models.checkpoint import weights_sha256
from capc.models.inference import features
from capc.models.registry import Classifier

#: Queries per forward pass under stored statistics when a caller names no batch. Small:
#: a pass of 250 (25 MB activations) allocated and freed its memory from the system every
#: time, 30% more CPU than passes of 64 (same predictions: a batch is read record by record).
STORED_STATISTICS_CHUNK = 64


def statistics_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s BatchNorm buffers (running statistics and counters), copied."""
    return {
        k: v.detach().clone()
        for k, v in model.state_dict().items()
        if k.endswith(("running_mean", "running_var", "num_batches_tracked"))
    }


def head_outputs(feats: torch.Tensor, weights: torch.Tensor, biases: torch.Tensor) -> torch.Tensor:
    """Every head's outputs (N, T, K) for (N, D) features, (T, K, D) weights, (T, K) biases."""
    return torch.einsum("nd,tkd->ntk", feats, weights) + biases[None]


def hard_predictions(outputs: torch.Tensor, multi_label: bool) -> NDArray[np.int64]:
    """(..., K) outputs -> classes (...) or 0/1 labels (..., K) (positive above 0)."""
    out = (outputs > 0).long() if multi_label else outputs.argmax(dim=-1)
    return out.cpu().numpy().astype(np.int64)


def head_predictions(
    feats: torch.Tensor, weights: torch.Tensor, biases: torch.Tensor, multi_label: bool = False
) -> NDArray[np.int64]:
    """Every head's prediction for (N, D) features: (N, T) classes, or (N, T, K) 0/1 labels
    when ``multi_label``; ``weights`` (T, K, D), ``biases`` (T, K)."""
    return hard_predictions(head_outputs(feats, weights, biases), multi_label)


def ensemble_outputs(
    body: Classifier,
    statistics: Sequence[dict[str, torch.Tensor]],
    weights: torch.Tensor,
    biases: torch.Tensor,
    x: NDArray[np.float32],
    *,
    current_statistics: bool,
    batch: int,
) -> torch.Tensor:
    """Every teacher's outputs (N, T, K) for (N, *input_shape) inputs.

    With ``current_statistics`` the features are computed once for all teachers;
    otherwise once per teacher with its own statistics (``body``'s own are restored).
    ``batch``: inputs per BatchNorm batch (per forward pass under stored statistics).
    """
    if current_statistics:
        f = features(body, x, current_statistics=True, batch=batch)
        return head_outputs(f, weights.cpu(), biases.cpu())
    saved = statistics_of(body)
    outs = []
    try:
        for i, stats in enumerate(statistics):
            body.load_state_dict(stats, strict=False)
            f = features(body, x, current_statistics=False, batch=batch)
            outs.append(f @ weights[i].cpu().T + biases[i].cpu())
    finally:
        body.load_state_dict(saved, strict=False)
    return torch.stack(outs, dim=1)


def check_queries(queries: NDArray[np.float32], shape: tuple[int, ...]) -> NDArray[np.float32]:
    """``queries`` as float32 (B, *shape), B > 0 and finite; ValueError says what is wrong."""
    x = np.asarray(queries, dtype=np.float32)
    if x.shape[1:] != shape or len(x) == 0:
        raise ValueError(
            f"queries must have shape (B, {', '.join(map(str, shape))}), got {x.shape}"
        )
    if not np.isfinite(x).all():
        raise ValueError("queries contain NaN or infinity")
    return x


@dataclass
class TeacherEnsemble:
    """m teachers sharing ``body``'s weights: teacher i is the body with BatchNorm buffers
    ``statistics[i]`` and the linear head (``weights[i]`` (K, D), ``biases[i]`` (K,)).

    ``multi_label``: the K outputs are independent labels (positive above 0). ``body`` is
    held, not copied: the ensemble moves it to ``device`` and restores its statistics
    after every prediction, so one body may serve several ensembles.
    """

    architecture: str
    input_shape: tuple[int, ...]
    num_classes: int
    body: Classifier
    statistics: list[dict[str, torch.Tensor]]
    weights: torch.Tensor
    biases: torch.Tensor
    card: dict[str, Any] = field(default_factory=dict)
    width: int | None = None
    multi_label: bool = False
    device: str = "cuda" if torch.cuda.is_available() else "cpu"

    def __post_init__(self) -> None:
        m = len(self.statistics)
        if m < 1:
            raise ValueError("an ensemble needs at least one teacher")
        want = (m, self.num_classes)
        if tuple(self.weights.shape[:2]) != want or tuple(self.biases.shape) != want:
            raise ValueError(
                f"{m} teachers of {self.num_classes} outputs need weights ({m}, "
                f"{self.num_classes}, D) and biases {want}, got {tuple(self.weights.shape)} "
                f"and {tuple(self.biases.shape)}"
            )
        self.body.to(self.device).eval()

    def __len__(self) -> int:
        return len(self.statistics)

    @property
    def model_hashes(self) -> list[str]:
        """One digest per teacher: of the shared body and of that teacher's own part."""
        body = weights_sha256(self.body, prefix=self.architecture)
        out = []
        for i, stats in enumerate(self.statistics):
            h = hashlib.sha256(body.encode())
            for k, v in sorted(stats.items()):
                h.update(k.encode())
                h.update(v.detach().cpu().numpy().tobytes())
            h.update(self.weights[i].detach().cpu().numpy().tobytes())
            h.update(self.biases[i].detach().cpu().numpy().tobytes())
            out.append(h.hexdigest())
        return out

    def predict(
        self,
        queries: NDArray[np.float32],
        current_statistics: bool = False,
        batch: int | None = None,
    ) -> NDArray[np.int64]:
        """Every teacher's prediction for (B, *input_shape) queries: (B, m) classes, or
        (B, m, k) 0/1 labels.

        ``current_statistics``: BatchNorm normalises with the query batch's own statistics
        (synthetic queries). ``batch``: queries per BatchNorm batch under current statistics
        (None: all B in one, as a single teacher reads a round) and per forward pass under
        stored statistics, where it changes nothing but memory and speed (None: 64).
        """
        x = check_queries(queries, self.input_shape)
        step = batch or (x.shape[0] if current_statistics else STORED_STATISTICS_CHUNK)
        out = ensemble_outputs(
            self.body,
            self.statistics,
            self.weights,
            self.biases,
            x,
            current_statistics=current_statistics,
            batch=step,
        )
        return hard_predictions(out, self.multi_label)

    def predict_features(self, feats: torch.Tensor) -> NDArray[np.int64]:
        """Every teacher's prediction for (N, D) body features taken under current
        statistics (they do not depend on a teacher's statistics): (N, m) classes, or
        (N, m, k) 0/1 labels. A caller that holds a query batch's features already
        saves a pass through the body."""
        return head_predictions(
            feats.cpu(), self.weights.cpu(), self.biases.cpu(), self.multi_label
        )

    def teacher(self, i: int) -> Classifier:
        """Teacher ``i`` as a stand-alone model (a copy of the body with its statistics and
        head), on the ensemble's device, in evaluation mode."""
        model = copy.deepcopy(self.body)
        model.load_state_dict(self.statistics[i], strict=False)
        with torch.no_grad():
            model.head = torch.nn.Linear(self.weights.shape[2], self.weights.shape[1])
            model.head.weight.copy_(self.weights[i])
            model.head.bias.copy_(self.biases[i])
        return model.to(self.device).eval()
