"""The persistent privacy ledger: budgets checked before anything is spent.

:class:`Ledger` is one object over one database (SQLite file by default,
PostgreSQL by URL), put together from parts with one job each:

- :mod:`~services.common.ledger.reservations`: a round's reserve, release,
  commit and abort, and recovery after a restart (the write path; its module
  docstring states the life cycle and why a crash may over-count, never
  under-count);
- :mod:`~services.common.ledger.reads`: budgets, spends, rounds, entries, history;
- :mod:`~services.common.ledger.registry`: parties, caps, teacher counts,
  tasks, allowances, reports, kept settings;
- :mod:`~services.common.ledger.auditlog`: the hash-chained audit log, its
  signing key and head (the chain itself: :mod:`~services.common.ledger.audit`,
  appending in a transaction: :mod:`~services.common.ledger.chain`);
- :mod:`~services.common.ledger.trainings`: parties' DP-SGD trainings, charged once;
- :mod:`~services.common.ledger.empirical`: recorded canary attacks;
- :mod:`~services.common.ledger.schema`: migrations and the accountant and
  delta a ledger is created with.

Every change appends to the audit log in the same transaction; with a signing
key (the guardian's), every head of the chain is signed.

The same store is an answering party's own ledger: one party (itself), its
own cap, rounds keyed by the guardian's round ids, each charged from the
round's mechanism by the same accountant (:mod:`services.answerer.budget`).

The names other code imports from here stay here (re-exported).
"""

from __future__ import annotations

import threading

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from numpy.typing import ArrayLike

from services.common.db import make_engine, normalise_url
from services.common.ledger.auditlog import AuditLog
from services.common.ledger.base import MAX_CAP_REASON, OWN_SETTINGS, FloatArray
from services.common.ledger.empirical import MAX_CANARIES, EmpiricalAudits
from services.common.ledger.reads import Reads
from services.common.ledger.records import (
    AuditEntry,
    KeptSetting,
    LedgerEntry,
    PartyBudget,
    PrivacyAudit,
    RoundCharges,
)
from services.common.ledger.registry import Registry
from services.common.ledger.reservations import Reservations
from services.common.ledger.schema import HEAD_REVISION, MIGRATIONS, Schema
from services.common.ledger.trainings import Trainings

#: Kept under their old names for code and tests that read them here.
_MIGRATIONS = MIGRATIONS
_OWN_SETTINGS = OWN_SETTINGS

__all__ = [
    "HEAD_REVISION",
    "MAX_CANARIES",
    "MAX_CAP_REASON",
    "AuditEntry",
    "FloatArray",
    "KeptSetting",
    "Ledger",
    "LedgerEntry",
    "PartyBudget",
    "PrivacyAudit",
    "RoundCharges",
]


class Ledger(Reservations, Reads, Registry, Trainings, EmpiricalAudits, AuditLog, Schema):
    """The guardian's ledger at ``url`` (SQLite path/URL or PostgreSQL URL).

    ``accountant`` (a name of :data:`capc.privacy.accountants.ACCOUNTANTS`;
    default the tightest sound one, exact Gaussian DP), ``orders`` (Renyi
    orders, ``rdp`` only) and ``delta`` are fixed when the ledger is created;
    opening it later with other values is refused, because stored loss
    vectors only mean something to the accountant that wrote them
    (``delta=None`` takes the stored one). ``signer``: the Ed25519 key that
    signs every audit head (the guardian's), never stored in the database.
    """

    def __init__(
        self,
        url: str,
        *,
        accountant: str | None = None,
        orders: ArrayLike | None = None,
        delta: float | None = 1e-5,
        migrate: bool = True,
        signer: Ed25519PrivateKey | None = None,
    ) -> None:
        self.url = normalise_url(url)
        self.engine = make_engine(self.url)
        self._batching = threading.local()
        if migrate:
            self.migrate()
        self._check_revision()
        self._signer = None
        self.accounting, self.delta = self._settings(accountant, orders, delta)
        if signer is not None:
            self._adopt_key(signer)

    def close(self) -> None:
        self.engine.dispose()
