"""capc checkpoints as ONNX files: the hand-over format for a model whose author the
receiving hospital does not fully trust (``capc teacher export --onnx``).

An ONNX graph is data: onnxruntime interprets it with a fixed set of operators,
so a file cannot open, read or write anything (TorchScript can:
:mod:`capc.models.foreign`). Each exported teacher maps a float32 batch
(B, *input_shape) (dynamic B) to (B, K) scores, in evaluation mode with its own
stored BatchNorm statistics: what ``predict(current_statistics=False)`` of the
checkpoint computes. The DIET "current statistics" inference does not survive
the export (a foreign model runs as exported).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch
from torch import nn

from capc.models.checkpoint import Teacher
from capc.models.ensemble.shared_body import TeacherEnsemble


def ensemble_member(ensemble: TeacherEnsemble, i: int) -> nn.Module:
    """Teacher ``i`` of ``ensemble`` as one module: a copy of the shared body with that
    teacher's BatchNorm statistics and its linear head (K, D)."""
    alone = copy.deepcopy(ensemble.body).cpu()
    alone.load_state_dict({k: v.cpu() for k, v in ensemble.statistics[i].items()}, strict=False)
    k, d = ensemble.weights.shape[1:]
    head = nn.Linear(int(d), int(k))
    with torch.no_grad():
        head.weight.copy_(ensemble.weights[i].cpu())
        head.bias.copy_(ensemble.biases[i].cpu())
    alone.head = head
    return alone.eval()


def teacher_modules(
    loaded: Teacher | TeacherEnsemble | list[Teacher],
) -> tuple[tuple[int, ...], list[nn.Module]]:
    """(input shape, one module per teacher) of a loaded capc checkpoint file."""
    if isinstance(loaded, TeacherEnsemble):
        return loaded.input_shape, [ensemble_member(loaded, i) for i in range(len(loaded))]
    teachers = loaded if isinstance(loaded, list) else [loaded]
    return teachers[0].input_shape, [copy.deepcopy(t.model).cpu().eval() for t in teachers]


def export_onnx(module: nn.Module, input_shape: tuple[int, ...], path: Path) -> Path:
    """Write ``module`` ((B, *input_shape) float32 -> (B, K)) as ONNX with a dynamic batch
    dimension, input ``x`` and output ``scores``; returns ``path``."""
    module.eval()
    dummy = torch.zeros(2, *input_shape)
    # The legacy (TorchScript-tracing) exporter needs no onnxscript; it warns that it is
    # legacy. Tracing runs capc's own module here, never a received file.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            module,
            (dummy,),
            str(path),
            input_names=["x"],
            output_names=["scores"],
            dynamic_axes={"x": {0: "batch"}, "scores": {0: "batch"}},
            dynamo=False,
        )
    return path


def out_paths(pattern: str, count: int) -> list[Path]:
    """Where ``count`` exported teachers go: ``pattern`` itself for one; for several,
    ``pattern`` with ``{i}`` replaced by 1 .. count. ValueError when several have no
    ``{i}`` to tell them apart."""
    if count == 1:
        return [Path(pattern.replace("{i}", "1"))]
    if "{i}" not in pattern:
        raise ValueError(
            f"the checkpoint holds {count} teachers, one ONNX file each: put {{i}} in --onnx "
            f"(e.g. teacher-{{i}}.onnx) to number them 1 .. {count}"
        )
    return [Path(pattern.replace("{i}", str(i + 1))) for i in range(count)]
