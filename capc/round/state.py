"""One round in flight at the guardian, as the round core keeps it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from capc.mpc import validity
from capc.round.task import RoundTask

TaskT = TypeVar("TaskT", bound=RoundTask)


@dataclass
class GuardianRound(Generic[TaskT]):
    """One round in flight at the guardian: what it asked, received and decided.

    Shares are (batch, width) uint64; ``votes_on`` masks (batch,) bool; ``opened_at``
    is the caller's clock (seconds) at opening.
    """

    round_id: int
    task: TaskT
    querier: str
    batch: int
    included: tuple[str, ...]
    excluded: dict[str, float]
    opened_at: float
    session_id: bytes = b""
    ciphertext_hash: bytes | None = None
    # Personalized budgets: vote weight and, with vanishing, who votes on which query.
    weights: dict[str, float] = field(default_factory=dict)
    votes_on: dict[str, NDArray[np.bool_]] = field(default_factory=dict)
    # Teachers of each included party, as connected when the round opened.
    teachers: dict[str, int] = field(default_factory=dict)
    # Each proven party's statement, its bit and proof shares, and its sealed seed.
    relations: dict[str, validity.VoteRelation] = field(default_factory=dict)
    shares: dict[str, NDArray[np.uint64]] = field(default_factory=dict)
    proofs: dict[str, NDArray[np.uint64]] = field(default_factory=dict)
    seeds: dict[str, bytes] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    # Parties whose vote was left out (unprovable or invalid), with why.
    invalid: dict[str, str] = field(default_factory=dict)
    closed: bool = False
    used: tuple[str, ...] = ()
    challenge: validity.Challenge | None = None
    checked: bool = False
    guardian_sum: NDArray[np.uint64] | None = None
    released: bool = False

    def weight(self, party: str) -> float:
        return self.weights.get(party, 1.0)

    def voters(self, party: str) -> int:
        return self.teachers.get(party, 1)

    def voting(self, party: str) -> NDArray[np.bool_]:
        """(batch,) mask of the queries ``party`` votes on."""
        mask = self.votes_on.get(party)
        return np.ones(self.batch, dtype=bool) if mask is None else mask

    def left_out(self, party: str) -> bool:
        """The party failed, or its vote did: it takes no further part in the round."""
        return party in self.failed or party in self.invalid

    @property
    def collected(self) -> bool:
        """Every included party answered or failed."""
        # Asked after every party's shares (hundreds a round): counted, not a union of
        # sets each time. Only included parties answer or fail (GuardianCore.receive
        # and party_failed refuse any other).
        done = len(self.shares) + sum(1 for p in self.failed if p not in self.shares)
        return done >= len(self.included)

    @property
    def ready(self) -> bool:
        """The guardian's share sum is there: the round waits for its 2PC."""
        return self.guardian_sum is not None

    def weight_on_grid(self, party: str) -> int:
        """``party``'s vote weight on the shares' fixed-point grid, rounded down as the
        party rounds its own votes."""
        return int(np.floor(self.weight(party) * (1 << self.task.weight_bits)))


__all__ = ["GuardianRound", "TaskT"]
