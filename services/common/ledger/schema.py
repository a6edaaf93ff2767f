"""The ledger's schema and what it is created with: Alembic migrations, the schema
revision check, and the accountant and delta fixed when a ledger is created."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from numpy.typing import ArrayLike
from sqlalchemy import select

from capc.privacy import accountants
from capc.privacy.accountants import Accounting, RenyiDp
from capc.privacy.conversion import DEFAULT_ORDERS
from services.common.ledger import audit
from services.common.ledger.base import LedgerBase
from services.common.ledger.errors import LedgerError
from services.common.ledger.models import Setting

MIGRATIONS = Path(__file__).with_name("migrations")
HEAD_REVISION = "0008"
_MIGRATION_LOCK = threading.Lock()


class Schema(LedgerBase):
    """Migrations and the settings a ledger is created with."""

    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision."""
        with _MIGRATION_LOCK:  # Alembic's op/context proxies are process-global
            self._migrate()

    def _migrate(self) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()

    def _check_revision(self) -> None:
        with self.engine.connect() as conn:
            rev = MigrationContext.configure(conn).get_current_revision()
        if rev != HEAD_REVISION:
            raise LedgerError(
                f"ledger schema is at revision {rev}, this guardian needs {HEAD_REVISION}; run `capc guardian --migrate`"
            )

    def _settings(
        self, kind: str | None, orders: ArrayLike | None, given: float | None
    ) -> tuple[Accounting, float]:
        # None: whatever delta the ledger was created with (readers such as `capc audit`).
        delta = 1e-5 if given is None else given
        if not (0 < delta < 1):
            raise LedgerError(f"delta must lie in (0, 1), got {delta}")
        if kind is not None and kind not in accountants.ACCOUNTANTS:
            raise LedgerError(
                f"unknown accountant {kind!r}; choose one of {', '.join(accountants.ACCOUNTANTS)}"
            )
        with self._tx() as s:
            stored = {row.key: row.value for row in s.scalars(select(Setting))}
            if "accountant" not in stored:
                name = kind or (
                    RenyiDp.name if orders is not None else accountants.DEFAULT_ACCOUNTANT
                )
                if name == RenyiDp.name:
                    fresh: Accounting = RenyiDp(DEFAULT_ORDERS if orders is None else orders)
                elif orders is not None:
                    raise LedgerError(f"the {name} accountant takes no Renyi orders")
                else:
                    fresh = accountants.make(name)
                saved = {"name": fresh.name, **fresh.settings()}
                s.add(Setting(key="accountant", value=json.dumps(saved)))
                s.add(Setting(key="delta", value=repr(float(delta))))
                s.add(Setting(key="audit_head", value=json.dumps([0, audit.GENESIS])))
                return fresh, float(delta)
        saved = json.loads(stored["accountant"])
        have = accountants.make(str(saved.pop("name")), saved)
        have_delta = float(stored["delta"])
        if kind is not None and kind != have.name:
            raise LedgerError(
                f"this ledger was created with the {have.name} accountant, not {kind}; "
                "open it without choosing one"
            )
        if orders is not None and not (
            isinstance(have, RenyiDp) and np.array_equal(have.orders, np.asarray(orders))
        ):
            raise LedgerError(
                "this ledger was created with another order grid; open it without `orders`"
            )
        if given is not None and have_delta != delta:
            raise LedgerError(f"this ledger accounts at delta={have_delta}, not {delta}")
        return have, have_delta

    @property
    def accountant(self) -> str:
        """The name of the ledger's accountant."""
        return self.accounting.name

    def accounting_json(self) -> str:
        """What two ledgers must share for their loss vectors to be compared, as canonical
        JSON: the accountant with its settings, and delta."""
        ident = {
            "accountant": {"name": self.accounting.name, **self.accounting.settings()},
            "delta": self.delta,
        }
        return json.dumps(ident, sort_keys=True, separators=(",", ":"))
