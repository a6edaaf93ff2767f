"""A party's own ledger in memory (:class:`~capc.round.ledger.PartyLedger`), over a
:class:`~capc.round.memory_ledger.MemoryLedger` holding one party, itself: the same
reservation, release, commit and abort rules as the guardian's ledger, rounds numbered
as the guardian numbers them, and a task's configuration fixed under its name.

For tests and the central driver (:mod:`capc.round.central`); a hospital's own SQL
ledger is behind the same port in ``services.answerer.ledger_port``.
"""

from __future__ import annotations

from collections.abc import Mapping

from capc.privacy import accountants
from capc.privacy.accountants import Accounting
from capc.privacy.events import DpEvent
from capc.round.errors import LedgerRefusedError
from capc.round.ledger import KeptSetting, RoundRecord
from capc.round.memory_ledger import MemoryLedger
from capc.round.training import OWN_FIX, Attestation, TrainingCharge


class MemoryPartyLedger:
    """Party ``name``'s own ledger in memory, with its own ``cap`` (epsilon at ``delta``).

    ``kept``: the settings kept with settlements (the guardian's audit heads), last value
    per key, as the SQL ledger's settings keep them.
    """

    def __init__(
        self,
        name: str,
        cap: float,
        *,
        accounting: Accounting | None = None,
        delta: float = 1e-5,
    ) -> None:
        self.name = name
        self.ledger = MemoryLedger(
            accounting=accounting or accountants.make(accountants.DEFAULT_ACCOUNTANT),
            delta=delta,
        )
        self.ledger.register(name, cap)
        self.kept: dict[str, str] = {}
        self._tasks: dict[str, dict[str, object]] = {}

    @property
    def accounting(self) -> Accounting:
        return self.ledger.accounting

    @property
    def delta(self) -> float:
        return self.ledger.delta

    @property
    def cap(self) -> float:
        return self.ledger.caps()[self.name]

    def spent(self) -> float:
        """Epsilon spent, open reservations counted."""
        return self.ledger.spent(self.name)

    def reserve_vote(
        self,
        round_id: int,
        task: str,
        config: Mapping[str, object],
        queries: int,
        worst_case: DpEvent,
        *,
        mechanism: str,
        terms: Mapping[str, object],
    ) -> None:
        known = self._tasks.get(task)
        if known is not None and known != dict(config):
            raise LedgerRefusedError(
                f"task {task!r} exists with another configuration; use a new task name"
            )
        self.ledger.reserve(
            f"guardian-round-{round_id}",
            task,
            "guardian",
            queries,
            {self.name: worst_case},
            mechanism=mechanism,
            quorum=1,
            round_id=round_id,
            terms=terms,
        )
        self._tasks.setdefault(task, dict(config))

    def charge_training(self, attestation: Attestation) -> TrainingCharge:
        return self.ledger.charge_training(self.name, attestation, actor=self.name, fix=OWN_FIX)

    def round_record(self, round_id: int) -> RoundRecord | None:
        return self.ledger.round_record(round_id)

    def open_rounds(self) -> list[int]:
        return self.ledger.open_rounds()

    def _keep(self, keep: KeptSetting | None) -> None:
        if keep is not None:
            self.kept[keep.key] = keep.value

    def abort(self, round_id: int, *, reason: str, keep: KeptSetting | None = None) -> None:
        self.ledger.abort(round_id, reason=reason)
        self._keep(keep)

    def commit(
        self, round_id: int, charge: DpEvent | None, *, keep: KeptSetting | None = None
    ) -> None:
        actual = {} if charge is None else {self.name: charge}
        self.ledger.commit(round_id, actual, release=True)
        self._keep(keep)

    def commit_at_reservation(self, round_id: int, *, keep: KeptSetting | None = None) -> None:
        self.ledger.commit_at_reservation(round_id, release=True)
        self._keep(keep)


__all__ = ["MemoryPartyLedger"]
