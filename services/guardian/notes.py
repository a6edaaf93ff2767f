"""What the answering parties tell the guardian every few seconds, written together.

Each party reports its own ledger at most every few seconds while rounds settle
(:mod:`services.answerer.party`), and sends a heartbeat every ten; the guardian
keeps the latest report and when it last heard from each party, for the admin
view (:func:`services.guardian.budgets.compare`). Written one by one, 200
parties make some 60 transactions a second, each a durable commit holding the
ledger's write lock that a round's reservation and settlement then wait for.
Here they are held in memory and written every :data:`NOTES_EVERY_S` seconds in
one transaction (:meth:`Ledger.note_parties`).

Neither is a ledger change (neither is audited, and no budget depends on one):
what a crash loses is the last second's, which the parties send again (a party
reports again once it reconnects).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Mapping

from services.common.ledger import Ledger
from services.common.ledger.models import utcnow

log = logging.getLogger("capc.guardian.notes")

#: Seconds between writes of the parties' reports and heartbeats.
NOTES_EVERY_S = 1.0


class PartyNotes:
    """The parties' latest reports and heartbeats, held until :meth:`flush`."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._lock = threading.Lock()
        self._reports: dict[str, tuple[Mapping[str, object], dt.datetime]] = {}
        self._seen: dict[str, dt.datetime] = {}

    def report(self, name: str, report: Mapping[str, object]) -> None:
        """Party ``name`` reported its own ledger now (a newer report replaces one held)."""
        with self._lock:
            self._reports[name] = (report, utcnow())

    def seen(self, name: str) -> None:
        """Party ``name`` was heard from now."""
        with self._lock:
            self._seen[name] = utcnow()

    def flush(self) -> None:
        """Write what is held, in one transaction; what fails to be written is kept for
        the next flush unless newer news of its party came meanwhile."""
        with self._lock:
            reports, self._reports = self._reports, {}
            seen, self._seen = self._seen, {}
        try:
            self.ledger.note_parties(reports, seen)
        except Exception:
            with self._lock:
                self._reports = {**reports, **self._reports}
                self._seen = {**seen, **self._seen}
            raise

    def keep_writing(self, stop: threading.Event, every: float = NOTES_EVERY_S) -> None:
        """Flush every ``every`` seconds until ``stop`` is set (whoever stops the hub
        flushes what is left once its streams are closed)."""
        while not stop.wait(every):
            try:
                self.flush()
            except Exception:  # a ledger hiccup must not end the writer; the next pass retries
                log.exception("writing the parties' reports and heartbeats failed")


__all__ = ["NOTES_EVERY_S", "PartyNotes"]
