"""What an answering party votes with: one or more models on the same inputs and outputs
(capc teachers, ensembles, a hospital's own models), and every teacher's prediction."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

import numpy as np
from numpy.typing import NDArray

from capc.models.foreign import ForeignTeacher, Interface, load_foreign, shape_text

if TYPE_CHECKING:
    from capc.models.checkpoint import Teacher
    from capc.models.ensemble.files import Member
    from capc.models.ensemble.shared_body import TeacherEnsemble


# capc's own teachers and ensembles are torch modules: their modules are imported only
# when a member is not a foreign model (then torch is loaded already), so a party of
# ONNX teachers alone never imports torch (the torch-free answerer image).
def is_ensemble(member: Member) -> TypeGuard[TeacherEnsemble]:
    """Whether ``member`` is a :class:`TeacherEnsemble` (several teachers on one body)."""
    if isinstance(member, ForeignTeacher):
        return False
    from capc.models.ensemble.shared_body import TeacherEnsemble

    return isinstance(member, TeacherEnsemble)


def is_teacher(member: Member) -> TypeGuard[Teacher]:
    """Whether ``member`` is one capc teacher (:class:`capc.models.checkpoint.Teacher`)."""
    if isinstance(member, ForeignTeacher):
        return False
    from capc.models.checkpoint import Teacher

    return isinstance(member, Teacher)


def model_hashes(member: Member) -> list[str]:
    """The model hash of every teacher of ``member``, in voting order."""
    if is_ensemble(member):
        return list(member.model_hashes)
    if isinstance(member, ForeignTeacher) or is_teacher(member):
        return [member.model_hash]
    raise TypeError(f"a party's member is a model, not a {type(member).__name__}")


def _kind(m: Member) -> str:
    return "labels" if m.multi_label else "classes"


class Voters:
    """The teachers an answering party votes with: one or more models (see
    :func:`load_members`), all on the same inputs and outputs.

    ``sources``: where each member came from, for messages; ``origins``: the ``--model``
    each member was loaded from (default: its source)."""

    def __init__(
        self,
        members: Sequence[Member],
        sources: Sequence[str] | None = None,
        origins: Sequence[str] | None = None,
    ) -> None:
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
        self.origins = list(self.sources) if origins is None else list(origins)
        if len(self.origins) != len(self.members):
            raise ValueError("a party's voters need one origin per member")
        self.input_shape = first.input_shape
        self.num_classes = first.num_classes
        self.multi_label = first.multi_label

    @classmethod
    def load(
        cls,
        specs: Sequence[str | Path],
        want: Interface | None = None,
        *,
        trust_code: bool = False,
    ) -> Voters:
        """Every ``--model`` of a party (:func:`load_members`; a file of several teachers
        gives each); ``want``: the task's interface; ``trust_code``: allow TorchScript and
        ``module:factory`` models (code)."""
        members: list[Member] = []
        sources: list[str] = []
        origins: list[str] = []
        for spec in specs:
            foreign = load_foreign(spec, want, trust_code=trust_code)
            loaded: Member | list[Teacher]
            if foreign is not None:
                loaded = foreign
            else:  # a capc checkpoint file (files.load_members, without torch for ONNX)
                from capc.models.ensemble.files import load_checkpoint

                loaded = load_checkpoint(Path(spec))
            if isinstance(loaded, list):
                members += loaded
                sources += [f"{spec} (teacher {i + 1})" for i in range(len(loaded))]
                origins += [str(spec)] * len(loaded)
            else:
                members.append(loaded)
                sources.append(str(spec))
                origins.append(str(spec))
        return cls(members, sources, origins)

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
        return sum(len(model_hashes(m)) for m in self.members)

    @property
    def single(self) -> Teacher | None:
        """The party's one capc teacher, when it has exactly one (encrypted rounds need that)."""
        only = self.members[0]
        return only if len(self.members) == 1 and is_teacher(only) else None

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
            out += [(m.architecture, h) for h in model_hashes(m)]
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
            parts.append(p if is_ensemble(m) else p[:, None])
        return np.concatenate(parts, axis=1)
