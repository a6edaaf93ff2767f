"""A hospital's teachers from its own records (``capc teacher fit``).

The records are split into a held-out part (stratified by class) and N
disjoint teacher parts: a record sits in one part, so it moves one
teacher's vote, which is what the ledger charges a hospital for. Images get
DIET teachers (the shared pretrained body with each part's own BatchNorm
statistics and last layer, one ensemble checkpoint); tables get N ``mlp``
teachers trained from scratch (one checkpoints file). Each teacher's
accuracy on the held-out part, and that of their majority vote, goes to the
report and the checkpoint's card.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from capc.cli_output import Progress
from capc.data.readers import Records
from capc.learning.teachers import fit_head_ensemble, fit_scratch_teachers
from capc.models.checkpoint import Teacher, load_teacher
from capc.models.ensemble import TeacherEnsemble, Voters
from capc.models.registry import Classifier, build

#: Share of the records held out to measure the teachers.
HELD_OUT = 0.2
#: Fewest records one teacher's part may have.
MIN_PER_TEACHER = 2

Log = Callable[[str], None]


@dataclass(frozen=True)
class Split:
    """Index sets into the records: one disjoint part per teacher, and the held-out part."""

    parts: list[NDArray[np.int64]]
    held_out: NDArray[np.int64]


def split(y: NDArray[np.int64], teachers: int, held_out: float = HELD_OUT, seed: int = 0) -> Split:
    """``held_out`` of each class's records held out (at least one of a class with two or
    more), the rest shuffled into ``teachers`` disjoint parts of near-equal size."""
    if not 0.0 <= held_out < 1.0:
        raise ValueError(f"the held-out share must be in [0, 1), got {held_out}")
    rng = np.random.default_rng(seed)
    held: list[NDArray[np.int64]] = []
    rest: list[NDArray[np.int64]] = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n = round(held_out * len(idx))
        if held_out > 0 and len(idx) >= 2:
            n = max(n, 1)
        held.append(idx[:n])
        rest.append(idx[n:])
    train = rng.permutation(np.concatenate(rest))
    if len(train) < MIN_PER_TEACHER * teachers:
        raise ValueError(
            f"{teachers} teachers need at least {MIN_PER_TEACHER * teachers} records besides the "
            f"held-out ones, there are {len(train)}: use fewer --teachers"
        )
    parts = [p.astype(np.int64) for p in np.array_split(train, teachers)]
    return Split(parts, np.sort(np.concatenate(held)).astype(np.int64))


@dataclass(frozen=True)
class Fitted:
    """The teachers and how they did: ``accuracy`` per teacher and of the majority vote on
    the ``held_out`` records (None when nothing was held out)."""

    members: TeacherEnsemble | list[Teacher]
    sizes: list[int]
    held_out: int
    accuracy: list[float] | None
    majority: float | None


def majority(predictions: NDArray[np.int64], classes: int) -> NDArray[np.int64]:
    """The most voted class of each row of (N, T) predictions (ties: the lower class)."""
    counts = np.zeros((len(predictions), classes), dtype=np.int64)
    np.add.at(counts, (np.arange(len(predictions))[:, None], predictions), 1)
    out: NDArray[np.int64] = counts.argmax(axis=1)
    return out


def scores(
    predictions: NDArray[np.int64], y: NDArray[np.int64], classes: int
) -> tuple[list[float] | None, float | None]:
    """Accuracy of each teacher's column of (N, T) ``predictions``, and of their majority."""
    if len(y) == 0:
        return None, None
    each = [float((predictions[:, t] == y).mean()) for t in range(predictions.shape[1])]
    return each, float((majority(predictions, classes) == y).mean())


def body_for(path: Path, input_shape: tuple[int, ...], classes: int) -> tuple[Teacher, Classifier]:
    """The shared body at ``path`` (a teacher checkpoint) with a fresh head of ``classes``
    outputs; ValueError when its input shape is not the task's."""
    base = load_teacher(path)
    if base.input_shape != input_shape:
        raise ValueError(
            f"the body {path} takes inputs of shape {list(base.input_shape)}, the task "
            f"{list(input_shape)}: pretrain a body for this task's shape (capc diet pretrain) "
            "and pass it with --body"
        )
    model = build(base.architecture, input_shape, classes, base.width)
    # Every weight but the head's: the head is the one thing each teacher fits.
    state = {k: v for k, v in base.model.state_dict().items() if not k.startswith("head.")}
    model.load_state_dict(state, strict=False)
    return base, model


def fit_diet(
    records: Records,
    plan: Split,
    body: tuple[Teacher, Classifier],
    name: str,
    card: dict[str, Any],
    log: Log,
) -> Fitted:
    """DIET teachers: the shared ``body`` (from :func:`body_for`; ``name``: its file, for the
    card) with each part's own statistics and last layer."""
    base, model = body
    classes = model.head.out_features
    model.to("cpu")
    log(f"fitting {len(plan.parts)} last layers on the shared body {name}")
    ensemble = fit_head_ensemble(
        model,
        records.x,
        records.y,
        plan.parts,
        architecture=base.architecture,
        width=base.width,
        progress=Progress("teachers' statistics and features", len(plan.parts), say=log).advance,
    )
    held = plan.held_out
    predictions = (
        ensemble.predict(records.x[held], current_statistics=False)
        if len(held)
        else np.zeros((0, len(plan.parts)), dtype=np.int64)
    )
    each, vote = scores(predictions, records.y[held], classes)
    ensemble.card = {
        **card,
        "method": (
            f"pretrained body {name}; {len(plan.parts)} teachers, each with the BatchNorm "
            "statistics and last layer of its own disjoint part of the data"
        ),
        "teachers": len(plan.parts),
        "held_out": {"records": len(held), "accuracy": each, "majority_vote": vote},
    }
    return Fitted(ensemble, [len(p) for p in plan.parts], len(held), each, vote)


def fit_scratch(
    records: Records,
    plan: Split,
    classes: int,
    card: dict[str, Any],
    log: Log,
    *,
    architecture: str = "mlp",
    epochs: int = 30,
    seed: int = 0,
) -> Fitted:
    """``architecture`` teachers trained from scratch, one per part."""
    held = plan.held_out
    count = len(plan.parts)
    progress = Progress("teachers trained", count, say=log)

    def starting(t: int, idx: NDArray[np.int64]) -> None:
        # Called as teacher t starts: the t before it are done.
        if t:
            progress.advance()
        log(f"training {architecture} teacher {t + 1}/{count} on {len(idx)} records")

    teachers = fit_scratch_teachers(
        records.x,
        records.y,
        plan.parts,
        architecture=architecture,
        outputs=classes,
        epochs=epochs,
        seed=seed * 1000,
        device="cpu",
        card=card,
        log=starting,
    )
    progress.advance()
    predictions = (
        Voters(teachers).predict(records.x[held])
        if len(held)
        else np.zeros((0, count), dtype=np.int64)
    )
    each, vote = scores(predictions, records.y[held], classes)
    for t, teacher in enumerate(teachers):
        teacher.card.update(
            method=f"{architecture} trained from scratch on its own disjoint part of the data",
            teacher=t,
            teachers=len(teachers),
            held_out={
                "records": len(held),
                "accuracy": None if each is None else each[t],
                "majority_vote": vote,
            },
        )
    return Fitted(teachers, [len(p) for p in plan.parts], len(held), each, vote)
