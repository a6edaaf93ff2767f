"""Student models: trained on the labels of finished jobs, one at a time, off the RPC threads.

Two ways to train:
- ``pretrained`` (DIET): the student's body, pretrained on synthetic images
  (``capc student --body``), stays frozen; only its last layer is fitted to
  the labels, on features taken with each round's own BatchNorm statistics,
  exactly as the hospitals saw the queries: the head of the central-mode
  experiment's best student (batch-standardised, class-balanced, L2 0.01),
  optionally also learning from the jobs' unanswered queries
  (``semi_supervised``). Such a model reads real records under current
  statistics, so before it is stored it takes the statistics of a reference
  batch of unlabelled real records (``--reference-data``, else a batch of the
  querier's own records, ``--own-data``; never the test set;
  :func:`capc.models.inference.reference_statistics`): each of
  its predictions then depends on its own record only.
- an architecture name (``small-cnn``, ``resnet10``, ``mlp``, ...): trained from
  scratch on the labelled queries (a querier in the CaPC loop: its own records,
  ``own_weight`` times, beside them; how a table task's hospital loops); with ``semi_supervised="fixmatch"``, by FixMatch
  (:mod:`capc.learning.fixmatch`), the jobs' unanswered queries serving as
  unlabelled data beside the answered ones (image tasks with single labels).

The semi-supervised methods and which student takes which:
:mod:`capc.learning.semi_supervised`. ``"pseudo-labels"``, the one name the API had for
two of them, is still read, as ``pseudo-label-head`` for a pretrained student and as
``fixmatch`` for one trained from scratch, and the model's options say it is deprecated.

The student keeps its own labelled test set (``--test-data``, an .npz with
``x`` and ``y``) to report test accuracy; without one only the training fit
is reported. Unanswered queries (label -1) are left out of the labels; for a
multi-label task only queries with every label answered are used.
"""

from __future__ import annotations

import copy
import hashlib
import io
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from capc.learning import fixmatch
from capc.learning.fixmatch import FixMatchConfig
from capc.learning.last_layer import fit_linear
from capc.learning.semi_supervised import (
    METHOD_NAMES,
    Trains,
    answered_rows,
    check_method,
    fit_student_head,
)
from capc.learning.supervised import accuracy, fit
from capc.models import ARCHITECTURES, Teacher, build, save_teacher
from capc.models.inference import features, reference_statistics
from capc.models.registry import Classifier
from capc.task_config import TaskConfig
from services.common.limits import MAX_EPOCHS, MAX_OWN_WEIGHT, MAX_REFERENCE_RECORDS
from services.student.store import TERMINAL, JobStore

log = logging.getLogger("capc.student")
#: The architecture name that asks for the DIET student: the pretrained body, last layer fitted.
PRETRAINED = "pretrained"
#: The pretrained student head's L2 penalty unless a request names one: the central-mode
#: experiment's best student at 250 teachers (docs/diet.md) uses it.
STUDENT_L2 = 1e-2
#: The deprecated name of two semi-supervised methods, and the method it is read as for a
#: student that trains its last layer (pretrained) or its whole model (from scratch).
DEPRECATED_SEMI_SUPERVISED: dict[str, dict[Trains, str]] = {
    "pseudo-labels": {"last layer": "pseudo-label-head", "whole model": "fixmatch"},
}
#: Every ``semi_supervised`` a training request may name (capc.learning.semi_supervised).
SEMI_SUPERVISED = (*METHOD_NAMES, *DEPRECATED_SEMI_SUPERVISED)
#: Smallest reference batch: the DIET paper's smallest current-statistics batch.
MIN_REFERENCE_RECORDS = 16
#: The querier's own records per BatchNorm batch when its student is fitted on them.
OWN_BATCH = 512
#: Test images per BatchNorm batch when a pretrained student is evaluated.
TEST_BATCH = 512
#: FixMatch steps per epoch at least, however small the pool.
FIXMATCH_MIN_STEPS_PER_EPOCH = 20


