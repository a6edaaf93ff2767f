"""Fitting teacher ensembles: one teacher per disjoint part of a hospital's records.

- DIET (:func:`fit_head_ensemble`): every teacher starts from the same body
  (pretrained on synthetic images, so sharing it costs no privacy), takes the
  BatchNorm statistics of its own part and fits only the last layer on its
  labels. The body is stored once: one :class:`capc.models.ensemble.TeacherEnsemble`.
- From scratch (:func:`fit_scratch_teachers`): one whole model per part, one
  :class:`capc.models.Teacher` each.

What an ensemble is, how it is saved and how it predicts: :mod:`capc.models.ensemble`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from capc.learning.last_layer import fit_linear_many
from capc.learning.supervised import fit
from capc.models.checkpoint import Teacher
from capc.models.ensemble import TeacherEnsemble, statistics_of
from capc.models.inference import device_of, features, recalibrate
from capc.models.registry import Classifier, build


def fit_head_ensemble(
    body: Classifier,
    x: NDArray[np.float32],
    y: NDArray[np.integer],
    partitions: Sequence[NDArray[np.int64]],
    *,
    architecture: str,
    width: int | None = None,
    l2: float = 1e-2,
    card: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
) -> TeacherEnsemble:
    """One teacher per index set of ``partitions`` over (N, *shape) ``x`` and (N,) classes
    or (N, k) 0/1 labels ``y``, on ``body`` (built as ``architecture`` at ``width``).

    ``body`` is not changed (its statistics are restored afterwards) and the ensemble holds
    it, not a copy. ``l2``: penalty of each head (see
    :func:`capc.learning.last_layer.fit_linear`); a larger one keeps small hospitals' heads
    from fitting noise. ``card``: the ensemble's model card. ``progress``: called with 1
    each time one teacher's statistics and features are taken (the slow part: a body
    pass over its records), e.g. :meth:`capc.cli_output.Progress.advance`.
    """
    outputs = body.head.out_features
    saved = statistics_of(body)
    stats, feats = [], []
    try:
        for p in partitions:
            if len(p) < 2:
                raise ValueError("every hospital needs at least two examples")
            recalibrate(body, x[p])
            stats.append(statistics_of(body))
            feats.append(features(body, x[p]))
            if progress is not None:
                progress(1)
    finally:
        body.load_state_dict(saved, strict=False)
    # Every head at once: one optimiser run instead of one per teacher.
    weights, biases = fit_linear_many(feats, [y[p] for p in partitions], outputs, l2=l2)
    return TeacherEnsemble(
        architecture,
        tuple(x.shape[1:]),
        outputs,
        body,
        stats,
        weights,
        biases,
        dict(card or {}),
        width=width,
        multi_label=np.ndim(y) == 2,
        device=str(device_of(body)),
    )


def fit_scratch_teachers(
    x: NDArray[np.float32],
    y: NDArray[np.integer],
    partitions: Sequence[NDArray[np.int64]],
    *,
    architecture: str,
    outputs: int,
    width: int | None = None,
    epochs: int = 10,
    seed: int = 0,
    device: str | None = None,
    card: dict[str, Any] | None = None,
    log: Callable[[int, NDArray[np.int64]], None] | None = None,
) -> list[Teacher]:
    """One ``architecture`` model (at ``width``, ``outputs`` classes or labels) trained from
    scratch per index set of ``partitions`` over (N, *shape) ``x`` and (N,) classes or
    (N, k) 0/1 labels ``y``;
    teacher t is trained ``epochs`` epochs with seed ``seed + t`` on ``device`` (None:
    CUDA when present). Each card is ``card`` with the teacher's ``examples``;
    ``log(t, part)`` is called before teacher t is trained."""
    shape = tuple(x.shape[1:])
    teachers = []
    for t, p in enumerate(partitions):
        if log is not None:
            log(t, p)
        model = fit(
            build(architecture, shape, outputs, width),
            x[p],
            y[p],
            epochs=epochs,
            seed=seed + t,
            device=device,
        )
        teachers.append(
            Teacher(
                architecture,
                shape,
                outputs,
                model,
                {**(card or {}), "examples": len(p)},
                device=str(device_of(model)),
                multi_label=np.ndim(y) == 2,
                width=width,
            )
        )
    return teachers
