"""The guardian's round engine: the adapter between its streams and the round core.

The protocol's rules live in :class:`capc.round.GuardianCore` (reservation before
anything is spent, quorum, leaving parties out, the vote check, settlement,
retry without a party, the reaper). This engine does what needs I/O, threads
or a clock: it keeps the parties' links (:mod:`services.guardian.links`) and the
students' relays (:mod:`services.guardian.relays`), holds one lock around every
call into the core (its ledger transactions included, so a reservation, a
release and the reaper never interleave), sends the work and the settlements,
waits for shares and runs the garbled circuit over the student's 2PC session
(:mod:`services.guardian.compute`); wire messages become the core's messages
once, in :mod:`services.common.serde`.

Personalized budgets (weights or participation, from the caps and the
guardian's randomness, never from the data) and the parties' own ledgers
(:mod:`services.guardian.budgets`) are as the core and that module say.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from capc.mpc.channel import Channel
from capc.privacy.randomness import SecureRandom
from capc.round import GuardianCore, RoundView
from capc.round.admission import check_task
from capc.round.errors import RoundInputError
from capc.task_config import TaskConfig, TaskError, canonical_json
from services.common import protocol, serde
from services.common.buffers import BoundedBuffer, Signal
from services.common.ledger import Ledger
from services.common.limits import MAX_OPEN_ROUNDS_PER_QUERIER, ROUND_TIMEOUT_S
from services.common.protocol import RequestError, check_version
from services.guardian import budgets
from services.guardian.compute import GarbleQueue
from services.guardian.ledger_port import SqlRoundLedger
from services.guardian.links import SILENT_AFTER_S, Links, PartyLink, always_active
from services.guardian.loop import terms_for
from services.guardian.notes import PartyNotes
from services.guardian.relays import Relays
from services.proto.capc.v1 import guardian_pb2

log = logging.getLogger("capc.guardian.rounds")


@dataclass
class LiveRound:
    """A round in the core, with what only the service has: the signal its opener waits
    on (every included party answered or failed, or the round ended) and the stream
    each party's work went out on (only that stream's end fails the party)."""

    state: RoundView[TaskConfig]
    complete: Signal
    sent: dict[str, PartyLink]

    @property
    def round_id(self) -> int:
        return self.state.round_id

    @property
    def included(self) -> tuple[str, ...]:
        return self.state.included

    @property
    def excluded(self) -> Mapping[str, float]:
        return self.state.excluded

    @property
    def ciphertext_hash(self) -> bytes | None:
        return self.state.ciphertext_hash


class RoundEngine:
    """Rounds in flight and the answering parties' links."""

    def __init__(
        self,
        ledger: Ledger,
        share_timeout: float = 60.0,
        rng: SecureRandom | None = None,
        silent_after: float = SILENT_AFTER_S,
        round_timeout: float = ROUND_TIMEOUT_S,
    ) -> None:
        if round_timeout <= share_timeout:
            raise ValueError(
                f"the round timeout ({round_timeout:g} s) must exceed the share timeout "
                f"({share_timeout:g} s): a round collects shares before its 2PC can start"
            )
        self.ledger = ledger
        self.share_timeout = share_timeout
        self.round_timeout = round_timeout
        self._lock = threading.Lock()
        self.core: GuardianCore[TaskConfig] = GuardianCore(
            SqlRoundLedger(ledger),
            round_timeout=round_timeout,
            rng=rng,
            max_open=MAX_OPEN_ROUNDS_PER_QUERIER,
        )
        self.links = Links(silent_after)
        self.relays = Relays(self._lock, self.core, self.links)
        self._live: dict[int, LiveRound] = {}
        self.garbler = GarbleQueue(self)
        #: The parties' reports and heartbeats, written together (services.guardian.notes).
        self.notes = PartyNotes(ledger)

    @property
    def silent_after(self) -> float:
        return self.links.silent_after

    @contextlib.contextmanager
    def step(self) -> Iterator[GuardianCore[TaskConfig]]:
        """One call into the core, under the lock, its refusals as the service's; the
        rounds it ended are then told to their parties and their openers."""
        try:
            with self._lock:
                yield self.core
        finally:
            with self._lock:
                gone = [rid for rid in self._live if not self.core.is_open(rid)]
                ended = [self._live.pop(rid) for rid in gone]
            for live in ended:
                live.complete.set()
                self._notify(live)

    # -- answering parties ---------------------------------------------------------
    def attach(
        self,
        name: str,
        peer: str = "",
        active: Callable[[], bool] = always_active,
        teachers: int = 1,
    ) -> PartyLink:
        """A party's stream opened (see :meth:`Links.attach`)."""
        link, old = self.links.attach(name, peer, active, teachers)
        if old is not None:
            log.info(
                "party %s reconnected from %s; its old stream (%s) was dead", name, peer, old.peer
            )
            old.outbox.close()
        self.ledger.touch(name)
        return link

    def detach(self, link: PartyLink) -> None:
        """A party's stream closed: it is left out of rounds still waiting for it there."""
        self.links.remove(link)
        with self._lock:
            waiting = [
                r
                for r in self._live.values()
                if r.sent.get(link.name) is link and not r.complete.is_set()
            ]
        for r in waiting:
            self._failed(r.round_id, link.name)

    def connected(self) -> list[str]:
        return self.links.connected()

    def reachable(self) -> list[str]:
        return self.links.reachable()

    def teachers(self) -> dict[str, int]:
        return self.links.teachers()

    def _failed(self, round_id: int, name: str) -> bool:
        with self.step() as core:
            asked = core.party_failed(round_id, name)
            live = self._live.get(round_id)
            done = asked and core.collected(round_id)
        if done and live is not None:
            live.complete.set()
        return asked

    def report_failure(self, name: str, round_id: int, reason: str) -> bool:
        """A party cannot answer a round; False when the round did not ask it."""
        asked = self._failed(round_id, name)
        if asked:
            log.warning("party %s could not answer round %d: %s", name, round_id, reason)
        return asked

    def receive_shares(self, name: str, msg: guardian_pb2.Shares) -> None:
        """Accept one party's shares for a round; replays and wrong shapes are refused."""
        with self.step() as core:
            layout = core.layout(msg.round_id, name)
            try:
                shares = serde.party_shares_from_proto(msg, name, layout)
            except RequestError as err:
                raise RoundInputError(str(err)) from None
            done = core.receive(shares)
            live = self._live.get(msg.round_id)
        if done and live is not None:
            live.complete.set()

    # -- student ---------------------------------------------------------------------
    def open_round(
        self, querier: str, request: guardian_pb2.OpenRoundRequest, session_id: bytes
    ) -> guardian_pb2.OpenRoundReply:
        """Reserve, distribute, collect; raises QuorumError, RoundInputError or RoundRefusedError."""
        rnd = self.begin_round(querier, request, session_id)
        rnd.complete.wait(self.share_timeout)
        return self.finish_round(rnd)

    def _task(self, request: guardian_pb2.OpenRoundRequest) -> tuple[TaskConfig, str]:
        """The request's task running the job's mechanism, and the task's canonical JSON.
        The job's mechanism arrives resolved (the student's, at job creation) and is
        checked here once: the task's own or a tightening of it, or the round is refused."""
        header = request.header
        check_version(header, "guardian")
        config, digest = self.ledger.task(header.task)
        task = TaskConfig.parse(header.task, config, digest)
        if header.config_hash != digest:
            raise RequestError(
                f"task {task.name} has config hash {digest}, the request "
                f"{header.config_hash or 'none'}; fetch the task again"
            )
        if request.HasField("mechanism"):
            try:
                task = task.running(serde.mechanism_from_proto(request.mechanism))
            except TaskError as err:
                raise RequestError(str(err)) from err
        check_task(task)
        return task, canonical_json(config)

    def begin_round(
        self, querier: str, request: guardian_pb2.OpenRoundRequest, session_id: bytes
    ) -> LiveRound:
        """Check the request, reserve and send the work; the round collects shares until
        ``complete`` is set or the share timeout passes, then :meth:`finish_round`."""
        task, task_json = self._task(request)
        queries = serde.query_batch_from_proto(request.queries, task)
        if queries.encrypted and not self.relays.has(querier, session_id):
            raise RequestError(
                "encrypted queries travel over the Relay stream: open it (with the same "
                "capc-session-id) before opening the round"
            )
        loop = terms_for(self.ledger, querier, request, queries.count)
        req = serde.round_request_from_proto(
            request, querier, session_id, queries, loop.left_out, loop.disclosure
        )
        with self.step() as core:
            core.retry_without(req)
        with self.step() as core:
            teachers = self.links.teachers()
            reachable, trained = self.links.reachable(), self.links.trained()
            rnd, work = core.open(task, req, reachable, teachers, time.monotonic(), trained)
            links = {p: self.links.get(p) for p in rnd.teachers}
            sent = {p: link for p, link in links.items() if link is not None}
            live = self._live[rnd.round_id] = LiveRound(rnd, Signal(), sent)
        header = protocol.header(task.name, task.config_hash)
        definition = serde.task_definition_to_proto(task_json)
        for w in work:
            link = sent[w.party]
            msg = serde.round_work_to_proto(w, request.queries)
            try:
                if (task.name, task.config_hash) not in link.tasks:
                    # Once per stream, before the first work naming the task (one outbox,
                    # in order); a race between two rounds sends it twice, harmlessly.
                    link.outbox.put_nowait(guardian_pb2.HubMessage(header=header, task=definition))
                    link.tasks.add((task.name, task.config_hash))
                link.outbox.put_nowait(guardian_pb2.HubMessage(header=header, work=msg))
            except queue.Full:
                log.warning(
                    "%s is not reading its stream (%d messages waiting): left out of round %d",
                    w.party,
                    link.outbox.qsize(),
                    rnd.round_id,
                )
                self._failed(rnd.round_id, w.party)
        with self._lock:
            if self.core.collected(rnd.round_id):  # every party failed already
                live.complete.set()
        return live

    def finish_round(self, rnd: LiveRound) -> guardian_pb2.OpenRoundReply:
        """After the shares are in (or the share timeout): abort below quorum, or queue the
        round for its vote check or 2PC and reply with the sealed seeds."""
        with self.step() as core:
            opened = core.close(rnd.round_id)
            now = core.view(rnd.round_id)
            ready = now is not None and now.ready
        rnd.complete.set()  # late shares are refused from here on
        if ready:
            self.garbler.ready(rnd.state.querier, rnd.state.session_id, rnd.round_id)
        return serde.opened_to_proto(opened)

    def check_votes(
        self, querier: str, session_id: bytes, msg: guardian_pb2.VoteCheck
    ) -> guardian_pb2.VoteCheckReply:
        """Verify the round's vote validity proofs with the student's verifier shares;
        invalid votes are left out, then the round is queued for its 2PC. Raises
        RoundInputError (malformed message) or RoundRefusedError (quorum lost)."""
        with self.step() as core:
            batch = core.vote_check_batch(msg.round_id, querier, session_id, list(msg.parties))
            try:
                student = serde.vote_check_from_proto(msg, batch)
            except RequestError as err:
                raise RoundInputError(str(err)) from None
            verdict = core.check_votes(msg.round_id, student)
        self.garbler.ready(querier, session_id, msg.round_id)
        return serde.vote_verdict_to_proto(verdict)

    # -- encrypted-query mode: relayed frames -----------------------------------------
    def open_relay(self, querier: str, session_id: bytes) -> BoundedBuffer[guardian_pb2.RelayFrame]:
        return self.relays.open(querier, session_id)

    def close_relay(
        self, querier: str, session_id: bytes, box: BoundedBuffer[guardian_pb2.RelayFrame]
    ) -> None:
        self.relays.close(querier, session_id, box)

    def relay_to_party(
        self, querier: str, session_id: bytes, frame: guardian_pb2.RelayFrame
    ) -> tuple[BoundedBuffer[guardian_pb2.HubMessage], guardian_pb2.HubMessage]:
        return self.relays.to_party(querier, session_id, frame)

    def relay_to_student(
        self, party: str, frame: guardian_pb2.RelayFrame
    ) -> tuple[BoundedBuffer[guardian_pb2.RelayFrame], guardian_pb2.RelayFrame]:
        return self.relays.to_student(party, frame)

    # -- the 2PC ---------------------------------------------------------------------
    def serve_compute(
        self,
        querier: str,
        channel: Channel,
        session_id: bytes,
        ended: Callable[[], bool] = lambda: False,
        idle_timeout: float = 600.0,
    ) -> int:
        """Garble every round this querier opens, over one 2PC session; returns rounds done.

        Returns when the student ends its stream (``ended``) or stays idle for ``idle_timeout`` s.
        """
        return self.garbler.serve(querier, channel, session_id, ended, idle_timeout)

    def abandon_round(self, rnd: LiveRound, why: str) -> None:
        """Nobody will compute ``rnd`` (its opener went away): settle it now, not at the
        timeout (aborted before its release, charged its reservation after)."""
        with self.step() as core:
            core.settle(rnd.round_id, why)

    def reap(self) -> list[int]:
        """Abort every round not released within ``round_timeout`` s of opening; returns their ids."""
        with self.step() as core:
            return core.reap(time.monotonic())

    def rates(
        self, task: TaskConfig, parties: list[str] | None = None
    ) -> dict[str, tuple[float, float]]:
        """(vote weight, participation rate) per party for ``task``, from the parties' caps."""
        return self.core.rates(task, parties)

    # -- the parties' own ledgers ------------------------------------------------------
    def _notify(self, rnd: LiveRound) -> None:
        """Tell every party the round was sent to how it ended for it (one read of the
        round for all of them: a round of 200 parties is 200 settlements)."""
        for name, settled in budgets.settlements(
            self.ledger, rnd.round_id, sorted(rnd.sent)
        ).items():
            link = self.links.get(name)
            if link is not None:
                budgets.deliver(link.outbox, settled)

    def settle(self, name: str, round_ids: list[int]) -> int:
        """Send ``name`` the settlement of each of ``round_ids`` that has ended; returns
        how many were sent (see :func:`budgets.send_settlements`)."""
        link = self.links.get(name)
        if link is None:
            return 0
        ended = self.not_open(round_ids)
        if not ended:
            return 0
        return budgets.send_settlements(self.ledger, name, link.outbox, ended)

    def not_open(self, round_ids: list[int]) -> list[int]:
        """Those of ``round_ids`` that are not open here: only those may have ended (every
        heartbeat names the round in flight, which needs no read of the ledger). Read
        without the lock, which a round's ledger steps hold: a lookup each, and a round
        that ends meanwhile is told to its parties as it ends, and at the next heartbeat."""
        return [r for r in round_ids if not self.core.is_open(r)]


__all__ = ["LiveRound", "RoundEngine"]
