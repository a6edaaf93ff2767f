"""A student that also learns from the queries nobody answered: the semi-supervised
methods, each under a name that says what it does, and the one trainer of a pretrained
student's last layer.

| name | trains | what it does |
|---|---|---|
| ``none`` | either | the answered queries only |
| ``self-training`` | last layer | refits the head with its own confident predictions on the unanswered queries (:func:`self_train_linear`) |
| ``pseudo-label-head`` | last layer | refits the head with strongly augmented views of the unanswered queries it predicts confidently, labelled with that prediction (:func:`pseudo_label_head`) |
| ``fixmatch`` | whole model | trains a model from scratch by FixMatch, every query unlabelled as well (:func:`capc.learning.fixmatch.train_fixmatch`; images only) |

A last-layer method needs a pretrained body (DIET); ``fixmatch`` a model trained from
scratch. :func:`check_method` says which names a student takes. Every method's
pseudo-labels are a function of the released labels and of the queries only:
post-processing, no privacy cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.learning.augment import Augmentation, augment
from capc.learning.last_layer import fit_batch_standardised
from capc.models.inference import features
from capc.models.registry import Classifier

#: What a method trains: the last layer of a pretrained body, or a whole model from scratch.
Trains = Literal["last layer", "whole model"]


@dataclass(frozen=True)
class SemiSupervisedMethod:
    """A method by its request name: the students it ``trains`` and what it does."""

    name: str
    trains: tuple[Trains, ...]
    summary: str


#: Every method, in the order the options list them.
METHODS: tuple[SemiSupervisedMethod, ...] = (
    SemiSupervisedMethod("none", ("last layer", "whole model"), "the answered queries only"),
    SemiSupervisedMethod(
        "self-training",
        ("last layer",),
        "the head refitted with its own confident predictions on the unanswered queries",
    ),
    SemiSupervisedMethod(
        "pseudo-label-head",
        ("last layer",),
        "the head refitted with strongly augmented views of the unanswered queries it "
        "predicts confidently, labelled with that prediction",
    ),
    SemiSupervisedMethod(
        "fixmatch",
        ("whole model",),
        "a model trained from scratch by FixMatch, every query unlabelled as well (images)",
    ),
)
#: Every method's name.
METHOD_NAMES: tuple[str, ...] = tuple(m.name for m in METHODS)


def method_names(trains: Trains) -> tuple[str, ...]:
    """The names of the methods for a student whose ``trains`` is its last layer or whole."""
    return tuple(m.name for m in METHODS if trains in m.trains)


def check_method(name: str, trains: Trains) -> str:
    """``name`` when it is a method for a student that ``trains`` its last layer or its whole
    model; ValueError naming the choices otherwise."""
    if name not in METHOD_NAMES:
        raise ValueError(
            f"unknown semi-supervised method {name!r}; choose one of {', '.join(METHOD_NAMES)}"
        )
    fits = method_names(trains)
    if name not in fits:
        raise ValueError(
            f"semi-supervised method {name!r} does not train a {trains}: a student that "
            f"trains its {trains} takes {', '.join(fits)}"
        )
    return name


def self_train_linear(
    feats: torch.Tensor,
    labels: NDArray[np.integer],
    outputs: int,
    *,
    l2: float = 1e-3,
    confidence: float = 0.9,
    rounds: int = 2,
) -> nn.Sequential:
    """``self-training``: a balanced :func:`fit_batch_standardised` head fitted to the
    answered rows of ``labels`` (-1: not answered), then refitted ``rounds`` times with its
    own confident predictions on the other rows.

    ``feats``: (N, D) features of every query, answered or not; ``confidence``: the
    smallest softmax probability a pseudo-label needs.
    """
    y = np.asarray(labels)
    answered = y >= 0
    if answered.sum() == 0:
        raise ValueError("no answered query to fit on")
    f = torch.as_tensor(feats, dtype=torch.float32).cpu()
    head = fit_batch_standardised(f[answered], y[answered], outputs, l2=l2, balanced=True)
    for _ in range(rounds):
        with torch.no_grad():
            prob = torch.softmax(head(f), dim=1)
        conf, pred = prob.max(dim=1)
        use = answered | (conf.numpy() >= confidence)
        target = np.where(answered, y, pred.numpy())
        head = fit_batch_standardised(f[use], target[use], outputs, l2=l2, balanced=True)
    return head


def pseudo_label_head(
    body: Classifier,
    labelled_features: torch.Tensor,
    labels: NDArray[np.int64],
    unlabelled: NDArray[np.float32],
    outputs: int,
    *,
    batch: int,
    l2: float = 1e-2,
    confidence: float = 0.95,
    rounds: int = 2,
    seed: int = 0,
    augmentation: Augmentation | None = None,
) -> nn.Sequential:
    """``pseudo-label-head``: the FixMatch idea for a linear head on a frozen body.

    A balanced :func:`fit_batch_standardised` head fitted to (N, D) ``labelled_features``
    and their (N,) ``labels``, then refitted ``rounds`` times with strong views (random
    crops, rotations, flips, contrast, noise: :mod:`capc.learning.augment`) of the
    (M, *input_shape) ``unlabelled`` queries whose weak view (the query as it is) it
    predicts with probability ``confidence`` or more, labelled with that prediction.
    Unlike FixMatch it trains no body, keeps no exponential moving average and fits the
    head by L-BFGS each round (a convex problem) rather than by SGD on mixed batches.

    Features come from ``body`` under current statistics in batches of ``batch`` queries,
    as the labelled ones did. ``seed`` fixes the views.
    """
    y = np.asarray(labels, dtype=np.int64)
    if y.ndim != 1 or len(y) != len(labelled_features) or len(y) == 0:
        raise ValueError("pseudo-labels need single-label classes, one per labelled query")
    if not 0.0 < confidence <= 1.0:
        raise ValueError(f"confidence must lie in (0, 1], got {confidence}")
    head = fit_batch_standardised(labelled_features, y, outputs, l2=l2, balanced=True)
    if len(unlabelled) == 0:
        return head
    weak = features(body, unlabelled, current_statistics=True, batch=batch)
    gen = torch.Generator().manual_seed(seed)
    xt = torch.from_numpy(np.ascontiguousarray(unlabelled, dtype=np.float32))
    for _ in range(rounds):
        with torch.no_grad():
            prob = torch.softmax(head.eval()(weak), dim=1)
        conf, pred = prob.max(dim=1)
        keep = (conf >= confidence).nonzero().flatten()
        if len(keep) == 0:
            break
        views = augment(xt[keep], gen, augmentation)
        strong = features(body, views.numpy(), current_statistics=True, batch=batch)
        head = fit_batch_standardised(
            torch.cat([labelled_features, strong]),
            np.concatenate([y, pred[keep].numpy().astype(np.int64)]),
            outputs,
            l2=l2,
            balanced=True,
        )
    return head


def answered_rows(labels: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Rows of (N,) classes or (N, k) labels with every entry answered (-1: not answered)."""
    y = np.asarray(labels)
    if len(y) == 0:  # reshape cannot infer a row length from no rows
        return np.zeros(0, dtype=bool)
    return np.asarray((y >= 0).reshape(len(y), -1).all(axis=1), dtype=bool)


