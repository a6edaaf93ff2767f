"""A hospital's own PyTorch code, as ``capc answerer --model pkg.mod:factory@weights.pt``
names it: importable by the answerer subprocess (services.local.spawn runs it from the
repository root). Also builds the ONNX and TorchScript files the tests vote with."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from capc.models import build

#: The light task's shape (services/tasks/light.json): 4 features, 3 classes.
TABULAR = ((4,), 3)


class OwnNet(nn.Module):
    """Not a capc architecture: flatten, one hidden layer, a linear layer to the classes."""

    def __init__(self, input_shape: tuple[int, ...], classes: int, hidden: int = 16) -> None:
        super().__init__()
        size = 1
        for d in input_shape:
            size *= d
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(size, hidden), nn.ReLU(), nn.Linear(hidden, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]


def own_net() -> nn.Module:
    """The hospital's tabular model (4 features -> 3 classes), untrained."""
    return OwnNet(*TABULAR)


def images_small_cnn() -> nn.Module:
    """The images task's teacher architecture (capc's small-cnn, 1x28x28 -> 10 classes),
    as a hospital's own factory would build it."""
    return build("small-cnn", (1, 28, 28), 10)


def not_a_module() -> object:
    """A factory that returns something else than an nn.Module."""
    return {"weights": []}


NOT_CALLABLE = 42


def export_onnx(
    model: nn.Module, input_shape: tuple[int, ...], path: Path, fixed_batch: int | None = None
) -> Path:
    """``model`` as ONNX with a dynamic batch dimension, or a fixed one of ``fixed_batch``."""
    model.eval()
    dummy = torch.zeros(fixed_batch or 2, *input_shape)
    dynamic = None if fixed_batch else {"x": {0: "batch"}, "scores": {0: "batch"}}
    # The legacy exporter needs no onnxscript (not installed); it warns that it is legacy.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (dummy,),
            str(path),
            input_names=["x"],
            output_names=["scores"],
            dynamic_axes=dynamic,
            dynamo=False,
        )
    return path


def export_torchscript(model: nn.Module, input_shape: tuple[int, ...], path: Path) -> Path:
    """``model`` traced to TorchScript (``torch.jit.save``)."""
    model.eval()
    # torch 2.13 calls TorchScript deprecated; hospitals still hand it over, so capc reads it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(model, torch.zeros(2, *input_shape))  # type: ignore[no-untyped-call]
        torch.jit.save(traced, str(path))
    return path


class Thief(nn.Module):
    """A malicious 'model': its forward reads ``secret`` (any file the party can open)
    with ``torch.from_file`` and writes it into ``target`` (mapped shared, so the write
    reaches the file), then returns plausible (B, 3) scores for (B, 4) inputs."""

    def __init__(self, secret: str, target: str, size: int) -> None:
        super().__init__()
        self.secret = secret
        self.target = target
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stolen = torch.from_file(self.secret, shared=False, size=self.size, dtype=torch.uint8)
        planted = torch.from_file(self.target, shared=True, size=self.size, dtype=torch.uint8)
        # The write is used in the output, so that TorchScript keeps it.
        return x[:, :3] * 0.0 + planted.copy_(stolen)[:1].float() * 0.0


def export_thief(secret: Path, target: Path, path: Path) -> Path:
    """A scripted :class:`Thief` (``torch.jit.save``) that copies ``secret`` over
    ``target`` (both as long as ``secret``) whenever its forward runs."""
    module = Thief(str(secret), str(target), secret.stat().st_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(module)
        torch.jit.save(scripted, str(path))
    return path


def write_onnx(path: Path, seed: int) -> None:
    """A linear teacher (1, 28, 28) -> 10 scores with a dynamic batch, weights from ``seed``."""
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((784, 10)).astype(np.float32) / 28.0
    bias = rng.standard_normal(10).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["x"], ["flat"], axis=1),
            helper.make_node("Gemm", ["flat", "w", "b"], ["scores"]),
        ],
        "linear-teacher",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # An IR version every onnxruntime of the pins reads.
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
