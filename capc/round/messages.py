"""The messages of one labelling round, as plain frozen data.

Services convert their wire messages to these once per hop and back (for the
guardian: :mod:`services.common.serde`). Arrays are numpy: vote shares are
(B, width) uint64, ring elements or, for proven votes, elements of F_p;
participation masks are (B,) bool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from capc.mechanisms import Mechanism

QueryKind = Literal["tensor", "recipe", "encrypted"]


@dataclass(frozen=True)
class QueryBatch:
    """What the parties are asked to label, as far as the round's rules need it.

    ``kind``: plain float tensor, programmatic recipe or CKKS ciphertexts; ``count``:
    the batch size B; ``digest``: the 32-byte SHA-256 every party checks (of the
    recipe's batch, or of the ciphertexts), empty for a tensor.
    """

    kind: QueryKind
    count: int
    digest: bytes = b""

    @property
    def encrypted(self) -> bool:
        return self.kind == "encrypted"


@dataclass(frozen=True)
class Retry:
    """The student retries ``round_id`` without ``party``, whose sealed seed it says it
    could not open; ``reason`` is its own untrusted words."""

    round_id: int
    party: str
    reason: str = ""


@dataclass(frozen=True)
class RoundRequest:
    """A student's request for a round, checked for form by the service.

    ``exclude``: the parties the student leaves out; ``left_out``: those the guardian
    leaves out whatever the student says (a querier's own hospital); ``disclosure``:
    the audit detail of the querier's own records sent in the clear, None if none.
    """

    round_key: str
    querier: str
    queries: QueryBatch
    student_public_key: bytes
    session_id: bytes = b""
    exclude: frozenset[str] = frozenset()
    left_out: frozenset[str] = frozenset()
    retry: Retry | None = None
    disclosure: Mapping[str, object] | None = None

    @property
    def batch(self) -> int:
        return self.queries.count


@dataclass(frozen=True)
class RoundWork:
    """What one party is asked to do for a round: vote on the round's queries with
    ``teachers`` teachers, at ``vote_weight``, encoded with ``frac_bits`` fractional
    bits, on the queries ``participation`` marks ((B,) bool; None: every query).

    ``mechanism``: the job's, resolved when the job was created (the task's or a tightening
    of it: the guardian checks it before the round opens, each party as it decodes the
    work). ``queries``: the round's batch as its rules need it; ``task`` and
    ``task_config``: the task's name and configuration (JSON), which a party's own ledger
    registers before it reserves. The guardian's core leaves the configuration out: its
    service sends it once a party's stream (the work names the task by name and hash).
    ``proven``: whether the round takes the vote with its validity proof.
    """

    round_id: int
    party: str
    mechanism: Mechanism
    student_public_key: bytes
    vote_weight: float
    frac_bits: int
    teachers: int
    participation: NDArray[np.bool_] | None = None
    queries: QueryBatch | None = None
    task: str = ""
    task_config: Mapping[str, object] | None = None
    #: The round takes this party's vote with its validity proof (every plaintext round of
    #: a networked guardian); False: plain ring shares (encrypted, or a central driver).
    proven: bool = True

    @property
    def batch(self) -> int:
        """B, the round's queries (0 when the work does not say)."""
        return 0 if self.queries is None else self.queries.count


@dataclass(frozen=True)
class ShareLayout:
    """The shares a round takes from one party: (batch, width) values, elements of F_p
    when ``field`` (proven bit shares) and then a (batch, proof_width) proof share."""

    batch: int
    width: int
    field: bool = False
    proof_width: int | None = None


@dataclass(frozen=True)
class PartyShares:
    """One party's answer to a round: its guardian share (see :class:`ShareLayout`), the
    guardian's share of its validity proof, the seed of the student's share sealed to
    the student, and (encrypted mode) the hash of the ciphertexts it evaluated."""

    round_id: int
    party: str
    share: NDArray[np.uint64]
    sealed_seed: bytes = b""
    batch_hash: bytes = b""
    proof: NDArray[np.uint64] | None = None


@dataclass(frozen=True)
class Opened:
    """A round whose shares are in, as the student learns it: the parties used, the
    epsilon left of each party the reservation left out, the sealed seeds of the
    parties used, their teachers, and the challenge of their vote validity proofs
    (empty when nothing is proven)."""

    round_id: int
    included: tuple[str, ...]
    excluded_remaining: Mapping[str, float]
    seeds: Mapping[str, bytes]
    teachers: Mapping[str, int]
    challenge: bytes = b""


@dataclass(frozen=True)
class VoteVerdict:
    """The vote check of a round: the parties whose votes count, those left out with
    why, the vote weights on the shares' grid, and the teachers of each party used."""

    round_id: int
    included: tuple[str, ...]
    excluded: Mapping[str, str]
    vote_weights: Mapping[str, int]
    teachers: Mapping[str, int]


SettlementKind = Literal["charged", "not_charged", "worst_case"]


@dataclass(frozen=True)
class Settlement:
    """How a round ended for one party: charged for what it released (``answered``:
    the packed answered mask), not charged, or charged its worst case (what it
    released is unknown: a crash after the release, a histogram violation)."""

    round_id: int
    party: str
    kind: SettlementKind
    answered: bytes = b""


@dataclass(frozen=True)
class Computed:
    """A round's settlement after its 2PC: how many queries were answered, out of how
    many, by which parties; ``violations``: queries whose histogram broke the vote
    total (the round was then charged at its reservation)."""

    round_id: int
    answered: int
    batch: int
    parties: tuple[str, ...]
    violations: tuple[int, ...] = field(default=())


__all__ = [
    "Computed",
    "Opened",
    "PartyShares",
    "QueryBatch",
    "QueryKind",
    "Retry",
    "RoundRequest",
    "RoundWork",
    "Settlement",
    "SettlementKind",
    "ShareLayout",
    "VoteVerdict",
]
