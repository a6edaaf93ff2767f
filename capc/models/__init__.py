"""Model architectures by name, checkpoints with a model card, batched inference, and a
hospital's own models (ONNX, TorchScript, ``module:factory``) as teachers.

The names below are imported on first use (PEP 562), not with the package: a party whose
teachers are all ONNX imports :mod:`capc.models.foreign` alone and never torch, so it
runs in the torch-free image (deploy/Dockerfile's ``onnx`` stage).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capc.models.checkpoint import Teacher, load_teacher, save_teacher
    from capc.models.foreign import ForeignTeacher, Interface, load_foreign
    from capc.models.registry import ARCHITECTURES, Classifier, build

#: Each public name and the module that defines it.
_HOMES = {
    "ARCHITECTURES": "capc.models.registry",
    "Classifier": "capc.models.registry",
    "ForeignTeacher": "capc.models.foreign",
    "Interface": "capc.models.foreign",
    "Teacher": "capc.models.checkpoint",
    "build": "capc.models.registry",
    "load_foreign": "capc.models.foreign",
    "load_teacher": "capc.models.checkpoint",
    "save_teacher": "capc.models.checkpoint",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'capc.models' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


__all__ = [
    "ARCHITECTURES",
    "Classifier",
    "ForeignTeacher",
    "Interface",
    "Teacher",
    "build",
    "load_foreign",
    "load_teacher",
    "save_teacher",
]
