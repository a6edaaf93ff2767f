"""Student models: trained on the labels of finished jobs, one at a time, off the RPC threads.

The student keeps its own labelled test set (``--test-data``, an .npz with
``x`` and ``y``) to report test accuracy; without one only the training fit
is reported. Unanswered queries (label -1) are left out; for a multi-label
task only queries with every label answered are used.
"""

from __future__ import annotations

import io
import logging
import queue
import threading
import time
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from capc.learning.supervised import accuracy, fit
from capc.models import ARCHITECTURES, Teacher, build, save_teacher
from services.common.task import TaskConfig
from services.student.store import TERMINAL, JobStore

log = logging.getLogger("capc.student")
MAX_EPOCHS = 200


class TrainingError(ValueError):
    """A training request names no usable jobs or an unknown architecture."""


def load_test_set(path: Path, task: TaskConfig) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """The student's labelled test set: ``x`` (N, *input_shape) float32, ``y`` (N,) or (N, k)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            x = np.asarray(data["x"], dtype=np.float32)
            y = np.asarray(data["y"], dtype=np.int64)
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"{path}: not an .npz with arrays x and y ({err})") from err
    if x.shape[1:] != task.input_shape or len(x) != len(y):
        raise ValueError(
            f"{path}: x must be (N, {', '.join(map(str, task.input_shape))}) with one label each, got x {x.shape}, y {y.shape}"
        )
    return x, y


def labelled_examples(
    store: JobStore, job_ids: list[str], task: TaskConfig
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """The answered (query, label) pairs of the named jobs, in job order."""
    xs, ys = [], []
    for job_id in job_ids:
        labels = store.labels(job_id)
        queries = store.queries(job_id)[: len(labels)]
        keep = (labels >= 0).reshape(len(labels), -1).all(axis=1)
        xs.append(queries[keep])
        ys.append(labels[keep])
    x = np.concatenate(xs) if xs else np.zeros((0, *task.input_shape), dtype=np.float32)
    y = np.concatenate(ys) if ys else np.zeros(0, dtype=np.int64)
    return x, y


class ModelTrainer:
    """Trains queued student models one after another in a background thread."""

    def __init__(
        self,
        store: JobStore,
        task: TaskConfig,
        test_set: tuple[NDArray[np.float32], NDArray[np.int64]] | None = None,
    ) -> None:
        self.store = store
        self.task = task
        self.test_set = test_set
        self._queue: queue.Queue[str] = queue.Queue()
        for model_id in store.unfinished_models():
            self._queue.put(model_id)
        threading.Thread(target=self._loop, name="capc-train", daemon=True).start()

    def check(self, job_ids: list[str], architecture: str, epochs: int) -> None:
        """Refuse a request that cannot train: raises TrainingError with the reason."""
        if not job_ids:
            raise TrainingError("name at least one finished job to train on")
        if architecture not in ARCHITECTURES:
            raise TrainingError(
                f"unknown architecture {architecture!r}; choose from {', '.join(sorted(ARCHITECTURES))}"
            )
        if not 1 <= epochs <= MAX_EPOCHS:
            raise TrainingError(f"epochs must lie in [1, {MAX_EPOCHS}], got {epochs}")
        for job_id in job_ids:
            job = self.store.get(job_id)
            if job is None:
                raise TrainingError(f"no job {job_id!r}")
            if job.state not in TERMINAL:
                raise TrainingError(f"job {job_id} is {job.state}; wait until it finishes")
            if job.answered == 0:
                raise TrainingError(f"job {job_id} has no answered queries to learn from")

    def submit(self, model_id: str) -> None:
        self._queue.put(model_id)

    def _loop(self) -> None:
        while True:
            model_id = self._queue.get()
            try:
                self._train(model_id)
            except Exception as err:  # a failed model is reported, the trainer keeps serving
                log.exception("training model %s failed", model_id)
                self.store.update_model(model_id, state="failed", error=str(err))

    def _train(self, model_id: str) -> None:
        spec = self.store.model(model_id)
        if spec is None:
            return
        self.store.update_model(model_id, state="training")
        start = time.perf_counter()
        x, y = labelled_examples(self.store, list(spec.job_ids), self.task)
        if len(x) == 0:
            raise TrainingError("the jobs have no fully answered queries")
        outputs = self.task.num_classes
        model = fit(
            build(spec.architecture, self.task.input_shape, outputs),
            x,
            y,
            epochs=spec.epochs,
            seed=spec.seed,
        )
        metrics: dict[str, object] = {
            "train_accuracy": accuracy(model, x, y),
            "examples": len(x),
        }
        if self.test_set is not None:
            metrics["test_accuracy"] = accuracy(model, *self.test_set)
            metrics["test_examples"] = len(self.test_set[0])
        metrics["seconds"] = time.perf_counter() - start
        card: dict[str, object] = {
            "kind": "student",
            "task": self.task.name,
            "task_config_hash": self.task.config_hash,
            "architecture": spec.architecture,
            "input_shape": list(self.task.input_shape),
            "outputs": outputs,
            "multi_label": self.task.multi_label,
            "data": f"{len(x)} queries labelled by the consortium (jobs {', '.join(spec.job_ids)}); "
            "unanswered queries left out",
            "mechanism": self.task.mechanism.name,
            "epochs": spec.epochs,
            "seed": spec.seed,
            "metrics": metrics,
        }
        buf = io.BytesIO()
        save_teacher(
            buf,
            Teacher(
                spec.architecture,
                self.task.input_shape,
                outputs,
                model,
                card,
                device="cpu",
                multi_label=self.task.multi_label,
            ),
        )
        self.store.update_model(
            model_id,
            state="done",
            examples=len(x),
            metrics=metrics,
            checkpoint=buf.getvalue(),
            card=card,
        )
        log.info("student model %s trained on %d examples: %s", model_id, len(x), metrics)
