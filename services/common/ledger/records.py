"""What the ledger returns: plain, frozen records (no database objects leave it)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass

from capc.mpc.mechanism_circuits import cutoff_delta
from capc.mpc.validity import conversion_delta

# A value for :meth:`Ledger.keep_setting`, kept in the same transaction as a round's
# settlement when passed to :meth:`Ledger.commit` or :meth:`Ledger.abort`: the round
# core's, so a party's own ledger port passes it through unchanged.
from capc.round.ledger import KeptSetting as KeptSetting
from capc.round.ledger import RoundState
from services.common.ledger.models import ChargeKind


@dataclass(frozen=True)
class LedgerEntry:
    """One reservation or charge; ``epsilon_alone`` is that entry's epsilon on its own."""

    round_id: int
    party: str
    kind: str
    mechanism: str
    round_state: str
    task: str
    queries: int
    epsilon_alone: float
    at: str


@dataclass(frozen=True)
class AuditEntry:
    """One audit entry: ``actor`` is an authenticated identity, ``note`` untrusted free text."""

    seq: int
    at: str
    actor: str
    action: str
    detail: dict[str, object]
    hash: str
    note: str | None = None
    signature: str | None = None


@dataclass(frozen=True)
class PartyBudget:
    """A party's position, epsilon at the ledger's delta by the ledger's accountant
    (``best_order``: the Renyi order for the ``rdp`` accountant, None otherwise)."""

    name: str
    role: str
    status: str
    cap: float
    spent: float
    remaining: float
    best_order: float | None
    rounds: int
    last_seen: dt.datetime | None
    #: The cap this ledger's operator registered, and the one the party declared itself.
    registered_cap: float = math.inf
    declared_cap: float | None = None
    #: The party's latest report of its own ledger (see :meth:`Ledger.store_report`).
    report: Mapping[str, object] | None = None
    #: The most teachers the operator lets the party vote with; None: none pinned.
    registered_teachers: int | None = None
    #: Rounds the party was asked to vote in, aborted ones included (R in the
    #: guarantee (eps, delta + R 2^-40): :meth:`full_delta`).
    rounds_asked: int = 0

    def full_delta(self, delta: float) -> float:
        """The delta this party's guarantee (``spent``, full delta) holds at for the
        ledger's ``delta``: the noise cut-off's conditioning, (delta + e^spent p) / (1 - p)
        with p the chance that a noise value of the R rounds it was asked to vote in left
        the circuit's range (:func:`cutoff_delta`), plus the validity proofs'
        ring-conversion failure, at most 2^-40 a round (docs/privacy.md)."""
        cut = cutoff_delta(delta, self.spent, self.rounds_asked)
        return min(1.0, cut + conversion_delta(self.rounds_asked))


@dataclass(frozen=True)
class RoundCharges:
    """A round with its rows: its state, what it released (``outcome``, guardian side)
    or asked of the party (``terms``, party side), and per party the kind of row held
    and its event (None: charged nothing). A settlement reads the lighter
    :class:`capc.round.ledger.RoundRecord`."""

    round_id: int
    state: RoundState
    terms: Mapping[str, object] | None
    outcome: Mapping[str, object] | None
    charges: Mapping[str, tuple[ChargeKind, dict[str, object] | None]]


@dataclass(frozen=True)
class PrivacyAudit:
    """An empirical privacy audit of ``party``: a canary attack's ``correct`` right guesses
    out of ``guesses`` on ``canaries`` canaries, the empirical epsilon the ledger computed
    from them (nats, at its ``delta``, two-sided ``confidence`` Clopper-Pearson interval;
    ``empirical_upper`` None when unbounded), and ``claimed_epsilon``, the party's epsilon
    by the ledger when the result was recorded. ``refuted``: the lower end of the 99.9%
    interval exceeds it (:data:`capc.audit.bounds.REFUTE_CONFIDENCE`)."""

    id: int
    party: str
    at: str
    actor: str
    attack: str
    canaries: int
    guesses: int
    correct: int
    confidence: float
    delta: float
    accountant: str
    claimed_epsilon: float
    empirical_lower: float
    empirical_point: float | None
    empirical_upper: float | None
    refuted: bool
