"""Teacher checkpoints: a state dict, its architecture name and a model card.

A checkpoint is a ``torch.save`` of plain data (loaded with
``weights_only=True``, so a file cannot run code): architecture and width,
input shape, number of outputs, whether they are classes or independent
labels, state dict and a card (architecture, input spec, data description,
metrics).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from numpy.typing import NDArray

from capc.models.heads import is_standardised_head, standardised_head
from capc.models.inference import run_batches
from capc.models.registry import ARCHITECTURES, Classifier, build


def weights_sha256(module: torch.nn.Module, prefix: str = "") -> str:
    """SHA-256 (hex) of ``prefix`` and every entry of ``module``'s state dict, by name.

    Parameters and buffers (BatchNorm statistics) both count: two models with
    this digest compute the same function.
    """
    h = hashlib.sha256(prefix.encode())
    for k, v in sorted(module.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().numpy().tobytes())
    return h.hexdigest()


@dataclass
class Teacher:
    """A model ready for batched inference on (B, *input_shape) float32 queries.

    ``multi_label``: the ``num_classes`` outputs are independent labels (one
    logit each, positive above 0) rather than mutually exclusive classes.
    ``width``: the architecture's width option (None: its default).
    """

    architecture: str
    input_shape: tuple[int, ...]
    num_classes: int
    model: Classifier
    card: dict[str, Any] = field(default_factory=dict)
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    multi_label: bool = False
    width: int | None = None

    def __post_init__(self) -> None:
        self.model.to(self.device).eval()
        if self.width is None and self.architecture in ARCHITECTURES:
            self.width = ARCHITECTURES[self.architecture].default_width

    @property
    def model_hash(self) -> str:
        return weights_sha256(self.model, prefix=self.architecture)

    def predict(
        self, queries: NDArray[np.float32], current_statistics: bool = False, chunk: int = 1024
    ) -> NDArray[np.int64]:
        """Predicted classes (B,), or 0/1 labels (B, k) for a multi-label teacher.

        ``current_statistics``: BatchNorm normalises with the statistics of the
        query batch itself (for synthetic queries), not the training ones.
        """
        x = np.asarray(queries, dtype=np.float32)
        if x.shape[1:] != self.input_shape:
            raise ValueError(
                f"queries must have shape (B, {', '.join(map(str, self.input_shape))}), got {x.shape}"
            )
        if not np.isfinite(x).all():
            raise ValueError("queries contain NaN or infinity")
        # Current statistics need the whole batch in one pass.
        step = x.shape[0] if current_statistics else chunk
        out = run_batches(
            self.model, self.model, x, current_statistics=current_statistics, batch=step
        )
        hard = out > 0 if self.multi_label else out.argmax(dim=1)
        return hard.numpy().astype(np.int64)


def teacher_data(teacher: Teacher) -> dict[str, Any]:
    """A teacher as the plain data of its checkpoint (state dict, architecture, input spec,
    model card)."""
    return {
        "architecture": teacher.architecture,
        "width": teacher.width,
        "input_shape": list(teacher.input_shape),
        "num_classes": teacher.num_classes,
        "multi_label": teacher.multi_label,
        "state_dict": {k: v.cpu() for k, v in teacher.model.state_dict().items()},
        "card": teacher.card,
    }


def save_teacher(path: Path | BinaryIO, teacher: Teacher) -> None:
    """Write a checkpoint (state dict, architecture, input spec, model card) to a path or file."""
    torch.save(teacher_data(teacher), path)


def load_teacher(path: Path | BinaryIO) -> Teacher:
    """Load a checkpoint written by :func:`save_teacher` (a path or an open file); raises
    ValueError with the reason."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"no model checkpoint at {path}") from None
    except (KeyError, RuntimeError, TypeError) as err:
        raise ValueError(f"{path} is not a capc teacher checkpoint: {err}") from err
    return teacher_from_data(data, str(path))


def teacher_from_data(data: Any, where: str) -> Teacher:
    """A teacher from a loaded checkpoint's plain ``data``; ValueError names ``where``."""
    try:
        width = data.get("width")
        model = build(
            data["architecture"],
            tuple(data["input_shape"]),
            int(data["num_classes"]),
            None if width is None else int(width),
        )
        if is_standardised_head(data["state_dict"]):
            # A DIET student's head keeps its standardisation (capc.models.heads).
            model.head = standardised_head(model.dim, int(data["num_classes"]))  # type: ignore[assignment]
        model.load_state_dict(data["state_dict"])
    except (KeyError, RuntimeError, TypeError, AttributeError) as err:
        raise ValueError(f"{where} is not a capc teacher checkpoint: {err}") from err
    return Teacher(
        data["architecture"],
        tuple(data["input_shape"]),
        int(data["num_classes"]),
        model,
        dict(data.get("card", {})),
        multi_label=bool(data.get("multi_label", False)),
        width=None if width is None else int(width),
    )
