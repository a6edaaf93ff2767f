"""The answering parties' live streams at the guardian, and the streams each identity holds.

A party keeps one bidirectional stream; what the hub sends it goes through its
bounded outbox. A second stream under a live party's identity means a copied
key and is refused; a dead or silent one is replaced, so a party that lost its
connection gets back in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from capc.round.errors import LimitError
from capc.round.training import Attestation
from services.common.buffers import BoundedBuffer
from services.common.limits import (
    MAX_STREAMS_PER_IDENTITY,
    MAX_TEACHERS_PER_PARTY,
    PARTY_OUTBOX_MESSAGES,
)
from services.common.protocol import RequestError
from services.guardian.round_errors import DuplicateLinkError
from services.proto.capc.v1 import guardian_pb2

# A party sends a heartbeat every 10 s; a stream silent for this long is dead even
# if its transport has not noticed yet (a host that lost power sends no FIN).
SILENT_AFTER_S = 35.0


def always_active() -> bool:
    return True


@dataclass
class PartyLink:
    """An answering party's live stream: what the hub sends it goes through ``outbox``
    (bounded: a party that stops reading cannot make the guardian hold more).

    ``peer`` is the stream's network address; ``active`` says whether its RPC
    is still open (the servicer context's ``is_active``).
    """

    name: str
    peer: str = ""
    active: Callable[[], bool] = always_active
    outbox: BoundedBuffer[guardian_pb2.HubMessage] = field(
        default_factory=lambda: BoundedBuffer(PARTY_OUTBOX_MESSAGES)
    )
    last_heard: float = field(default_factory=time.monotonic)
    #: Teachers the party votes with (its Register): its counts of a query sum to this.
    teachers: int = 1
    #: The DP-SGD training of every teacher it votes with, attested in its Register and
    #: charged in the guardian's ledger; None: ordinary teachers.
    trained: Attestation | None = None
    #: The tasks (name, config hash: two names may share a configuration) whose
    #: definition this stream has been sent.
    tasks: set[tuple[str, str]] = field(default_factory=set)

    def heard(self) -> None:
        """The party sent something on this stream."""
        self.last_heard = time.monotonic()

    def alive(self, silent_after: float = SILENT_AFTER_S) -> bool:
        return self.active() and time.monotonic() - self.last_heard < silent_after


class Links:
    """Party links by name and stream counts by identity. Its own lock is never held
    while it calls out, so a caller may hold its lock around these calls (never the
    other way round)."""

    def __init__(self, silent_after: float = SILENT_AFTER_S) -> None:
        self._lock = threading.Lock()
        self.silent_after = silent_after
        self._by_name: dict[str, PartyLink] = {}
        self._streams: dict[str, int] = {}

    def admit_stream(self, identity: str, what: str) -> Callable[[], None]:
        """Count one more stream for ``identity``; returns what to call when it ends.

        Raises :class:`LimitError` when the identity holds MAX_STREAMS_PER_IDENTITY already.
        """
        with self._lock:
            held = self._streams.get(identity, 0)
            if held >= MAX_STREAMS_PER_IDENTITY:
                raise LimitError(
                    f"{identity} already holds {held} streams to the guardian, the most one "
                    f"identity may (MAX_STREAMS_PER_IDENTITY); this {what} stream is refused. "
                    "Close idle clients before opening more (a student client holds one "
                    "Compute stream, and one Relay stream in encrypted mode; an answering "
                    "party one Connect stream)"
                )
            self._streams[identity] = held + 1
        released = threading.Event()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            with self._lock:
                left = self._streams.get(identity, 1) - 1
                if left:
                    self._streams[identity] = left
                else:
                    self._streams.pop(identity, None)

        return release

    def streams(self, identity: str) -> int:
        with self._lock:
            return self._streams.get(identity, 0)

    def attach(
        self, name: str, peer: str, active: Callable[[], bool], teachers: int
    ) -> tuple[PartyLink, PartyLink | None]:
        """A party's stream opened: (its link, the dead link it replaces, if any).

        :class:`DuplicateLinkError` while the party's earlier stream is alive (open
        and heard from within ``silent_after``): a silent takeover would hand a copied
        key the party's rounds.
        """
        if not 1 <= teachers <= MAX_TEACHERS_PER_PARTY:
            raise RequestError(
                f"a party votes with 1 to {MAX_TEACHERS_PER_PARTY} teachers, {name} "
                f"registered {teachers}"
            )
        link = PartyLink(name, peer, active, teachers=teachers)
        with self._lock:
            old = self._by_name.get(name)
            if old is not None and old.alive(self.silent_after):
                raise DuplicateLinkError(name, old.peer)
            self._by_name[name] = link
        return link, old

    def remove(self, link: PartyLink) -> None:
        """``link``'s stream closed (a newer stream of the party keeps its own)."""
        with self._lock:
            if self._by_name.get(link.name) is link:
                del self._by_name[link.name]

    def get(self, name: str) -> PartyLink | None:
        with self._lock:
            return self._by_name.get(name)

    def connected(self) -> list[str]:
        with self._lock:
            return sorted(self._by_name)

    def reachable(self) -> list[str]:
        """Connected parties heard from within ``silent_after`` s: those a round can ask.

        A hospital behind a partition keeps its stream open until its transport
        notices; it sends no heartbeat meanwhile, so it is left out of new rounds
        (and not reserved for) instead of holding each round to its share timeout.
        """
        with self._lock:
            return sorted(n for n, link in self._by_name.items() if link.alive(self.silent_after))

    def teachers(self) -> dict[str, int]:
        """Teachers of every connected party."""
        with self._lock:
            return {n: link.teachers for n, link in self._by_name.items()}

    def trained(self) -> frozenset[str]:
        """Connected parties whose stream attested DP-trained teachers (charged here)."""
        with self._lock:
            return frozenset(n for n, link in self._by_name.items() if link.trained is not None)


__all__ = ["SILENT_AFTER_S", "Links", "PartyLink"]
