"""Teacher ensembles: several teachers in one answering party, and the one home of the
ensemble type, its files and its batched inference.

A hospital may vote with m teachers instead of one, e.g. m last-layer heads
fitted on disjoint partitions of its data on one shared pretrained body
(DIET), or m separate checkpoints. It contributes the sum of their votes, so
a record (which sits in one partition) still moves one teacher's vote, and
the party's privacy cost per query is that of one teacher.

- :mod:`capc.models.ensemble.shared_body`: :class:`TeacherEnsemble`, heads on a
  shared body stored compactly (the body once, each teacher's BatchNorm statistics
  and linear head), and its per-teacher predictions. Under current statistics
  (synthetic queries) the features do not depend on a teacher's statistics, so one
  pass through the body serves all m heads.
- :mod:`capc.models.ensemble.files`: ensemble and several-teacher checkpoint files,
  and what one ``--model`` names (:func:`load_members`).
- :mod:`capc.models.ensemble.voters`: :class:`Voters`, what a party votes with: one
  or more models, each a capc teacher, an ensemble, or a hospital's own model (ONNX,
  TorchScript or ``module:factory``, :mod:`capc.models.foreign`), giving every
  teacher's prediction per query (a mechanism's ``summed_votes`` turns those into
  vote histograms).

Fitting an ensemble is learning: :mod:`capc.learning.teachers`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capc.models.ensemble.files import (
        CHECKPOINTS_KIND,
        ENSEMBLE_KIND,
        Member,
        load_checkpoint,
        load_checkpoints,
        load_ensemble,
        load_members,
        save_checkpoints,
        save_ensemble,
    )
    from capc.models.ensemble.shared_body import (
        TeacherEnsemble,
        check_queries,
        ensemble_outputs,
        hard_predictions,
        head_outputs,
        head_predictions,
        statistics_of,
    )
    from capc.models.ensemble.voters import Voters

#: Each public name and the module that defines it: imported on first use (PEP 562), so
#: that :class:`Voters` of ONNX teachers alone never imports torch (capc.models says why).
_HOMES = {
    "CHECKPOINTS_KIND": "capc.models.ensemble.files",
    "ENSEMBLE_KIND": "capc.models.ensemble.files",
    "Member": "capc.models.ensemble.files",
    "TeacherEnsemble": "capc.models.ensemble.shared_body",
    "Voters": "capc.models.ensemble.voters",
    "check_queries": "capc.models.ensemble.shared_body",
    "ensemble_outputs": "capc.models.ensemble.shared_body",
    "hard_predictions": "capc.models.ensemble.shared_body",
    "head_outputs": "capc.models.ensemble.shared_body",
    "head_predictions": "capc.models.ensemble.shared_body",
    "load_checkpoint": "capc.models.ensemble.files",
    "load_checkpoints": "capc.models.ensemble.files",
    "load_ensemble": "capc.models.ensemble.files",
    "load_members": "capc.models.ensemble.files",
    "save_checkpoints": "capc.models.ensemble.files",
    "save_ensemble": "capc.models.ensemble.files",
    "statistics_of": "capc.models.ensemble.shared_body",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'capc.models.ensemble' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


__all__ = [
    "CHECKPOINTS_KIND",
    "ENSEMBLE_KIND",
    "Member",
    "TeacherEnsemble",
    "Voters",
    "check_queries",
    "ensemble_outputs",
    "hard_predictions",
    "head_outputs",
    "head_predictions",
    "load_checkpoint",
    "load_checkpoints",
    "load_ensemble",
    "load_members",
    "save_checkpoints",
    "save_ensemble",
    "statistics_of",
]
