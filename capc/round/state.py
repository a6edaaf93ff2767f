"""One round in flight at the guardian, as the round core keeps it."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from capc.mpc import validity
from capc.round.errors import RoundInputError
from capc.round.task import RoundTask

TaskT = TypeVar("TaskT", bound=RoundTask)


class Phase(enum.Enum):
    """Where a round in flight stands at the guardian; it only moves forward.

    COLLECTING (shares come in) -> CHECKING (closed; the proofs' challenge is drawn and
    the student's vote check awaited) -> READY (the guardian's share sum is there; the
    2PC may run) -> RELEASED (the ledger says released: output may leave). A round
    without proofs goes from COLLECTING to READY. A round that ends otherwise (aborted,
    settled) leaves the core's open rounds instead."""

    COLLECTING = "collecting"
    CHECKING = "checking"
    READY = "ready"
    RELEASED = "released"


#: The transitions :meth:`GuardianRound.advance` allows.
NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.COLLECTING: frozenset({Phase.CHECKING, Phase.READY}),
    Phase.CHECKING: frozenset({Phase.READY}),
    Phase.READY: frozenset({Phase.RELEASED}),
    Phase.RELEASED: frozenset(),
}


class PhaseError(RoundInputError):
    """A step was asked of a round in a phase that does not allow it (a late or second
    message, a check of a round with nothing to check): ``found`` is the round's phase,
    ``wanted`` the phases the step needs. Nothing about the round changed."""

    def __init__(self, round_id: int, found: Phase, wanted: frozenset[Phase], message: str) -> None:
        super().__init__(message)
        self.round_id = round_id
        self.found = found
        self.wanted = wanted


class _Votes:
    """Who votes how much in a round: a party's teachers, weight and (with vanishing) the
    queries it votes on. Shared by the core's round and the snapshot adapters get."""

    batch: int
    teachers: Mapping[str, int]
    weights: Mapping[str, float]
    votes_on: Mapping[str, NDArray[np.bool_]]

    def weight(self, party: str) -> float:
        return self.weights.get(party, 1.0)

    def voters(self, party: str) -> int:
        return self.teachers.get(party, 1)

    def voting(self, party: str) -> NDArray[np.bool_]:
        """(batch,) mask of the queries ``party`` votes on."""
        mask = self.votes_on.get(party)
        return np.ones(self.batch, dtype=bool) if mask is None else mask


@dataclass(frozen=True)
class RoundView(_Votes, Generic[TaskT]):
    """One round as the core shows it to an adapter: a copy taken at one moment that the
    adapter cannot change, so every change to a round goes through the core's methods.

    ``used``: the parties whose votes count (set at closing, narrowed by the vote check);
    ``left_out``: those that failed or whose vote was refused; ``collected``: every
    included party answered or failed; ``guardian_sum`` (batch, width) uint64, read-only,
    once the round is READY."""

    round_id: int
    task: TaskT
    querier: str
    session_id: bytes
    batch: int
    included: tuple[str, ...]
    excluded: Mapping[str, float]
    teachers: Mapping[str, int]
    weights: Mapping[str, float]
    votes_on: Mapping[str, NDArray[np.bool_]]
    ciphertext_hash: bytes | None
    phase: Phase
    used: tuple[str, ...]
    left_out: frozenset[str]
    collected: bool
    guardian_sum: NDArray[np.uint64] | None

    @property
    def ready(self) -> bool:
        """The guardian's share sum is there: the round waits for its 2PC (or ran it)."""
        return self.phase in (Phase.READY, Phase.RELEASED)


@dataclass
class GuardianRound(_Votes, Generic[TaskT]):
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
    used: tuple[str, ...] = ()
    challenge: validity.Challenge | None = None
    guardian_sum: NDArray[np.uint64] | None = None
    phase: Phase = Phase.COLLECTING

    def expect(self, *wanted: Phase, why: str) -> None:
        """PhaseError (``why``) unless the round is in one of ``wanted``."""
        if self.phase not in wanted:
            raise PhaseError(self.round_id, self.phase, frozenset(wanted), why)

    def advance(self, to: Phase) -> None:
        """Move the round on to ``to``; PhaseError for any move :data:`NEXT` does not
        allow (a phase is never entered twice, nor left backwards)."""
        if to not in NEXT[self.phase]:
            raise PhaseError(
                self.round_id,
                self.phase,
                frozenset(p for p, nxt in NEXT.items() if to in nxt),
                f"round {self.round_id} is {self.phase.value}: it cannot become {to.value}",
            )
        self.phase = to

    @property
    def closed(self) -> bool:
        """No more shares are taken."""
        return self.phase is not Phase.COLLECTING

    @property
    def checked(self) -> bool:
        """The vote check is behind the round (or it never had one)."""
        return self.phase in (Phase.READY, Phase.RELEASED)

    @property
    def released(self) -> bool:
        return self.phase is Phase.RELEASED

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
        """The guardian's share sum is there: the round waits for its 2PC (or ran it)."""
        return self.phase in (Phase.READY, Phase.RELEASED)

    def view(self) -> RoundView[TaskT]:
        """This round as it stands now, for an adapter (:class:`RoundView`)."""
        total = self.guardian_sum
        if total is not None:
            total = total.view()
            total.flags.writeable = False
        return RoundView(
            self.round_id,
            self.task,
            self.querier,
            self.session_id,
            self.batch,
            self.included,
            MappingProxyType(dict(self.excluded)),
            MappingProxyType(dict(self.teachers)),
            MappingProxyType(dict(self.weights)),
            MappingProxyType(dict(self.votes_on)),
            self.ciphertext_hash,
            self.phase,
            self.used,
            frozenset(self.failed) | frozenset(self.invalid),
            self.collected,
            total,
        )

    def weight_on_grid(self, party: str) -> int:
        """``party``'s vote weight on the shares' fixed-point grid, rounded down as the
        party rounds its own votes."""
        return int(np.floor(self.weight(party) * (1 << self.task.weight_bits)))


__all__ = ["NEXT", "GuardianRound", "Phase", "PhaseError", "RoundView", "TaskT"]
