"""Ensemble and several-teacher checkpoint files, and what one ``--model`` names.

Every file is a ``torch.save`` of plain data, loaded with ``weights_only=True``
(a file cannot run code). A single teacher's checkpoint has no ``kind``
(:mod:`capc.models.checkpoint`); an ensemble's is :data:`ENSEMBLE_KIND`, a file of
several teachers' checkpoints :data:`CHECKPOINTS_KIND`.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from capc.models.checkpoint import Teacher, load_teacher, teacher_data, teacher_from_data
from capc.models.ensemble.shared_body import TeacherEnsemble
from capc.models.foreign import ForeignTeacher, Interface, load_foreign
from capc.models.registry import build

#: The ``kind`` an ensemble checkpoint carries (a single teacher's has none).
ENSEMBLE_KIND = "ensemble"
#: The ``kind`` of one file holding several teacher checkpoints (e.g. scratch-trained ones).
CHECKPOINTS_KIND = "checkpoints"

#: One ``--model`` of a party: a capc teacher, an ensemble, or a hospital's own model.
Member = Teacher | TeacherEnsemble | ForeignTeacher


def save_ensemble(path: Path, ensemble: TeacherEnsemble) -> None:
    """Write an ensemble checkpoint (plain data; loaded with ``weights_only=True``)."""
    torch.save(
        {
            "kind": ENSEMBLE_KIND,
            "architecture": ensemble.architecture,
            "width": ensemble.width,
            "input_shape": list(ensemble.input_shape),
            "num_classes": ensemble.num_classes,
            "multi_label": ensemble.multi_label,
            "body": {k: v.cpu() for k, v in ensemble.body.state_dict().items()},
            "statistics": [{k: v.cpu() for k, v in s.items()} for s in ensemble.statistics],
            "weights": ensemble.weights.detach().cpu(),
            "biases": ensemble.biases.detach().cpu(),
            "card": ensemble.card,
        },
        path,
    )


def load_ensemble(data: dict[str, Any], where: str) -> TeacherEnsemble:
    """An ensemble from a loaded checkpoint's ``data``; ValueError says what is wrong."""
    try:
        width = data.get("width")
        body = build(
            data["architecture"],
            tuple(data["input_shape"]),
            int(data["num_classes"]),
            None if width is None else int(width),
        )
        body.load_state_dict(data["body"])
        return TeacherEnsemble(
            data["architecture"],
            tuple(data["input_shape"]),
            int(data["num_classes"]),
            body,
            [dict(s) for s in data["statistics"]],
            torch.as_tensor(data["weights"], dtype=torch.float32),
            torch.as_tensor(data["biases"], dtype=torch.float32),
            dict(data.get("card", {})),
            width=None if width is None else int(width),
            multi_label=bool(data.get("multi_label", False)),
        )
    except (KeyError, RuntimeError, TypeError) as err:
        raise ValueError(f"{where} is not a capc ensemble checkpoint: {err}") from err


def save_checkpoints(path: Path, teachers: Sequence[Teacher]) -> None:
    """Write several teachers' checkpoints to one file (plain data, as :func:`save_teacher`)."""
    torch.save({"kind": CHECKPOINTS_KIND, "members": [teacher_data(t) for t in teachers]}, path)


def load_checkpoints(data: dict[str, Any], where: str) -> list[Teacher]:
    """The teachers of a file written by :func:`save_checkpoints`."""
    members = data.get("members")
    if not isinstance(members, list) or not members:
        raise ValueError(f"{where} is not a capc checkpoints file: no members")
    return [teacher_from_data(m, f"{where} member {i}") for i, m in enumerate(members)]


def load_checkpoint(path: Path) -> Teacher | TeacherEnsemble | list[Teacher]:
    """A capc teacher, ensemble or file of teachers, whichever ``path`` holds."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"no model checkpoint at {path}") from None
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as err:
        raise ValueError(f"{path} is not a capc checkpoint: {err}") from err
    if isinstance(data, dict) and data.get("kind") == ENSEMBLE_KIND:
        return load_ensemble(data, str(path))
    if isinstance(data, dict) and data.get("kind") == CHECKPOINTS_KIND:
        return load_checkpoints(data, str(path))
    return load_teacher(path)


def load_members(
    spec: str | Path, want: Interface | None = None, *, trust_code: bool = False
) -> Member | list[Teacher]:
    """What one ``--model`` names: a capc teacher or ensemble checkpoint, an ONNX or
    TorchScript file (told apart by content), or ``pkg.mod:factory@weights.pt``.

    ``want``: the task's interface; a foreign model takes what it does not declare from it
    (:mod:`capc.models.foreign`). ``trust_code``: load TorchScript and ``module:factory``
    (code; refused without it). ValueError names the file and what to do."""
    foreign = load_foreign(spec, want, trust_code=trust_code)
    return foreign if foreign is not None else load_checkpoint(Path(spec))
