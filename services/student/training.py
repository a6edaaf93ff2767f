"""Student models: trained on the labels of finished jobs, one at a time, off the RPC threads.

Two ways to train:
- ``pretrained`` (DIET): the student's body, pretrained on synthetic images
  (``capc student --body``), stays frozen; only its last layer is fitted to
  the labels, on features taken with each round's own BatchNorm statistics,
  exactly as the hospitals saw the queries. Its card says to infer with
  current statistics.
- an architecture name (``small-cnn``, ``resnet10``, ...): trained from
  scratch on the labelled queries; with ``semi_supervised``, by FixMatch
  (:mod:`capc.learning.fixmatch`), the jobs' unanswered queries serving as
  unlabelled data beside the answered ones (image tasks with single labels).

The student keeps its own labelled test set (``--test-data``, an .npz with
``x`` and ``y``) to report test accuracy; without one only the training fit
is reported. Unanswered queries (label -1) are left out; for a multi-label
task only queries with every label answered are used.
"""

from __future__ import annotations

import copy
import io
import logging
import math
import queue
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray

from capc.learning import fixmatch
from capc.learning.fixmatch import FixMatchConfig
from capc.learning.last_layer import fit_batch_standardised
from capc.learning.supervised import accuracy, fit
from capc.models import ARCHITECTURES, Teacher, build, save_teacher
from capc.models.inference import features
from capc.models.registry import Classifier
from services.common.limits import MAX_EPOCHS
from services.common.task import TaskConfig
from services.student.store import TERMINAL, JobStore

log = logging.getLogger("capc.student")
#: The architecture name that asks for the DIET student: the pretrained body, last layer fitted.
PRETRAINED = "pretrained"
#: Test images per BatchNorm batch when a pretrained student is evaluated.
TEST_BATCH = 512
#: FixMatch steps per epoch at least, however small the pool.
FIXMATCH_MIN_STEPS_PER_EPOCH = 20


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


def _answered(labels: NDArray[np.int64]) -> NDArray[np.bool_]:
    return np.asarray((labels >= 0).reshape(len(labels), -1).all(axis=1), dtype=bool)


