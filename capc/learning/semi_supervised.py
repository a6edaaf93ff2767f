"""A last layer that also learns from unlabelled queries: confident pseudo-labels taught on
strongly augmented views (the FixMatch idea, for a linear head on a frozen body).

Round after round, the head predicts each unlabelled query as it is (the weak
view); a query whose top probability reaches ``confidence`` gets that class as
a pseudo-label, and a strongly augmented view of it (random crops, rotations,
flips, contrast, noise: :mod:`capc.learning.augment`) is added to the training
set with it, so the head learns to give a view the class of its query. The
pseudo-labels are a function of the released labels and of public synthetic
queries only: post-processing, no privacy cost.

This is a minimal version for the student party's last layer; it trains no
body, keeps no exponential moving average and fits the head by L-BFGS each
round (a convex problem) rather than by SGD on mixed batches.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.learning.augment import Augmentation, augment
from capc.learning.last_layer import fit_batch_standardised
from capc.models.inference import features
from capc.models.registry import Classifier


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
    """A balanced :func:`fit_batch_standardised` head fitted to (N, D) ``labelled_features``
    and their (N,) ``labels``, then refitted ``rounds`` times with strong views of the
    (M, *input_shape) ``unlabelled`` queries whose weak view it predicts with probability
    ``confidence`` or more, labelled with that prediction.

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
