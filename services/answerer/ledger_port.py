"""A hospital's own SQL ledger behind the party role's ledger port
(:class:`capc.round.ledger.PartyLedger`).

Only calls the ledger's public methods. Its refusals are the core's
(:class:`capc.round.QuorumError`, DuplicateRoundError, LedgerRefusedError), which
:class:`capc.round.party.PartyCore` turns into its reasons.

One durable write a round: a settlement is held here, not written, and goes into
the ledger in the transaction of the next round's reservation (or at :meth:`flush`,
which the party calls before it reports its ledger and when it stops). Until then
the round's worst case stays reserved in the database, so a crash in between
over-counts, never under-counts: the restarted party names the round as open and
the guardian settles it again. Reads here see a held settlement as written.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace

from capc.privacy.accountants import Accounting
from capc.privacy.events import DpEvent
from capc.round import errors as core
from capc.round.ledger import Held, KeptSetting, RoundRecord, RoundState
from capc.round.training import OWN_FIX, Attestation, TrainingCharge
from capc.task_config import config_hash
from services.common.ledger import Ledger

#: Who settles a round in this ledger: the guardian's word, checked by the party.
ACTOR = "guardian"

log = logging.getLogger("capc.answerer.ledger")


class SqlPartyLedger:
    """Party ``name``'s own ``ledger`` as its role's ledger port."""

    def __init__(self, ledger: Ledger, name: str) -> None:
        self.sql = ledger
        self.name = name
        # Tasks this ledger holds, name -> config hash: a round of a known task writes
        # nothing for it (a task's configuration never changes under its name).
        self._tasks: dict[str, str] = {}
        # Settlements not yet written, by round, in the order they were decided: the
        # state each leaves its round in and the write. Written in that order, so the
        # guardian head kept last is the newest (each is checked not to go back). The
        # lock orders them with the reservations they are written with.
        self._held: dict[int, tuple[RoundState, Callable[[], None]]] = {}
        # Rounds this port reserved whose settlement is not written yet, as a read of the
        # ledger would show them: a settlement reads its round here, not in the database
        # (only this party writes its ledger).
        self._reserved: dict[int, RoundRecord] = {}
        self._lock = threading.RLock()

    @property
    def accounting(self) -> Accounting:
        return self.sql.accounting

    @property
    def delta(self) -> float:
        return self.sql.delta

    @property
    def cap(self) -> float:
        return self.sql.budget(self.name).cap

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
        refused: core.LedgerRefusedError | None = None
        created: str | None = None
        try:
            with self._lock, self.sql.batch():
                self._write_held()
                try:
                    digest = self._tasks.get(task)
                    if digest is None or digest != config_hash(dict(config)):
                        self._tasks.pop(task, None)
                        created = self.sql.create_task(task, config, actor=self.name)
                    self.sql.reserve(
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
                except core.LedgerRefusedError as err:
                    # Refused: nothing of it is written, and the settlements before it are.
                    refused = err
        except core.BatchBrokenError as err:
            # A write that failed part-way (a round id the database took as used):
            # nothing of the batch is written. Its settlements' rounds stay reserved (an
            # over-count the guardian settles again when the party names them open).
            refused = err
        # Known only once its batch committed: an error that rolls the batch back rolls
        # the task back too, and the next round of it writes it again.
        if created is not None and refused is None:
            self._tasks[task] = created
        if refused is None:
            with self._lock:
                # As the ledger stores the terms: JSON.
                self._reserved[round_id] = RoundRecord(
                    round_id,
                    RoundState.RESERVED,
                    None,
                    {self.name: Held(False, True)},
                    json.loads(json.dumps(dict(terms))),
                )
        if refused is not None:
            raise refused

    def charge_training(self, attestation: Attestation) -> TrainingCharge:
        """The training's charge, in its own durable transaction (before the party
        registers: :mod:`capc.round.training`)."""
        with self._lock:
            self.flush()
            return self.sql.charge_training(self.name, attestation, actor=self.name, fix=OWN_FIX)

    def flush(self) -> None:
        """Write the settlements held here, in one transaction."""
        with self._lock:
            if self._held:
                with self.sql.batch():
                    self._write_held()

    def _write_held(self) -> None:
        """Inside a batch: each held settlement; a refused one is logged (its round stays
        reserved: an over-count, and the party asks the guardian about it again)."""
        held, self._held = self._held, {}
        for round_id, (_, write) in held.items():
            # From now on the database says how the round stands.
            self._reserved.pop(round_id, None)
            try:
                write()
            except core.LedgerRefusedError as err:
                log.error("round %d could not be settled in this ledger: %s", round_id, err)

    def _hold(self, round_id: int, state: RoundState, write: Callable[[], None]) -> None:
        with self._lock:
            self._held.pop(round_id, None)  # a round decided again goes last
            self._held[round_id] = (state, write)

    def round_record(self, round_id: int) -> RoundRecord | None:
        with self._lock:
            mine = self._reserved.get(round_id)
            settled = self._held.get(round_id)
        out = self._stored(round_id) if mine is None else mine
        if out is None:
            return None
        return out if settled is None else replace(out, state=settled[0])

    def _stored(self, round_id: int) -> RoundRecord | None:
        return self.sql.round_held(round_id)

    def open_rounds(self) -> list[int]:
        with self._lock:
            held = set(self._held)
        return [r for r in self.sql.open_rounds() if r not in held]

    def abort(self, round_id: int, *, reason: str, keep: KeptSetting | None = None) -> None:
        def write() -> None:
            self.sql.abort(round_id, actor=ACTOR, reason=reason, keep=keep)

        self._hold(round_id, RoundState.ABORTED, write)

    def commit(
        self, round_id: int, charge: DpEvent | None, *, keep: KeptSetting | None = None
    ) -> None:
        actual = {} if charge is None else {self.name: charge}

        def write() -> None:
            self.sql.commit(round_id, actual, actor=ACTOR, release=True, keep=keep)

        self._hold(round_id, RoundState.COMMITTED, write)

    def commit_at_reservation(self, round_id: int, *, keep: KeptSetting | None = None) -> None:
        def write() -> None:
            self.sql.commit_at_reservation(round_id, actor=ACTOR, release=True, keep=keep)

        self._hold(round_id, RoundState.COMMITTED, write)


__all__ = ["SqlPartyLedger"]
