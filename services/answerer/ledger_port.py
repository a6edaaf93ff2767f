"""A hospital's own SQL ledger behind the party role's ledger port
(:class:`capc.round.ledger.PartyLedger`).

Only calls the ledger's public methods; each is one transaction there. Its refusals
come out as the core's (:class:`capc.round.QuorumError`, DuplicateRoundError,
LedgerRefusedError), which :class:`capc.round.party.PartyCore` turns into its reasons.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from capc.privacy.accountants import Accounting
from capc.privacy.events import DpEvent
from capc.round import errors as core
from capc.round.ledger import Held, KeptSetting, RoundRecord, RoundState
from services.common.ledger import Ledger
from services.common.ledger import store as sql
from services.common.ledger.models import ChargeKind
from services.common.task import config_hash

#: Who settles a round in this ledger: the guardian's word, checked by the party.
ACTOR = "guardian"


@contextmanager
def _as_core() -> Iterator[None]:
    try:
        yield
    except sql.QuorumError as err:
        raise core.QuorumError(str(err), err.remaining) from None
    except sql.DuplicateRoundError as err:
        raise core.DuplicateRoundError(str(err)) from None
    except sql.RoundStateError as err:
        raise core.RoundStateError(str(err)) from None
    except sql.LedgerError as err:
        raise core.LedgerRefusedError(str(err)) from None


class SqlPartyLedger:
    """Party ``name``'s own ``ledger`` as its role's ledger port."""

    def __init__(self, ledger: Ledger, name: str) -> None:
        self.sql = ledger
        self.name = name
        # Tasks this ledger holds, name -> config hash: a round of a known task writes
        # nothing for it (a task's configuration never changes under its name).
        self._tasks: dict[str, str] = {}

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
        with _as_core():
            digest = self._tasks.get(task)
            if digest is None or digest != config_hash(dict(config)):
                self._tasks[task] = self.sql.create_task(task, config, actor=self.name)
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

    def round_record(self, round_id: int) -> RoundRecord | None:
        record = self.sql.round_record(round_id)
        if record is None:
            return None
        held = {
            p: Held(kind == ChargeKind.CHARGE, event is not None)
            for p, (kind, event) in record.charges.items()
        }
        return RoundRecord(
            record.round_id, RoundState(record.state.value), record.outcome, held, record.terms
        )

    def open_rounds(self) -> list[int]:
        return self.sql.open_rounds()

    def abort(self, round_id: int, *, reason: str, keep: KeptSetting | None = None) -> None:
        with _as_core():
            self.sql.abort(round_id, actor=ACTOR, reason=reason, keep=keep)

    def commit(
        self, round_id: int, charge: DpEvent | None, *, keep: KeptSetting | None = None
    ) -> None:
        actual = {} if charge is None else {self.name: charge}
        with _as_core():
            self.sql.commit(round_id, actual, actor=ACTOR, release=True, keep=keep)

    def commit_at_reservation(self, round_id: int, *, keep: KeptSetting | None = None) -> None:
        with _as_core():
            self.sql.commit_at_reservation(round_id, actor=ACTOR, release=True, keep=keep)


__all__ = ["SqlPartyLedger"]
