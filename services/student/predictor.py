"""Predictions of trained student models, one record or many, each independent of the rest.

A model is loaded from the job store once and kept (the last few used). It
runs in evaluation mode only: models trained from scratch use their training
statistics, and a pretrained (DIET) student stores the statistics of its
reference batch when it is trained (:mod:`services.student.training`). So the
prediction for a record never depends on the other records of the request,
and a batch of one is predicted as well as a batch of many. A DIET student
stored before reference batches existed would need a batch's statistics; it
is refused, with what to do, rather than silently degraded.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray

from capc.models import Teacher, load_teacher
from capc.models.inference import logits
from services.common.limits import PREDICT_CACHE_MODELS
from services.student.store import JobStore


class PredictionError(ValueError):
    """A model cannot predict (not trained yet, or stored without a reference batch)."""


@dataclass(frozen=True)
class Prediction:
    """``labels``: (N,) classes or (N, k) 0/1 labels; ``scores`` (N, outputs): class
    probabilities (softmax), or each label's probability (sigmoid) when multi-label."""

    labels: NDArray[np.int64]
    scores: NDArray[np.float32]


def batch_independent(card: dict[str, object]) -> bool:
    """Whether a stored model's card says it predicts each record on its own: a DIET
    student with a reference batch, or a model with training statistics."""
    method = str(card.get("method", ""))
    return "reference" in card or "DIET" not in method


class Predictor:
    """Loads trained student models from ``store`` and predicts with them."""

    def __init__(self, store: JobStore, cache: int = PREDICT_CACHE_MODELS) -> None:
        self.store = store
        self._cache: OrderedDict[str, Teacher] = OrderedDict()
        self._size = cache
        self._lock = threading.Lock()

    def model(self, model_id: str) -> Teacher:
        with self._lock:
            found = self._cache.get(model_id)
            if found is not None:
                self._cache.move_to_end(model_id)
                return found
        stored = self.store.model_file(model_id)
        if stored is None:
            spec = self.store.model(model_id)
            state = "unknown" if spec is None else spec.state
            raise PredictionError(
                f"model {model_id} is {state}; it predicts once it is done"
                if spec is not None
                else f"no student model {model_id!r}"
            )
        checkpoint, card = stored
        if not batch_independent(card):
            raise PredictionError(
                f"model {model_id} reads records under current statistics and was stored "
                "without a reference batch, so its prediction for a record would depend on the "
                "other records of the request; train it again (the student party now keeps a "
                "reference batch)"
            )
        teacher = load_teacher_bytes(checkpoint)
        with self._lock:
            self._cache[model_id] = teacher
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return teacher

    def predict(self, model_id: str, records: NDArray[np.float32]) -> Prediction:
        """Predictions for (N, *input_shape) float32 ``records``, row by row independent."""
        teacher = self.model(model_id)
        if records.shape[1:] != teacher.input_shape:
            raise PredictionError(
                f"records must have shape (N, {', '.join(map(str, teacher.input_shape))}), "
                f"got {records.shape}"
            )
        out = logits(teacher.model, records)
        if teacher.multi_label:
            scores = torch.sigmoid(out)
            labels = (out > 0).long()
        else:
            scores = torch.softmax(out, dim=1)
            labels = out.argmax(dim=1)
        return Prediction(
            labels.numpy().astype(np.int64), scores.numpy().astype(np.float32, copy=False)
        )


def load_teacher_bytes(checkpoint: bytes) -> Teacher:
    """A checkpoint held in memory, as :func:`capc.models.load_teacher` reads a file."""
    return load_teacher(io.BytesIO(checkpoint))
