"""Teacher ensembles: several teachers in one answering party.

A hospital may vote with m teachers instead of one, e.g. m last-layer heads
fitted on disjoint partitions of its data on one shared pretrained body
(DIET), or m separate checkpoints. It contributes the sum of their votes, so
a record (which sits in one partition) still moves one teacher's vote, and
the party's privacy cost per query is that of one teacher.

:class:`TeacherEnsemble` stores heads on a shared body compactly: the body
once, each teacher's BatchNorm statistics and linear head. Under current
statistics (synthetic queries) the features do not depend on a teacher's
statistics, so one pass through the body serves all m heads. :class:`Voters`
is what a party votes with: one or more models, each a capc teacher, an
ensemble, or a hospital's own model (ONNX, TorchScript or ``module:factory``,
:mod:`capc.models.foreign`).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from capc.models.checkpoint import (
    Teacher,
    load_teacher,
    teacher_data,
    teacher_from_data,
    weights_sha256,
)
from capc.models.foreign import ForeignTeacher, Interface, load_foreign, shape_text
from capc.models.inference import features
from capc.models.registry import Classifier, build

#: The ``kind`` an ensemble checkpoint carries (a single teacher's has none).
ENSEMBLE_KIND = "ensemble"
#: The ``kind`` of one file holding several teacher checkpoints (e.g. scratch-trained ones).
CHECKPOINTS_KIND = "checkpoints"


def statistics_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s BatchNorm buffers (running statistics and counters), copied."""
    return {
        k: v.detach().clone()
        for k, v in model.state_dict().items()
        if k.endswith(("running_mean", "running_var", "num_batches_tracked"))
    }


def head_outputs(feats: torch.Tensor, weights: torch.Tensor, biases: torch.Tensor) -> torch.Tensor:
    """Every head's outputs (N, T, K) for (N, D) features, (T, K, D) weights, (T, K) biases."""
    return torch.einsum("nd,tkd->ntk", feats, weights) + biases[None]


def hard(outputs: torch.Tensor, multi_label: bool) -> NDArray[np.int64]:
    """(..., K) outputs -> classes (...) or 0/1 labels (..., K)."""
    out = (outputs > 0).long() if multi_label else outputs.argmax(dim=-1)
    return out.numpy().astype(np.int64)


def ensemble_outputs(
    body: Classifier,
    statistics: Sequence[dict[str, torch.Tensor]],
    weights: torch.Tensor,
    biases: torch.Tensor,
    x: NDArray[np.float32],
    *,
    current_statistics: bool,
    batch: int,
) -> torch.Tensor:
    """Every teacher's outputs (N, T, K) for (N, *input_shape) inputs.

    With ``current_statistics`` the features are computed once for all teachers;
    otherwise once per teacher with its own statistics (``body``'s own are restored).
    ``batch``: inputs per BatchNorm batch.
    """
    if current_statistics:
        f = features(body, x, current_statistics=True, batch=batch)
        return head_outputs(f, weights.cpu(), biases.cpu())
    saved = statistics_of(body)
    outs = []
    try:
        for i, stats in enumerate(statistics):
            body.load_state_dict(stats, strict=False)
            f = features(body, x, current_statistics=False, batch=batch)
            outs.append(f @ weights[i].cpu().T + biases[i].cpu())
    finally:
        body.load_state_dict(saved, strict=False)
    return torch.stack(outs, dim=1)