#: A querier's own labelled records: (N, *input_shape) float32 and (N,) classes.
Labelled = tuple[NDArray[np.float32], NDArray[np.int64]]
#: What a fit returns: the model, the examples it learnt from, its metrics and card.
Fitted = tuple[Classifier, int, dict[str, object], dict[str, object]]
#: The "before" model (own records alone): L2 penalties of the logistic regressions it is
#: chosen among, beside the student's default model, as the side-by-side tunes
#: "alone" (experiments/side_by_side/baselines.py: simple models included).
BEFORE_L2 = (1e-3, 1e-2, 1e-1)
#: Share of the own records held out to choose the "before" model (the rest fit the
#: candidates; the chosen one is then refitted on all of them).
BEFORE_HELD_OUT = 0.25
#: Fewest own records a choice is made on; with fewer, the default model is kept.
BEFORE_MIN_RECORDS = 8
#: The default model's name among the "before" candidates.
BEFORE_DEFAULT = "default"


@dataclass(frozen=True)
class TrainingProgress:
    """How far a model's training is: ``done`` of ``total`` ``unit`` (e.g. "epochs")."""

    done: int
    total: int
    unit: str


class TrainingError(ValueError):
    """A training request names no usable jobs or an unknown architecture."""


def _before_name(candidate: str, architecture: str) -> str:
    """A "before" candidate as the loop's display names it: the default model by its
    architecture ("the student's default model (resnet10)")."""
    if candidate == BEFORE_DEFAULT:
        return f"the student's default model ({architecture})"
    return candidate


def trains(architecture: str) -> Trains:
    """What a student of ``architecture`` trains: the last layer of the pretrained body, or
    a whole model from scratch."""
    return "last layer" if architecture == PRETRAINED else "whole model"


@dataclass(frozen=True)
class TrainingOptions:
    """How a student is fitted: a pretrained student's head's L2 penalty (per unit of mean
    loss) and the semi-supervised method that also learns from unanswered queries
    (:mod:`capc.learning.semi_supervised`). ``deprecated``: set when the request named a
    deprecated method, saying what it was read as and what to name instead.
    ``own_weight``: how many times a querier's own labelled records enter a pretrained
    student's fit beside the bought labels (the CaPC loop; an integer in
    [1, :data:`MAX_OWN_WEIGHT`], 1: once each, as every bought label)."""

    l2: float = STUDENT_L2
    semi_supervised: str = "none"
    deprecated: str = ""
    own_weight: int = 1

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.deprecated:
            del out["deprecated"]
        if self.own_weight == 1:  # the default is left out, as models stored before it
            del out["own_weight"]
        return out

    @classmethod
    def parse(
        cls, l2: float, semi_supervised: str, architecture: str, own_weight: int = 0
    ) -> TrainingOptions:
        """From a request for a student of ``architecture``: 0 and "" mean the defaults;
        TrainingError says what is wrong."""
        mode = semi_supervised or "none"
        if mode not in SEMI_SUPERVISED:
            raise TrainingError(
                f"semi_supervised must be one of {', '.join(SEMI_SUPERVISED)}, got {mode!r}"
            )
        if not (l2 == 0 or 1e-8 <= l2 <= 1e3):
            raise TrainingError(f"l2 must lie in [1e-8, 1000] (0: the default), got {l2}")
        return cls(
            float(l2) or STUDENT_L2, mode, own_weight=checked_own_weight(own_weight)
        ).resolved(architecture)

    def resolved(self, architecture: str) -> TrainingOptions:
        """These options with a deprecated method read as the method it means for a student
        of ``architecture`` (and :attr:`deprecated` saying so); the same options otherwise."""
        aliases = DEPRECATED_SEMI_SUPERVISED.get(self.semi_supervised)
        if aliases is None:
            return self
        kind = trains(architecture)
        method = aliases[kind]
        meanings = " or ".join(f'"{m}" (a student that trains its {t})' for t, m in aliases.items())
        note = (
            f'semi_supervised "{self.semi_supervised}" is deprecated: it was read as '
            f'"{method}", as this student trains its {kind}; name {meanings} instead'
        )
        return replace(self, semi_supervised=method, deprecated=note)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, architecture: str) -> TrainingOptions:
        """Options as stored with a model of ``architecture`` (a deprecated method stored
        before it was renamed is read as :meth:`resolved` reads it)."""
        return (cls(**d) if d else cls()).resolved(architecture)