def labelled_examples(
    store: JobStore, job_ids: list[str], task: TaskConfig
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """The answered (query, label) pairs of the named jobs, in job order."""
    xs, ys = [], []
    for job_id in job_ids:
        labels = store.labels(job_id)
        queries = store.queries(job_id)[: len(labels)]
        keep = _answered(labels)
        xs.append(queries[keep])
        ys.append(labels[keep])
    x = np.concatenate(xs) if xs else np.zeros((0, *task.input_shape), dtype=np.float32)
    y = np.concatenate(ys) if ys else np.zeros(0, dtype=np.int64)
    return x, y


def labelled_features(
    store: JobStore, job_ids: list[str], body: Classifier
) -> tuple[torch.Tensor, NDArray[np.int64]]:
    """Features (N, D) and labels of the answered queries of the named jobs.

    Each job's queries are normalised round by round (``batch_size`` queries
    at a time) with their own BatchNorm statistics, as the hospitals
    normalised them when they voted.
    """
    fs, ys = [], []
    for job_id in job_ids:
        job = store.get(job_id)
        labels = store.labels(job_id)
        if job is None or len(labels) == 0:
            continue
        queries = store.queries(job_id)[: len(labels)]
        f = features(body, queries, current_statistics=True, batch=job.batch_size)
        keep = _answered(labels)
        fs.append(f[torch.from_numpy(keep)])
        ys.append(labels[keep])
    if not fs:
        return torch.zeros((0, body.dim)), np.zeros(0, dtype=np.int64)
    return torch.cat(fs), np.concatenate(ys)


class ModelTrainer:
    """Trains queued student models one after another in a background thread."""

    def __init__(
        self,
        store: JobStore,
        task: TaskConfig,
        test_set: tuple[NDArray[np.float32], NDArray[np.int64]] | None = None,
        body: Teacher | None = None,
    ) -> None:
        self.store = store
        self.task = task
        self.test_set = test_set
        self.body = body
        if body is not None and body.input_shape != task.input_shape:
            raise ValueError(
                f"the pretrained body takes inputs {body.input_shape}, the task {task.input_shape}"
            )
        self._queue: queue.Queue[str] = queue.Queue()
        for model_id in store.unfinished_models():
            self._queue.put(model_id)
        threading.Thread(target=self._loop, name="capc-train", daemon=True).start()

    @property
    def default_architecture(self) -> str:
        """What a request naming no architecture gets: the DIET student when there is a body."""
        return PRETRAINED if self.body is not None else "small-cnn"

    def check(
        self, job_ids: list[str], architecture: str, epochs: int, semi_supervised: bool = False
    ) -> None:
        """Refuse a request that cannot train: raises TrainingError with the reason."""
        if not job_ids:
            raise TrainingError("name at least one finished job to train on")
        if semi_supervised and (
            architecture == PRETRAINED or self.task.multi_label or len(self.task.input_shape) != 3
        ):
            raise TrainingError(
                "semi-supervised training (FixMatch) is for image tasks with single labels, "
                "trained from scratch: choose an image architecture such as small-cnn"
            )
        if architecture == PRETRAINED and self.body is None:
            raise TrainingError(
                "this student party has no pretrained body (start it with --body FILE); "
                f"choose an architecture to train from scratch: {', '.join(sorted(ARCHITECTURES))}"
            )
        if architecture not in ARCHITECTURES and architecture != PRETRAINED:
            raise TrainingError(
                f"unknown architecture {architecture!r}; choose from "
                f"{', '.join([PRETRAINED, *sorted(ARCHITECTURES)])}"
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

    def _fit_pretrained(
        self, job_ids: list[str]
    ) -> tuple[Classifier, int, dict[str, object], dict[str, object]]:
        assert self.body is not None
        model = copy.deepcopy(self.body.model)
        f, y = labelled_features(self.store, job_ids, model)
        if len(y) == 0:
            raise TrainingError("the jobs have no fully answered queries")
        if not self.task.multi_label and len(np.unique(y)) < 2:
            raise TrainingError("every answered query has the same label; label more queries")
        # The head standardises each batch by its own statistics at inference, as the
        # body's current statistics do: it was fitted on synthetic queries, not real images.
        model.head = fit_batch_standardised(  # type: ignore[assignment]
            f, y, self.task.outputs, balanced=not self.task.multi_label
        ).to(next(model.parameters()).device)
        with torch.no_grad():
            out = model.head(f.to(next(model.parameters()).device)).cpu()
        pred = (out > 0).long().numpy() if self.task.multi_label else out.argmax(1).numpy()
        metrics: dict[str, object] = {"train_accuracy": float((pred == y).mean())}
        if self.test_set is not None:
            metrics["test_accuracy"] = accuracy(
                model, *self.test_set, current_statistics=True, batch=TEST_BATCH
            )
        card: dict[str, object] = {
            "method": "last layer fitted on the pretrained body (DIET)",
            "body": self.body.card,
            "inference": f"current BatchNorm statistics, batches of up to {TEST_BATCH} inputs; "
            "the head standardises each batch's features by their own statistics",
        }
        return model, len(y), metrics, card

    def _fit_scratch(
        self, job_ids: list[str], architecture: str, epochs: int, seed: int
    ) -> tuple[Classifier, int, dict[str, object], dict[str, object]]:
        x, y = labelled_examples(self.store, job_ids, self.task)
        if len(x) == 0:
            raise TrainingError("the jobs have no fully answered queries")
        model = fit(
            build(architecture, self.task.input_shape, self.task.outputs),
            x,
            y,
            epochs=epochs,
            seed=seed,
        )
        metrics: dict[str, object] = {"train_accuracy": accuracy(model, x, y)}
        if self.test_set is not None:
            metrics["test_accuracy"] = accuracy(model, *self.test_set)
        card: dict[str, object] = {
            "method": "trained from scratch",
            "epochs": epochs,
            "seed": seed,
            "inference": "stored BatchNorm statistics",
        }
        return model, len(x), metrics, card

    def _fit_fixmatch(
        self, job_ids: list[str], architecture: str, epochs: int, seed: int
    ) -> tuple[Classifier, int, dict[str, object], dict[str, object]]:
        x, y = labelled_examples(self.store, job_ids, self.task)
        if len(x) == 0:
            raise TrainingError("the jobs have no fully answered queries")
        pool = np.concatenate([self.store.queries(j) for j in job_ids])
        config = FixMatchConfig(seed=seed)
        # An epoch is a pass over the pool at unlabelled_ratio x batch images a step.
        per_epoch = math.ceil(len(pool) / (config.batch * max(config.unlabelled_ratio, 1)))
        config = replace(config, steps=epochs * max(per_epoch, FIXMATCH_MIN_STEPS_PER_EPOCH))
        torch.manual_seed(seed)
        model = build(architecture, self.task.input_shape, self.task.outputs)
        stats = fixmatch.train(model, x, y, pool, config)
        metrics: dict[str, object] = {
            "train_accuracy": accuracy(model, x, y),
            "unlabelled_examples": len(pool) - len(x),
            "pseudo_labelled_at_end": stats.mask_rates[-1],
        }
        if self.test_set is not None:
            metrics["test_accuracy"] = accuracy(model, *self.test_set)
        card: dict[str, object] = {
            "method": "FixMatch from scratch: answered queries labelled, every query unlabelled",
            "epochs": epochs,
            "steps": config.steps,
            "seed": seed,
            "inference": "stored BatchNorm statistics",
        }
        return model, len(x), metrics, card

    def _train(self, model_id: str) -> None:
        spec = self.store.model(model_id)
        if spec is None:
            return
        self.store.update_model(model_id, state="training")
        start = time.perf_counter()
        jobs = list(spec.job_ids)
        if spec.architecture == PRETRAINED:
            assert self.body is not None
            model, examples, metrics, extra = self._fit_pretrained(jobs)
            architecture, width = self.body.architecture, self.body.width
        else:
            fit = self._fit_fixmatch if spec.semi_supervised else self._fit_scratch
            model, examples, metrics, extra = fit(jobs, spec.architecture, spec.epochs, spec.seed)
            architecture, width = spec.architecture, None
        metrics["examples"] = examples
        if self.test_set is not None:
            metrics["test_examples"] = len(self.test_set[0])
        metrics["seconds"] = time.perf_counter() - start
        outputs = self.task.outputs
        card: dict[str, object] = {
            "kind": "student",
            "task": self.task.name,
            "task_config_hash": self.task.config_hash,
            "architecture": architecture,
            "input_shape": list(self.task.input_shape),
            "outputs": outputs,
            "multi_label": self.task.multi_label,
            "data": f"{examples} queries labelled by the consortium (jobs {', '.join(jobs)}); "
            "unanswered queries left out",
            "mechanism": self.task.mechanism.name,
            "request": {"semi_supervised": spec.semi_supervised},
            **extra,
            "metrics": metrics,
        }
        buf = io.BytesIO()
        save_teacher(
            buf,
            Teacher(
                architecture,
                self.task.input_shape,
                outputs,
                model,
                card,
                device="cpu",
                multi_label=self.task.multi_label,
                width=width,
            ),
        )
        self.store.update_model(
            model_id,
            state="done",
            examples=examples,
            metrics=metrics,
            checkpoint=buf.getvalue(),
            card=card,
        )
        log.info("student model %s trained on %d examples: %s", model_id, examples, metrics)
