"""An HE-friendly torch model compiled to the layers a CKKS evaluation runs.

Only three kinds of layer exist under encryption: a convolution, a dense
layer (both linear, with a bias) and a square. :func:`compile_model` reads
them out of a ``he-cnn`` or ``he-mlp`` :class:`~capc.models.registry.Classifier`
into float64 arrays; the evaluators in :mod:`capc.he.batched` and
:mod:`capc.he.single` never touch torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.models.registry import Classifier, Square


@dataclass(frozen=True)
class Conv:
    """(C_out, C_in, k, k) kernels with stride, no padding, on (C_in, H, W) inputs."""

    weight: NDArray[np.float64]
    bias: NDArray[np.float64]
    stride: int
    in_shape: tuple[int, int, int]

    @property
    def out_shape(self) -> tuple[int, int, int]:
        _, h, w = self.in_shape
        k = self.weight.shape[-1]
        return self.weight.shape[0], (h - k) // self.stride + 1, (w - k) // self.stride + 1

    @property
    def out_dim(self) -> int:
        return int(np.prod(self.out_shape))

    def windows(self) -> NDArray[np.int64]:
        """(H_out * W_out, C_in * k * k) flat input index of every tap of every window."""
        c, h, w = self.in_shape
        k, s = self.weight.shape[-1], self.stride
        _, oh, ow = self.out_shape
        ci, di, dj = np.meshgrid(np.arange(c), np.arange(k), np.arange(k), indexing="ij")
        taps = (ci * h * w + di * w + dj).ravel()
        oi, oj = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
        origin = (oi * s * w + oj * s).ravel()
        return np.asarray(origin[:, None] + taps[None, :], dtype=np.int64)

    def as_dense_rows(self) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """(out_dim, taps) input indices and weights of each output, in (C, H, W) order."""
        win = self.windows()
        kernels = self.weight.reshape(self.weight.shape[0], -1)
        index = np.broadcast_to(win[None], (kernels.shape[0], *win.shape)).reshape(-1, win.shape[1])
        weight = np.repeat(kernels, win.shape[0], axis=0)
        return index, weight


@dataclass(frozen=True)
class Dense:
    """(out, in) weight and (out,) bias."""

    weight: NDArray[np.float64]
    bias: NDArray[np.float64]

    @property
    def out_dim(self) -> int:
        return int(self.weight.shape[0])


@dataclass(frozen=True)
class SquareLayer:
    """x * x, elementwise."""


Layer = Conv | Dense | SquareLayer


@dataclass(frozen=True)
class Plan:
    """The layers, the input shape (no batch axis) and the number of logits."""

    layers: tuple[Layer, ...]
    input_shape: tuple[int, ...]
    num_classes: int

    @property
    def input_dim(self) -> int:
        return int(np.prod(self.input_shape))

    @property
    def depth(self) -> int:
        """Rescalings the evaluation needs: one per layer."""
        return len(self.layers)

    def forward(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """The plaintext reference: (B, *input_shape) -> (B, num_classes) in float64."""
        h = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        for layer in self.layers:
            if isinstance(layer, SquareLayer):
                h = h * h
            elif isinstance(layer, Dense):
                h = h @ layer.weight.T + layer.bias
            else:
                index, weight = layer.as_dense_rows()
                h = np.einsum("bot,ot->bo", h[:, index], weight) + np.repeat(
                    layer.bias, layer.out_dim // len(layer.bias)
                )
        return h


def _array(t: torch.Tensor) -> NDArray[np.float64]:
    return np.asarray(t.detach().cpu().double().numpy())


def compile_model(model: Classifier, input_shape: tuple[int, ...]) -> Plan:
    """The CKKS plan of an ``he-cnn`` or ``he-mlp`` model.

    Raises ValueError naming the first layer that has no encrypted
    counterpart (ReLU, pooling, BatchNorm, padding...).
    """
    layers: list[Layer] = []
    shape: tuple[int, ...] = tuple(int(s) for s in input_shape)
    modules = [*model.features, model.head] if isinstance(model.features, nn.Sequential) else []
    if not modules:
        raise ValueError("only sequential HE-friendly models compile (he-cnn, he-mlp)")
    for m in modules:
        if isinstance(m, nn.Conv2d):
            if m.padding not in ((0, 0), "valid") or m.dilation != (1, 1) or m.groups != 1:
                raise ValueError("convolutions must have no padding, dilation or groups")
            if m.stride[0] != m.stride[1] or m.kernel_size[0] != m.kernel_size[1]:
                raise ValueError("convolutions must have square kernels and strides")
            if len(shape) != 3:
                raise ValueError(f"a convolution needs (C, H, W) inputs, got {shape}")
            bias = _array(m.bias) if m.bias is not None else np.zeros(m.out_channels)
            conv = Conv(_array(m.weight), bias, int(m.stride[0]), (shape[0], shape[1], shape[2]))
            layers.append(conv)
            shape = conv.out_shape
        elif isinstance(m, nn.Linear):
            bias = _array(m.bias) if m.bias is not None else np.zeros(m.out_features)
            layers.append(Dense(_array(m.weight), bias))
            shape = (m.out_features,)
        elif isinstance(m, Square):
            layers.append(SquareLayer())
        elif isinstance(m, nn.Flatten):
            shape = (int(np.prod(shape)),)
        else:
            raise ValueError(
                f"{type(m).__name__} has no encrypted evaluation; use he-cnn or he-mlp "
                "(convolution, dense and square layers only)"
            )
    if not isinstance(layers[-1], Dense):
        raise ValueError("the last layer must be dense (the logits)")
    return Plan(tuple(layers), tuple(int(s) for s in input_shape), layers[-1].out_dim)
