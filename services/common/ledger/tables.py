"""The ledger's tables as SQLAlchemy Core objects, and the row locks the write path takes.

The ORM classes in :mod:`services.common.ledger.models` define the schema (the
migrations create exactly it); the write path and the reads a round needs run
Core statements on these tables instead, so a round costs a few statements
and no unit of work, identity map or per-row object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Connection, Table, bindparam, select, update

from services.common.ledger import models

settings = cast(Table, models.Setting.__table__)
parties = cast(Table, models.PartyRow.__table__)
spend = cast(Table, models.SpendRow.__table__)
tasks = cast(Table, models.TaskRow.__table__)
rounds = cast(Table, models.RoundRow.__table__)
charges = cast(Table, models.ChargeRow.__table__)
audit_log = cast(Table, models.AuditRow.__table__)
allowances = cast(Table, models.AllowanceRow.__table__)
querier_spend = cast(Table, models.QuerierSpendRow.__table__)

FloatArray = NDArray[np.float64]


@dataclass
class Spend:
    """A party's running totals, read under its row lock and written back once."""

    loss: FloatArray
    rounds: int
    rounds_asked: int


def lock_spends(conn: Connection, names: Sequence[str]) -> dict[str, Spend]:
    """Spend rows of ``names``, locked for this transaction in a fixed order (no deadlocks)."""
    rows = conn.execute(
        select(spend.c.party, spend.c.loss, spend.c.rounds, spend.c.rounds_asked)
        .where(spend.c.party.in_(names))
        .order_by(spend.c.party)
        .with_for_update()
    )
    return {
        p: Spend(np.asarray(loss, dtype=np.float64), int(n), int(asked))
        for p, loss, n, asked in rows
    }


def lock_querier_spends(
    conn: Connection, querier: str, names: Sequence[str]
) -> dict[str, FloatArray]:
    """A querier's per-party loss vectors, locked in a fixed order."""
    rows = conn.execute(
        select(querier_spend.c.party, querier_spend.c.loss)
        .where(querier_spend.c.querier == querier, querier_spend.c.party.in_(names))
        .order_by(querier_spend.c.party)
        .with_for_update()
    )
    return {p: np.asarray(loss, dtype=np.float64) for p, loss in rows}


def write_spends(conn: Connection, spends: dict[str, Spend], names: Sequence[str]) -> None:
    """Write back the spend rows of ``names`` (one statement, executed for each)."""
    if not names:
        return
    conn.execute(
        update(spend)
        .where(spend.c.party == bindparam("b_party"))
        .values(
            loss=bindparam("b_loss", type_=spend.c.loss.type),
            rounds=bindparam("b_rounds"),
            rounds_asked=bindparam("b_asked"),
        ),
        [
            {
                "b_party": p,
                "b_loss": spends[p].loss.tolist(),
                "b_rounds": spends[p].rounds,
                "b_asked": spends[p].rounds_asked,
            }
            for p in names
        ],
    )


def write_querier_spends(
    conn: Connection, querier: str, shares: dict[str, FloatArray], names: Sequence[str]
) -> None:
    """Write back the querier's loss vectors on ``names`` (rows that exist)."""
    if not names:
        return
    conn.execute(
        update(querier_spend)
        .where(
            querier_spend.c.querier == bindparam("b_querier"),
            querier_spend.c.party == bindparam("b_party"),
        )
        .values(loss=bindparam("b_loss", type_=querier_spend.c.loss.type)),
        [{"b_querier": querier, "b_party": p, "b_loss": shares[p].tolist()} for p in names],
    )
