"""What every part of the ledger shares: its engine, accountant and delta, transactions,
the audit append, and the arithmetic that keeps totals from shrinking.

:class:`LedgerBase` holds the state; each responsibility is a mixin over it
(:mod:`~services.common.ledger.schema`, :mod:`~services.common.ledger.auditlog`,
:mod:`~services.common.ledger.registry`, :mod:`~services.common.ledger.reservations`,
:mod:`~services.common.ledger.reads`, :mod:`~services.common.ledger.empirical`),
and :class:`services.common.ledger.store.Ledger` combines them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from numpy.typing import NDArray
from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import Session

from capc.privacy.accountants import Accounting, UnsupportedEventError
from capc.privacy.events import DpEvent
from capc.round.errors import BatchBrokenError, LedgerRefusedError, UnknownTaskError
from services.common.ledger import chain
from services.common.ledger.records import KeptSetting
from services.common.ledger.tables import (
    INSERT_SETTING,
    SETTING_LOCKED,
    UPDATE_SETTING_CHANGED,
    tasks,
)
from services.common.limits import MAX_TEACHERS_PER_PARTY

FloatArray = NDArray[np.float64]
#: Settings only the ledger itself writes.
OWN_SETTINGS = frozenset({"accountant", "delta", "audit_head", "audit_key"})
#: Characters of a cap change's reason kept in the audit log.
MAX_CAP_REASON = 512


class Batch:
    """An open :meth:`LedgerBase.batch`: its connection, the audit entries its steps made
    (appended at its end, in order), and the error that broke it, if one did."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.entries: list[chain.Entry] = []
        self.broken: BaseException | None = None
        # SQLite counts the rows every statement changed; a refusal that comes after a
        # change breaks the batch (see LedgerBase._write). None where the driver keeps
        # no such count (psycopg): there the rule holds by the order of each step.
        driver = conn.connection.driver_connection
        self._changes = driver if hasattr(driver, "total_changes") else None

    def changes(self) -> int:
        return -1 if self._changes is None else int(self._changes.total_changes)