@dataclass
class TeacherEnsemble:
    """m teachers sharing ``body``'s weights: teacher i is the body with BatchNorm buffers
    ``statistics[i]`` and the linear head (``weights[i]`` (K, D), ``biases[i]`` (K,)).

    ``multi_label``: the K outputs are independent labels (positive above 0).
    """

    architecture: str
    input_shape: tuple[int, ...]
    num_classes: int
    body: Classifier
    statistics: list[dict[str, torch.Tensor]]
    weights: torch.Tensor
    biases: torch.Tensor
    card: dict[str, Any] = field(default_factory=dict)
    width: int | None = None
    multi_label: bool = False
    device: str = "cuda" if torch.cuda.is_available() else "cpu"

    def __post_init__(self) -> None:
        m = len(self.statistics)
        if m < 1:
            raise ValueError("an ensemble needs at least one teacher")
        want = (m, self.num_classes)
        if tuple(self.weights.shape[:2]) != want or tuple(self.biases.shape) != want:
            raise ValueError(
                f"{m} teachers of {self.num_classes} outputs need weights ({m}, "
                f"{self.num_classes}, D) and biases {want}, got {tuple(self.weights.shape)} "
                f"and {tuple(self.biases.shape)}"
            )
        self.body.to(self.device).eval()

    def __len__(self) -> int:
        return len(self.statistics)

    @property
    def model_hashes(self) -> list[str]:
        """One digest per teacher: of the shared body and of that teacher's own part."""
        body = weights_sha256(self.body, prefix=self.architecture)
        out = []
        for i, stats in enumerate(self.statistics):
            h = hashlib.sha256(body.encode())
            for k, v in sorted(stats.items()):
                h.update(k.encode())
                h.update(v.detach().cpu().numpy().tobytes())
            h.update(self.weights[i].detach().cpu().numpy().tobytes())
            h.update(self.biases[i].detach().cpu().numpy().tobytes())
            out.append(h.hexdigest())
        return out

    def predict(
        self, queries: NDArray[np.float32], current_statistics: bool = False, chunk: int = 1024
    ) -> NDArray[np.int64]:
        """Every teacher's prediction: (B, m) classes, or (B, m, k) 0/1 labels.

        ``current_statistics``: BatchNorm normalises with the query batch's own
        statistics (synthetic queries), in one batch, as a single teacher does.
        """
        x = _checked(queries, self.input_shape)
        step = x.shape[0] if current_statistics else chunk
        out = ensemble_outputs(
            self.body,
            self.statistics,
            self.weights,
            self.biases,
            x,
            current_statistics=current_statistics,
            batch=step,
        )
        return hard(out, self.multi_label)


def _checked(queries: NDArray[np.float32], shape: tuple[int, ...]) -> NDArray[np.float32]:
    x = np.asarray(queries, dtype=np.float32)
    if x.shape[1:] != shape or len(x) == 0:
        raise ValueError(
            f"queries must have shape (B, {', '.join(map(str, shape))}), got {x.shape}"
        )
    if not np.isfinite(x).all():
        raise ValueError("queries contain NaN or infinity")
    return x


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


#: One ``--model`` of a party: a capc teacher, an ensemble, or a hospital's own model.
Member = Teacher | TeacherEnsemble | ForeignTeacher


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


def load_members(spec: str | Path, want: Interface | None = None) -> Member | list[Teacher]:
    """What one ``--model`` names: a capc teacher or ensemble checkpoint, an ONNX or
    TorchScript file (told apart by content), or ``pkg.mod:factory@weights.pt``.

    ``want``: the task's interface; a foreign model takes what it does not declare from it
    (:mod:`capc.models.foreign`). ValueError names the file and what to do."""
    foreign = load_foreign(spec, want)
    return foreign if foreign is not None else load_checkpoint(Path(spec))


def _kind(m: Member) -> str:
    return "labels" if m.multi_label else "classes"


