"""A hospital's DP-SGD training as its ledgers charge it: once per attested teacher files.

A hospital that votes with DP-trained teachers attests their training: one
:class:`~capc.privacy.dp_training.DpTraining` record per teacher file, and a
SHA-256 (:attr:`Attestation.digest`) of the files and records it covers. The
rules, the same in every ledger (the hospital's own and the guardian's; in
memory here, in SQL in ``services.common.ledger.trainings``):

- the charge is :meth:`Attestation.event`: the record's event (``steps``
  Gaussian steps); several files, whose records may be of the same data,
  compose (never fewer than one training's worth);
- it is checked against the party's cap *before* anything is written: one that
  would take the party past its cap is refused (:class:`TrainingRefusedError`)
  with nothing charged;
- it is charged once per (party, digest): the same files attested again (a
  restart) charge nothing more; other files (a new or retrained teacher) are a
  new charge. The charge and its audit entry are one atomic step, made before the
  party registers with the guardian: a crash in between leaves it charged and
  unregistered (the next start charges nothing more), an over-count at worst.

The guardian cannot check that the training happened as the record says: the
attestation is audited, and the hospital's own ledger is the guarantee for that
hospital (docs/privacy.md, "DP-trained teachers").
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capc.privacy.dp_training import DpTraining, DpTrainingError
from capc.privacy.events import DpEvent, compose
from capc.round.errors import LedgerRefusedError

#: A digest is SHA-256 in lowercase hex.
DIGEST_CHARS = 64
#: Most teacher files one attestation covers (a party votes with at most 256 teachers).
MAX_RECORDS = 256


class TrainingRefusedError(LedgerRefusedError):
    """A training's charge would take its party past its cap; nothing was charged.

    ``epsilon``: the training alone, ``spent``: the party's spend before it, ``cap``:
    its enforced cap (all epsilon at the ledger's delta)."""

    def __init__(self, message: str, *, epsilon: float, spent: float, cap: float) -> None:
        super().__init__(message)
        self.epsilon = epsilon
        self.spent = spent
        self.cap = cap


def file_digest(files: Sequence[bytes], records: Sequence[DpTraining]) -> str:
    """SHA-256 (hex) of teacher files' own SHA-256 digests (``files``, 32 bytes each, in
    voting order) with the record attested for each: the same files with the same records
    give the same digest; a retrained file or another record a new one (a new charge)."""
    if len(files) != len(records):
        raise DpTrainingError(f"{len(files)} teacher files but {len(records)} records")
    h = hashlib.sha256(b"capc-dp-training-v1")
    for f, r in zip(files, records, strict=True):
        h.update(f)
        h.update(json.dumps(r.to_dict(), sort_keys=True).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Attestation:
    """What a hospital attests about its voting teachers' training: one record per
    teacher file (``records``, in voting order) and ``digest``, the SHA-256 (hex) of
    the files and records (:func:`file_digest`)."""

    records: tuple[DpTraining, ...]
    digest: str

    def __post_init__(self) -> None:
        if not 1 <= len(self.records) <= MAX_RECORDS:
            raise DpTrainingError(
                f"an attestation holds 1 to {MAX_RECORDS} records, got {len(self.records)}"
            )
        d = self.digest
        if len(d) != DIGEST_CHARS or any(c not in "0123456789abcdef" for c in d):
            raise DpTrainingError(
                f"an attestation's digest is SHA-256 in lowercase hex, got {d[:80]!r}"
            )

    def event(self) -> DpEvent:
        """The charge: the record's event; several records compose."""
        return compose(*(r.event() for r in self.records))

    def describe(self) -> str:
        """What was trained, for people: "DP-SGD, 300 steps, sigma 7.2" per record."""
        return "; ".join(
            f"DP-SGD, {r.steps} steps, sigma {r.noise_multiplier:.4g}, clip {r.clip:g}"
            for r in self.records
        )

    def to_dict(self) -> dict[str, Any]:
        return {"records": [r.to_dict() for r in self.records], "sha256": self.digest}

    @classmethod
    def from_dict(cls, data: Any) -> Attestation:
        """An attestation read from a message or a ledger; DpTrainingError says what is wrong."""
        if not isinstance(data, Mapping) or set(data) != {"records", "sha256"}:
            raise DpTrainingError(
                "a DP-training attestation is a JSON object with records and sha256"
            )
        records = data["records"]
        if not isinstance(records, list):
            raise DpTrainingError("an attestation's records are a list")
        digest = data["sha256"]
        if not isinstance(digest, str):
            raise DpTrainingError("an attestation's sha256 is a hex string")
        return cls(tuple(DpTraining.from_dict(r) for r in records), digest)


@dataclass(frozen=True)
class TrainingCharge:
    """A training as a ledger holds it: its party, attestation, the epsilon of the training
    alone at the ledger's delta, and whether this step charged it (False: charged before)."""

    party: str
    attestation: Attestation
    epsilon: float
    charged: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "party": self.party,
            **self.attestation.to_dict(),
            "epsilon": self.epsilon,
            "described": self.attestation.describe(),
        }


def refusal(
    party: str, epsilon: float, spent: float, cap: float, delta: float, fix: str
) -> TrainingRefusedError:
    """The error for a training that would take ``party`` past ``cap``; ``fix``: what to do."""
    left = max(0.0, cap - spent) if math.isfinite(spent) else 0.0
    return TrainingRefusedError(
        f"{party}'s DP-SGD training costs {epsilon:.4g} eps at delta {delta:g}; "
        f"{party} has spent {spent:.4g} of its cap of {cap:g} eps ({left:.4g} left), so "
        f"the training would take it past its cap and is refused (nothing was charged): "
        f"{fix}",
        epsilon=epsilon,
        spent=spent,
        cap=cap,
    )


#: What a hospital does about a refused training (its own ledger).
OWN_FIX = (
    "train the teacher again with a smaller --dp-epsilon (more noise or fewer steps), or "
    "raise this hospital's cap (capc answerer --epsilon-cap EPS --cap-reason TEXT) if its "
    "data owners agree, then start again"
)
#: What a hospital does about a training the guardian refuses.
GUARDIAN_FIX = (
    "train the teacher again with a smaller --dp-epsilon, or ask the guardian's operator "
    "to raise the cap registered for this party"
)


__all__ = [
    "GUARDIAN_FIX",
    "OWN_FIX",
    "Attestation",
    "TrainingCharge",
    "TrainingRefusedError",
    "file_digest",
    "refusal",
]