class LedgerBase:
    """The state every part of the ledger works on (set by ``Ledger.__init__``)."""

    url: str
    engine: Engine
    accounting: Accounting
    delta: float
    _signer: Ed25519PrivateKey | None
    #: This thread's open :meth:`batch` (``batch``: a :class:`Batch`), if any.
    _batching: threading.local

    # -- transactions -----------------------------------------------------------
    def _open_batch(self) -> Batch | None:
        return getattr(self._batching, "batch", None)

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        """An ORM session in one transaction (the registry and other cold paths); inside
        :meth:`batch` (this thread), a savepoint of the batch's transaction."""
        batch = self._open_batch()
        if batch is not None:
            made = len(batch.entries)
            try:
                with Session(
                    bind=batch.conn,
                    expire_on_commit=False,
                    join_transaction_mode="create_savepoint",
                ) as s:
                    yield s
                    s.commit()
            except BaseException:
                # Rolled back to its savepoint: so are the audit entries it made.
                del batch.entries[made:]
                raise
            return
        with Session(self.engine, expire_on_commit=False) as s, s.begin():
            yield s

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """A Core connection in one transaction (the round write path).

        Inside :meth:`batch` (this thread): the batch's own connection, with no savepoint
        (a savepoint costs two statements and a compile). Every step run this way raises
        its refusals (LedgerRefusedError) before its first write, so a refused step has written
        nothing and the batch goes on; any other error, or a refusal after a write (caught
        on SQLite, which counts changed rows), breaks the batch: it is rolled back when it
        ends. Its audit entries go in at the batch's end (:meth:`_append`)."""
        batch = self._open_batch()
        if batch is None:
            with self.engine.begin() as conn:
                yield conn
            return
        made, changed = len(batch.entries), batch.changes()
        try:
            yield batch.conn
        except LedgerRefusedError as err:
            del batch.entries[made:]
            if batch.changes() != changed:
                batch.broken = batch.broken or err
            raise
        except BaseException as err:
            batch.broken = batch.broken or err
            raise

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Every write this thread makes inside, in one transaction: one durable commit
        for all of them, with their audit entries appended at its end in one go.

        A write that is refused (its LedgerRefusedError raised to its caller) has written
        nothing, and the others stand; a write that fails otherwise breaks the batch:
        when the block ends it is rolled back and BatchBrokenError raised (unless another
        error leaves the block, which rolls it back too). Reads inside open their own
        connections and do not see the batch's writes until it commits; on SQLite a read
        on the batching thread waits for the batch's write lock (every transaction begins
        IMMEDIATE), so none is made there. Nested batches are one."""
        if self._open_batch() is not None:
            yield
            return
        with self.engine.begin() as conn:
            batch = Batch(conn)
            self._batching.batch = batch
            try:
                yield
                if batch.broken is not None:
                    raise BatchBrokenError(
                        f"a write failed part-way ({batch.broken!r}); nothing of its batch "
                        "was written"
                    ) from batch.broken
                chain.append(conn, batch.entries, self._signer)
            finally:
                self._batching.batch = None

    def _append(self, conn: Connection, entries: Sequence[chain.Entry]) -> None:
        """Append audit ``entries`` in ``conn``'s transaction; inside a batch, at its end
        (one read and one write of the chain's head for all of its steps)."""
        batch = self._open_batch()
        if batch is not None and batch.conn is conn:
            batch.entries.extend(entries)
        else:
            chain.append(conn, entries, self._signer)

    def _audit(
        self,
        s: Session | Connection,
        actor: str,
        action: str,
        detail: Mapping[str, object],
        note: str | None = None,
    ) -> None:
        """Append one audit entry in the transaction of ``s``."""
        conn = s.connection() if isinstance(s, Session) else s
        self._append(conn, [chain.Entry(actor, action, detail, note)])

    def _keep(self, conn: Connection, kept: KeptSetting) -> chain.Entry | None:
        """Write ``kept`` in ``conn``'s transaction; its audit entry, None when unchanged.
        A value that changes (a party's guardian head, every round) is one statement."""
        changed = UPDATE_SETTING_CHANGED.run(conn, {"b_key": kept.key, "b_value": kept.value})
        if not changed:
            if SETTING_LOCKED.first(conn, {"key": kept.key}) is not None:
                return None  # there, with this value
            conn.execute(INSERT_SETTING, {"key": kept.key, "value": kept.value})
        return chain.Entry(kept.actor, kept.action, {"key": kept.key, **(kept.detail or {})})

    # -- accounting ---------------------------------------------------------------
    def _eps(self, loss: Sequence[float] | FloatArray) -> tuple[float, float | None]:
        """(epsilon at the ledger's delta, best Renyi order or None) of a loss vector."""
        spent = self.accounting.spent(np.asarray(loss, dtype=np.float64), self.delta)
        return spent.epsilon, spent.order

    def _fits(self, loss: FloatArray, cap: float) -> bool:
        return self.accounting.fits(loss, cap, self.delta)

    def _loss(self, event: DpEvent, what: str) -> FloatArray:
        """An event's loss vector as a budget charge; LedgerRefusedError if the filter cannot take it."""
        try:
            loss = self.accounting.filter_cost(event)
        except (UnsupportedEventError, ValueError, ArithmeticError) as err:
            raise LedgerRefusedError(f"{what}: {err}") from err
        if not np.isfinite(loss).all():
            raise LedgerRefusedError(f"{what}: its privacy loss is not finite (noise too small?)")
        return loss


def unknown_task(s: Session | Connection, name: str) -> UnknownTaskError:
    """The error for a task ``name`` the ledger lacks, naming the tasks it has."""
    known = list(s.scalars(select(tasks.c.name).order_by(tasks.c.name)))
    listed = f"known tasks: {', '.join(known)}" if known else "no task is registered"
    return UnknownTaskError(f"no task named {name!r}; {listed}")


def check_setting(kept: KeptSetting | None) -> None:
    if kept is not None and (kept.key in OWN_SETTINGS or not 0 < len(kept.key) <= 64):
        raise LedgerRefusedError(f"{kept.key!r} is not a setting that can be kept")


def positive_cap(epsilon_cap: float) -> float:
    if not (
        isinstance(epsilon_cap, int | float) and math.isfinite(epsilon_cap) and epsilon_cap > 0
    ):
        raise LedgerRefusedError(f"epsilon cap must be a positive number, got {epsilon_cap}")
    return float(epsilon_cap)


def teacher_count(teachers: int) -> int:
    if isinstance(teachers, bool) or not isinstance(teachers, int):
        raise LedgerRefusedError(f"a teacher count is a whole number, got {teachers!r}")
    if not 1 <= teachers <= MAX_TEACHERS_PER_PARTY:
        raise LedgerRefusedError(
            f"a party votes with 1 to {MAX_TEACHERS_PER_PARTY} teachers, got {teachers}"
        )
    return teachers


def enforced(registered: float, declared: float | None) -> float:
    """The cap a ledger enforces: never above what the party itself declared."""
    return registered if declared is None else min(registered, declared)


def registered_cap(epsilon_cap: float, registered: float | None) -> float:
    """The cap a party's operator registered, from its row's enforced and registered caps."""
    # Every row has one since revision 0004 filled them; the column stays nullable.
    return epsilon_cap if registered is None else registered