class Voters:
    """The teachers an answering party votes with: one or more models (see
    :func:`load_members`), all on the same inputs and outputs.

    ``sources``: where each member came from (its ``--model``), for messages."""

    def __init__(self, members: Sequence[Member], sources: Sequence[str] | None = None) -> None:
        if not members:
            raise ValueError("a party votes with at least one teacher")
        self.sources = (
            list(sources)
            if sources is not None
            else [f"teacher {i + 1}" for i in range(len(members))]
        )
        first = members[0]
        for m, where in zip(members[1:], self.sources[1:], strict=True):
            if (m.input_shape, m.num_classes, m.multi_label) != (
                first.input_shape,
                first.num_classes,
                first.multi_label,
            ):
                raise ValueError(
                    "every teacher of a party must take the same inputs and give the same "
                    f"outputs: {self.sources[0]} maps {first.input_shape} to "
                    f"{first.num_classes} {_kind(first)}, {where} {m.input_shape} to "
                    f"{m.num_classes} {_kind(m)}"
                )
        self.members = list(members)
        self.input_shape = first.input_shape
        self.num_classes = first.num_classes
        self.multi_label = first.multi_label

    @classmethod
    def load(cls, specs: Sequence[str | Path], want: Interface | None = None) -> Voters:
        """Every ``--model`` of a party (:func:`load_members`; a file of several teachers
        gives each); ``want``: the task's interface."""
        members: list[Member] = []
        sources: list[str] = []
        for spec in specs:
            loaded = load_members(spec, want)
            if isinstance(loaded, list):
                members += loaded
                sources += [f"{spec} (teacher {i + 1})" for i in range(len(loaded))]
            else:
                members.append(loaded)
                sources.append(str(spec))
        return cls(members, sources)

    def misfit(self, party: str, want: Interface) -> str | None:
        """Why this party's teachers cannot answer ``want``'s task, or None when they can.

        Names the first model that does not fit, what it takes and what the task has."""
        for m, where in zip(self.members, self.sources, strict=True):
            who = f"{party}'s model {where}"
            if m.input_shape != want.input_shape:
                return (
                    f"{who} takes inputs {shape_text(m.input_shape)} but task {want.task} has "
                    f"{shape_text(want.input_shape)}: export the model for the task's input "
                    f"shape, or answer a task on {shape_text(m.input_shape)} inputs"
                )
            if m.multi_label != want.multi_label:
                return (
                    f"{who} votes {'independent labels' if m.multi_label else 'one class'} "
                    f"per query but task {want.task} is "
                    f"{'multi-label' if want.multi_label else 'single-label'}: answer it "
                    f"with a {'multi' if want.multi_label else 'single'}-label model"
                )
            if m.num_classes != want.num_classes:
                return (
                    f"{who} gives {m.num_classes} {_kind(m)} but task {want.task} has "
                    f"{want.num_classes}: train or export the model for the task's "
                    f"{want.num_classes} {_kind(m)}"
                )
        return None

    def check(self, party: str, want: Interface) -> None:
        """ValueError (:meth:`misfit`'s reason) unless these teachers can answer ``want``."""
        why = self.misfit(party, want)
        if why is not None:
            raise ValueError(why)

    def __len__(self) -> int:
        return sum(len(m) if isinstance(m, TeacherEnsemble) else 1 for m in self.members)

    @property
    def single(self) -> Teacher | None:
        """The party's one capc teacher, when it has exactly one (encrypted rounds need that)."""
        only = self.members[0]
        return only if len(self.members) == 1 and isinstance(only, Teacher) else None

    @property
    def architecture(self) -> str:
        return ", ".join(sorted({m.architecture for m in self.members}))

    @property
    def device(self) -> str:
        return ", ".join(sorted({m.device for m in self.members}))

    def infos(self) -> list[tuple[str, str]]:
        """(architecture, model hash) of every teacher, in voting order."""
        out: list[tuple[str, str]] = []
        for m in self.members:
            if isinstance(m, TeacherEnsemble):
                out += [(m.architecture, h) for h in m.model_hashes]
            else:
                out.append((m.architecture, m.model_hash))
        return out

    def predict(
        self, queries: NDArray[np.float32], current_statistics: bool = False
    ) -> NDArray[np.int64]:
        """Every teacher's prediction: (B, m) classes or (B, m, k) 0/1 labels.

        ``current_statistics`` reaches capc's own bodies only; a foreign model runs as
        exported (:class:`capc.models.foreign.ForeignTeacher`)."""
        parts = []
        for m in self.members:
            p = m.predict(queries, current_statistics=current_statistics)
            parts.append(p if isinstance(m, TeacherEnsemble) else p[:, None])
        return np.concatenate(parts, axis=1)
