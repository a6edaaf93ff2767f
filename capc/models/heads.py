"""Last layers that standardise their input: by stored statistics, or by the batch's own."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional


class BatchStandardiser(nn.BatchNorm1d):
    """(B, D) -> (B, D): each feature minus its mean, over its standard deviation.

    The stored (running) statistics are those of the features a head was fitted
    on; under current statistics (:func:`capc.models.inference.statistics`, which
    puts BatchNorm layers in training mode) each batch uses its own. A batch of
    one row has no spread of its own, so it falls back to the stored statistics
    rather than fail.
    """

    def __init__(self, dim: int) -> None:
        super().__init__(dim, affine=False, momentum=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] < 2:
            assert self.running_mean is not None and self.running_var is not None
            return functional.batch_norm(
                x, self.running_mean, self.running_var, training=False, eps=self.eps
            )
        return super().forward(x)


def standardised_head(dim: int, outputs: int) -> nn.Sequential:
    """``Sequential(BatchStandardiser(dim), Linear(dim, outputs))``: (B, dim) -> (B, outputs)."""
    return nn.Sequential(BatchStandardiser(dim), nn.Linear(dim, outputs))


def is_standardised_head(state_dict: dict[str, torch.Tensor], prefix: str = "head.") -> bool:
    """Whether a model's state dict holds a :func:`standardised_head` under ``prefix``."""
    return f"{prefix}0.running_mean" in state_dict and f"{prefix}1.weight" in state_dict