def fit_student_head(
    method: str,
    body: Classifier,
    feats: torch.Tensor,
    labels: NDArray[np.int64],
    queries: NDArray[np.float32],
    outputs: int,
    *,
    batch: int,
    l2: float = 1e-2,
    seed: int = 0,
) -> nn.Sequential:
    """A pretrained student's head by the last-layer ``method`` (:func:`check_method`).

    ``feats`` (N, D): every query's features from ``body`` under current statistics, in
    batches of ``batch``; ``labels``: (N,) classes or, for ``none`` only, (N, k) 0/1
    labels, -1 where not answered; ``queries`` (N, *input_shape): the queries themselves
    (``pseudo-label-head`` reads strong views of them). ``none`` fits the answered rows
    (class-balanced for classes); the others also learn from the rest (classes only).
    ValueError says what is wrong.
    """
    check_method(method, "last layer")
    y = np.asarray(labels, dtype=np.int64)
    answered = answered_rows(y)
    if method == "none":
        return fit_batch_standardised(
            feats[torch.from_numpy(answered)], y[answered], outputs, l2=l2, balanced=y.ndim == 1
        )
    if y.ndim != 1:
        raise ValueError(f"semi-supervised method {method!r} takes classes, not labels")
    if method == "self-training":
        return self_train_linear(feats, y, outputs, l2=l2)
    # check_method left "pseudo-label-head" only.
    return pseudo_label_head(
        body,
        feats[torch.from_numpy(answered)],
        y[answered],
        queries[~answered],
        outputs,
        batch=batch,
        l2=l2,
        seed=seed,
    )