def checked_own_weight(k: object) -> int:
    """``k`` as an own-records weight: an integer in [1, :data:`MAX_OWN_WEIGHT`], or 0 for
    the default, 1. TrainingError says what is wrong (a float, a bool, out of range)."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise TrainingError(f"own_weight must be an integer, got {k!r}")
    if not 0 <= k <= MAX_OWN_WEIGHT:
        raise TrainingError(
            f"own_weight must lie in [1, {MAX_OWN_WEIGHT}] (0: the default, 1), got {k}"
        )
    return int(k) or 1


def load_reference(path: Path, task: TaskConfig) -> NDArray[np.float32]:
    """Unlabelled records (an .npz with ``x``, or an .npy) whose statistics a pretrained
    student stores: (R, *input_shape) float32, R in [16, MAX_REFERENCE_RECORDS]."""
    try:
        if path.suffix == ".npy":
            x = np.asarray(np.load(path, allow_pickle=False), dtype=np.float32)
        else:
            with np.load(path, allow_pickle=False) as data:
                x = np.asarray(data["x"], dtype=np.float32)
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"{path}: not an .npy, or an .npz with an array x ({err})") from err
    return checked_reference(x, task, str(path))


def checked_reference(x: NDArray[np.float32], task: TaskConfig, what: str) -> NDArray[np.float32]:
    if x.shape[1:] != task.input_shape:
        raise ValueError(
            f"{what}: reference records must be (R, {', '.join(map(str, task.input_shape))}), got {x.shape}"
        )
    if not MIN_REFERENCE_RECORDS <= len(x) <= MAX_REFERENCE_RECORDS:
        raise ValueError(
            f"{what}: a reference batch takes {MIN_REFERENCE_RECORDS} to "
            f"{MAX_REFERENCE_RECORDS} records, got {len(x)}"
        )
    if not np.isfinite(x).all():
        raise ValueError(f"{what}: the reference records contain NaN or infinity")
    return x


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
        keep = answered_rows(labels)
        xs.append(queries[keep])
        ys.append(labels[keep])
    x = np.concatenate(xs) if xs else np.zeros((0, *task.input_shape), dtype=np.float32)
    y = np.concatenate(ys) if ys else np.zeros(0, dtype=np.int64)
    return x, y


@dataclass(frozen=True)
class JobFeatures:
    """Every query of the named jobs: ``queries`` (N, *input_shape), their ``features``
    (N, D) and ``labels`` ((N,) or (N, k); -1 where not answered or not yet processed)."""

    queries: NDArray[np.float32]
    features: torch.Tensor
    labels: NDArray[np.int64]

    @property
    def answered(self) -> NDArray[np.bool_]:
        return answered_rows(self.labels)


def _after(on_read: Callable[[int, int], None], before: int, total: int) -> Callable[[int], None]:
    """A job's batch progress (its queries done) as the jobs' (``before`` + that, of
    ``total``)."""

    def report(done: int) -> None:
        on_read(min(before + done, total), total)

    return report


def job_features(
    store: JobStore,
    job_ids: list[str],
    body: Classifier,
    shape: tuple[int, ...],
    unanswered: bool = False,
    on_read: Callable[[int, int], None] | None = None,
) -> JobFeatures:
    """Features and labels of the answered queries of the named jobs, and with
    ``unanswered`` of the others too (those the mechanism declined, and those the
    budget never reached). ``on_read`` hears (queries read, of how many) after each
    batch: reading them through the body is most of a DIET student's training.

    Each job's queries are normalised round by round (``batch_size`` queries
    at a time) with their own BatchNorm statistics, as the hospitals
    normalised them when they voted.
    """
    xs, fs, ys = [], [], []
    jobs = [j for j in (store.get(i) for i in job_ids) if j is not None]
    total = sum(j.requested if unanswered else j.processed for j in jobs)
    read = 0
    for job_id in job_ids:
        job = store.get(job_id)
        labels = store.labels(job_id)
        if job is None or len(labels) == 0:
            continue
        queries = store.queries(job_id)
        if not unanswered:
            queries = queries[: len(labels)]
        pad = np.full((len(queries) - len(labels), *labels.shape[1:]), -1, dtype=np.int64)
        labels = np.concatenate([labels, pad])
        f = features(
            body,
            queries,
            current_statistics=True,
            batch=job.batch_size,
            on_batch=None if on_read is None else _after(on_read, read, total),
        )
        read += len(queries)
        keep = np.ones(len(labels), dtype=bool) if unanswered else answered_rows(labels)
        xs.append(queries[keep])
        fs.append(f[torch.from_numpy(keep)])
        ys.append(labels[keep])
    if not fs:
        return JobFeatures(
            np.zeros((0, *shape), dtype=np.float32),
            torch.zeros((0, body.dim)),
            np.zeros(0, dtype=np.int64),
        )
    return JobFeatures(np.concatenate(xs), torch.cat(fs), np.concatenate(ys))


class ModelTrainer:
    """Trains queued student models one after another in a background thread."""

    def __init__(
        self,
        store: JobStore,
        task: TaskConfig,
        test_set: tuple[NDArray[np.float32], NDArray[np.int64]] | None = None,
        body: Teacher | None = None,
        reference: NDArray[np.float32] | None = None,
        own: tuple[NDArray[np.float32], NDArray[np.int64]] | None = None,
        on_progress: Callable[[str, TrainingProgress], None] | None = None,
    ) -> None:
        """``on_progress`` hears each progress report (model id, progress), in the
        training thread, as :meth:`progress` starts to return it."""
        self.store = store
        self.task = task
        self.test_set = test_set
        self.body = body
        #: The querier's own labelled records (a hospital in the CaPC loop), or None.
        self.own = own
        if reference is None and own is not None and body is not None:
            # Unlabelled use of the querier's own records: a batch of them, at random. The
            # test set never stands in: it would no longer be held out.
            order = np.random.default_rng(0).permutation(len(own[0]))
            reference = own[0][order[:MAX_REFERENCE_RECORDS]]
        self.reference = (
            None if reference is None else checked_reference(reference, task, "reference")
        )
        if body is not None and body.input_shape != task.input_shape:
            raise ValueError(
                f"the pretrained body takes inputs {body.input_shape}, the task {task.input_shape}"
            )
        self.on_progress = on_progress
        # The model in training (one at a time, in the training thread) and how far it
        # is; read by the servicer's threads.
        self._lock = threading.Lock()
        self._progress: dict[str, TrainingProgress] = {}
        self._current: str | None = None
        # Off while the loop's "before" reports its candidate fits instead of epochs.
        self._epochs_shown = True
        self._queue: queue.Queue[str] = queue.Queue()
        for model_id in store.unfinished_models():
            self._queue.put(model_id)
        threading.Thread(target=self._loop, name="capc-train", daemon=True).start()

    @property
    def default_architecture(self) -> str:
        """What a request naming no architecture gets: the DIET student when there is a body,
        else an MLP for table rows ((width,) inputs) and a small CNN for images."""
        if self.body is not None:
            return PRETRAINED
        return "mlp" if len(self.task.input_shape) == 1 else "small-cnn"

    def check(
        self,
        job_ids: list[str],
        architecture: str,
        epochs: int,
        options: TrainingOptions | None = None,
    ) -> None:
        """Refuse a request that cannot train: raises TrainingError with the reason."""
        options = options or TrainingOptions()
        if not job_ids and self.own is None:
            raise TrainingError("name at least one finished job to train on")
        if architecture == PRETRAINED and self.body is None:
            raise TrainingError(
                "this student party has no pretrained body (start it with --body FILE); "
                f"choose an architecture to train from scratch: {', '.join(sorted(ARCHITECTURES))}"
            )
        if architecture == PRETRAINED and self.reference is None:
            raise TrainingError(
                "a pretrained student reads records under current statistics and needs a "
                "reference batch of unlabelled records to predict one record at a time: start "
                "the student party with --reference-data FILE (256 real unlabelled records drawn "
                "as deployed inputs are, .npz with x)"
            )
        if self.own is not None and options.semi_supervised == "fixmatch":
            raise TrainingError(
                "a querier's own labelled records (--own-data) enter a pretrained student's or "
                "a supervised student's fit, not FixMatch's: choose semi_supervised none"
            )
        if options.own_weight != 1 and self.own is None:
            raise TrainingError(
                f"own_weight {options.own_weight} weights a querier's own labelled records in "
                "its student's fit (the CaPC loop); this student party has none (start it "
                "with --own-data): leave own_weight out or at 1"
            )
        if options.semi_supervised != "none" and self.task.multi_label:
            raise TrainingError("semi_supervised applies to single-label tasks only")
        try:
            check_method(options.semi_supervised, trains(architecture))
        except ValueError as err:
            raise TrainingError(str(err)) from None
        if options.semi_supervised == "fixmatch" and len(self.task.input_shape) != 3:
            raise TrainingError(
                "FixMatch's augmentations are for images (C, H, W): choose semi_supervised "
                "none for this task"
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

    def progress(self, model_id: str) -> TrainingProgress | None:
        """How far ``model_id``'s training is; None when it is not training or its step
        reports no progress."""
        with self._lock:
            return self._progress.get(model_id)

    def _report(self, done: int, total: int, unit: str) -> None:
        """The model in training has done ``done`` of ``total`` ``unit``."""
        if unit == "epochs" and not self._epochs_shown:
            return
        model_id = self._current
        if model_id is None:
            return
        now = TrainingProgress(done, total, unit)
        with self._lock:
            self._progress[model_id] = now
        if self.on_progress is not None:
            self.on_progress(model_id, now)

    def _loop(self) -> None:
        while True:
            model_id = self._queue.get()
            self._current = model_id
            try:
                self._train(model_id)
            except Exception as err:  # a failed model is reported, the trainer keeps serving
                log.exception("training model %s failed", model_id)
                self.store.update_model(model_id, state="failed", error=str(err))
            finally:
                self._current = None
                self._epochs_shown = True
                with self._lock:
                    self._progress.pop(model_id, None)

    def _head(
        self,
        model: Classifier,
        job_ids: list[str],
        options: TrainingOptions,
        seed: int,
        own: Labelled | None,
    ) -> tuple[torch.nn.Module, torch.Tensor, NDArray[np.int64], int]:
        """The fitted head, the answered features and labels, and the unanswered queries
        used; ``own``: the querier's own labelled records that enter the fit, if any."""
        jf = job_features(
            self.store,
            job_ids,
            model,
            self.task.input_shape,
            unanswered=options.semi_supervised != "none",
            on_read=lambda done, total: self._report(done, total, "queries read"),
        )
        answered = jf.answered
        f, y = jf.features[torch.from_numpy(answered)], jf.labels[answered]
        if own is not None:
            # The CaPC loop: the querier's own records with the labels the consortium gave.
            own_x, own_y = own
            order = np.random.default_rng(1).permutation(len(own_x))
            own_f = features(model, own_x[order], current_statistics=True, batch=OWN_BATCH)
            f, y = torch.cat([own_f, f]), np.concatenate([own_y[order], y])
            # own_weight k: each own record enters the fit k times (its features taken
            # once, so the copies are identical), weighing k bought labels' worth.
            k = options.own_weight
            jf = JobFeatures(
                np.concatenate([*[own_x[order]] * k, jf.queries]),
                torch.cat([*[own_f] * k, jf.features]),
                np.concatenate([*[own_y[order]] * k, jf.labels]),
            )
            answered = jf.answered
        if len(y) == 0:
            raise TrainingError("the jobs have no fully answered queries")
        if not self.task.multi_label and len(np.unique(y)) < 2:
            raise TrainingError("every answered query has the same label; label more queries")
        sizes = [j.batch_size for j in map(self.store.get, job_ids) if j is not None]
        head = fit_student_head(
            options.semi_supervised,
            model,
            jf.features,
            jf.labels,
            jf.queries,
            self.task.outputs,
            batch=min(sizes, default=OWN_BATCH),
            l2=options.l2,
            seed=seed,
        )
        # The head standardises each batch by its own statistics under current statistics,
        # as the body does: it was fitted on synthetic queries, not real images.
        return head, f, y, int((~answered).sum())

    def _fit_pretrained(
        self,
        job_ids: list[str],
        options: TrainingOptions,
        seed: int,
        own: Labelled | None,
        test: Labelled | None,
    ) -> Fitted:
        assert self.body is not None
        if self.reference is None:
            raise TrainingError("no reference batch: start the student with --reference-data")
        model = copy.deepcopy(self.body.model)
        head, f, y, unused = self._head(model, job_ids, options, seed, own)
        dev = next(model.parameters()).device
        model.head = head.to(dev)  # type: ignore[assignment]
        with torch.no_grad():
            out = model.head.eval()(f.to(dev)).cpu()
        pred = (out > 0).long().numpy() if self.task.multi_label else out.argmax(1).numpy()
        metrics: dict[str, object] = {"train_accuracy": float((pred == y).mean())}
        if unused:
            metrics["unanswered_queries_used"] = unused
        # From here on a record is read through the reference batch's statistics, so
        # what the model says about it does not depend on what else it is asked.
        reference_statistics(model, self.reference)
        if test is not None:
            metrics["test_accuracy"] = accuracy(model, *test)
        digest = hashlib.sha256(np.ascontiguousarray(self.reference).tobytes()).hexdigest()
        card: dict[str, object] = {
            "method": "last layer fitted on the pretrained body (DIET)",
            "body": self.body.card,
            "training": options.to_dict(),
            "reference": {"records": len(self.reference), "sha256": digest},
            "inference": "stored statistics of a reference batch of "
            f"{len(self.reference)} unlabelled records (the statistics current-statistics "
            "inference would take from a batch of them, head included): a record's "
            "prediction depends on that record alone, in a batch of one as in a batch of many",
        }
        return model, len(y), metrics, card

    def _fit_scratch(
        self,
        job_ids: list[str],
        architecture: str,
        epochs: int,
        seed: int,
        options: TrainingOptions | None,
        own: Labelled | None,
        test: Labelled | None,
    ) -> Fitted:
        x, y = labelled_examples(self.store, job_ids, self.task)
        if own is not None:
            # The CaPC loop without a body (a table task): the querier's own records, each
            # ``own_weight`` times, then the labels the consortium gave, in one fit.
            k = (options or TrainingOptions()).own_weight
            own_x, own_y = own
            order = np.random.default_rng(1).permutation(len(own_x))
            x = np.concatenate([*[own_x[order]] * k, x])
            y = np.concatenate([*[own_y[order].astype(np.int64)] * k, y])
        if len(x) == 0:
            raise TrainingError("the jobs have no fully answered queries")
        # A model's initial weights come from torch's global generator (``fit`` seeds only
        # its batches): seeded, so the same request makes the same model.
        torch.manual_seed(seed)
        model = fit(
            build(architecture, self.task.input_shape, self.task.outputs),
            x,
            y,
            epochs=epochs,
            seed=seed,
            on_epoch=lambda done: self._report(done, epochs, "epochs"),
        )
        metrics: dict[str, object] = {"train_accuracy": accuracy(model, x, y)}
        if test is not None:
            metrics["test_accuracy"] = accuracy(model, *test)
        card: dict[str, object] = {
            "method": "trained from scratch",
            "epochs": epochs,
            "seed": seed,
            "inference": "stored BatchNorm statistics",
        }
        if own is not None:
            card["training"] = (options or TrainingOptions()).to_dict()
            card["own_records"] = len(own[0])
        return model, len(x), metrics, card

    def _fit_logistic(self, own: Labelled, test: Labelled | None, l2: float) -> Fitted:
        """Logistic regression on the raw records (flattened; standardised, the
        standardisation folded into the layer), penalty ``l2``: the simplest model a
        hospital can fit on its own labelled records."""
        x, y = own
        if len(np.unique(y)) < 2:
            raise TrainingError("the own records have one class only")
        model = build("linear", self.task.input_shape, self.task.outputs)
        flat = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32).reshape(len(x), -1))
        model.head = fit_linear(flat, y, self.task.outputs, l2=l2)
        metrics: dict[str, object] = {"train_accuracy": accuracy(model, x, y)}
        if test is not None:
            metrics["test_accuracy"] = accuracy(model, *test)
        card: dict[str, object] = {
            "method": f"logistic regression on the raw records (standardised, L2 {l2:g})",
            "inference": "no statistics: a linear layer on the flattened record",
        }
        return model, len(x), metrics, card

    def _fit_before(
        self, architecture: str, epochs: int, seed: int, options: TrainingOptions
    ) -> tuple[Fitted, str, int | None]:
        """The querier's best model of its own labelled records alone (the loop's
        "before"): the default model (``architecture``) and logistic regressions at
        :data:`BEFORE_L2`, each fitted on the same :data:`BEFORE_HELD_OUT`-smaller part
        of the own records and scored on the rest; the best (the default on a tie) is
        refitted on all of them. The choice uses the own records only, never the test
        set, so the test accuracy stays an honest estimate. Returns the fit, its
        architecture and width."""
        assert self.own is not None
        default_arch, default_width = architecture, None
        if architecture == PRETRAINED:
            assert self.body is not None  # checked when the request was accepted
            default_arch, default_width = self.body.architecture, self.body.width

        def default(own: Labelled, test: Labelled | None) -> Fitted:
            if architecture == PRETRAINED:
                return self._fit_pretrained([], options, seed, own, test)
            return self._fit_scratch([], architecture, epochs, seed, options, own, test)

        def logistic(l2: float) -> Any:
            return lambda own, test: self._fit_logistic(own, test, l2)

        candidates = {BEFORE_DEFAULT: default} | {
            f"logistic regression, L2 {l2:g}": logistic(l2) for l2 in BEFORE_L2
        }
        x, y = self.own
        n = len(x)
        if n < BEFORE_MIN_RECORDS or self.task.multi_label:
            fitted = default(self.own, self.test_set)
            fitted[2]["before_model"] = _before_name(BEFORE_DEFAULT, default_arch)
            return fitted, default_arch, default_width
        order = np.random.default_rng(seed).permutation(n)
        held = max(2, round(n * BEFORE_HELD_OUT))
        part: Labelled = (x[order[held:]], y[order[held:]])
        check: Labelled = (x[order[:held]], y[order[:held]])
        scores: dict[str, float | None] = {}
        # Progress counts fits: each candidate's, then the chosen one's on all records.
        fits = len(candidates) + 1
        self._epochs_shown = False
        for i, (name, make) in enumerate(candidates.items()):
            try:
                scores[name] = float(make(part, check)[2]["test_accuracy"])
            except (TrainingError, ValueError, RuntimeError) as err:
                log.info("before-model candidate %s not fitted: %s", name, err)
                scores[name] = None
            self._report(i + 1, fits, "candidate fits")
        scored = {k: v for k, v in scores.items() if v is not None}
        # The default first: it wins a tie.
        best = max(scored, key=lambda k: scored[k]) if scored else BEFORE_DEFAULT
        fitted = candidates[best](self.own, self.test_set)
        self._report(fits, fits, "candidate fits")
        self._epochs_shown = True
        chosen = _before_name(best, default_arch)
        fitted[2]["before_model"] = chosen
        fitted[2]["before_choice"] = {_before_name(k, default_arch): v for k, v in scores.items()}
        fitted[3]["before_choice"] = {
            "chosen": chosen,
            "held_out_own_records": held,
            "rule": f"the best accuracy on {held} of the {n} own records held out, the "
            "candidates fitted on the rest (the default on a tie); then refitted on all",
            "accuracy_on_held_out": fitted[2]["before_choice"],
        }
        if best == BEFORE_DEFAULT:
            return fitted, default_arch, default_width
        return fitted, "linear", None

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
        stats = fixmatch.train_fixmatch(
            model,
            x,
            y,
            pool,
            config,
            on_step=lambda done: self._report(done, config.steps, "steps"),
        )
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
        options = TrainingOptions.from_dict(self.store.model_options(model_id), spec.architecture)
        if not jobs and self.own is not None and options.semi_supervised == "none":
            # The loop's "before": the best the hospital can do on its own records.
            before, architecture, width = self._fit_before(
                spec.architecture, spec.epochs, spec.seed, options
            )
            model, examples, metrics, extra = before
        elif spec.architecture == PRETRAINED:
            assert self.body is not None
            model, examples, metrics, extra = self._fit_pretrained(
                jobs, options, spec.seed, self.own, self.test_set
            )
            architecture, width = self.body.architecture, self.body.width
        else:
            if options.semi_supervised == "fixmatch":
                fitted = self._fit_fixmatch(jobs, spec.architecture, spec.epochs, spec.seed)
            else:
                fitted = self._fit_scratch(
                    jobs,
                    spec.architecture,
                    spec.epochs,
                    spec.seed,
                    options,
                    self.own,
                    self.test_set,
                )
            model, examples, metrics, extra = fitted
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
            "data": f"{examples} labelled records: "
            + (f"{len(self.own[0])} of the querier's own, " if self.own is not None else "")
            + f"queries labelled by the consortium (jobs {', '.join(jobs) or 'none'}); "
            "unanswered queries left out",
            "mechanism": self.task.mechanism.name,
            "options": options.to_dict(),
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
