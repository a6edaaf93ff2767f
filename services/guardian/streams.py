"""The guardian's gRPC servicer on asyncio: no thread is held by a waiting stream.

Every hospital keeps a Connect stream open for as long as it runs, and every
student a Compute stream (and a Relay stream in encrypted mode), so the
guardian serves them as coroutines on one event loop: a stream that waits
for its next message, or for room in a bounded buffer, costs a few objects,
not a thread. What blocks runs elsewhere:

- ledger reads and writes, and the admin handlers of :class:`GuardianHub`
  (plain functions over the ledger and the round engine), run on a bounded
  thread pool;
- OpenRound reserves and sends the work on the pool, waits for the shares on
  the loop, and finishes on the pool;
- a student's 2PC session (garbling is CPU work) runs on a thread of its own,
  started at the session's first frame and ended with its stream; an idle
  Compute stream holds none, and MAX_STREAMS_PER_IDENTITY bounds how many one
  student may open (and how many Connect streams one party, registered or not).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar

import grpc

from capc.round.errors import (
    LimitError,
    RoundInputError,
    TeacherCountError,
    UnknownPartyError,
)
from capc.round.training import TrainingRefusedError
from services.common import protocol, serde, tls
from services.common.buffers import BoundedBuffer
from services.common.limits import (
    DUPLICATE_AUDIT_EVERY_S,
    MAX_SETTLE,
    MAX_TEACHERS_PER_PARTY,
    STREAM_SEND_TIMEOUT_S,
)
from services.common.mpc_stream import StreamChannel
from services.common.protocol import PROTOCOL_VERSION, RequestError
from services.guardian import budgets
from services.guardian.links import PartyLink
from services.guardian.round_errors import DuplicateLinkError
from services.guardian.status import REFUSALS, status_of
from services.proto.capc.v1 import guardian_pb2, guardian_pb2_grpc

if TYPE_CHECKING:
    from services.guardian.hub import GuardianHub

log = logging.getLogger("capc.guardian")

HEADER = protocol.header()
T = TypeVar("T")
#: A handler of one kind of a party's stream messages (hub, party, its link, message).
PartyHandler = Callable[
    ["AsyncGuardianHub", str, PartyLink, guardian_pb2.PartyMessage], Awaitable[None]
]


class _AbortedError(Exception):
    """A plain handler aborted its call; the servicer passes the status on."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class ThreadContext:
    """What a plain handler needs of its call's context, usable from a pool thread.

    ``abort`` raises instead of ending the call: the coroutine that ran the
    handler aborts the call on the event loop.
    """

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._context = context
        self._metadata = tuple(context.invocation_metadata() or ())
        self._peer = context.peer()
        self._auth = context.auth_context()

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise _AbortedError(code, details)

    def invocation_metadata(self) -> tuple[Any, ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> Mapping[str, Iterable[bytes]]:
        return self._auth

    def is_active(self) -> bool:
        return not self._context.done()


class AsyncGuardianHub(guardian_pb2_grpc.GuardianHubServicer):
    """The hub's RPCs as coroutines over a :class:`GuardianHub` and its round engine."""

    def __init__(self, hub: GuardianHub, pool: Executor) -> None:
        self.hub = hub
        self.ledger = hub.ledger
        self.engine = hub.engine
        self._pool = pool
        # Per party: when a refused second stream was last audited, and refusals since.
        self._refusals: dict[tuple[str, str], tuple[float, int]] = {}

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the pool: it may block on the ledger."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _unary(
        self,
        handler: Callable[[Any, Any], T],
        request: Any,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> T:
        try:
            return await self._run(handler, request, ThreadContext(context))
        except _AbortedError as err:
            await context.abort(err.code, err.details)
        raise AssertionError("unreachable")

    # -- admin reads and caps: the plain handlers, on the pool -------------------
    async def ListParties(self, request: Any, context: Any) -> Any:
        return await self._unary(self.hub.ListParties, request, context)

    async def CheckVotes(self, request: Any, context: Any) -> Any:
        return await self._unary(self.hub.CheckVotes, request, context)

    async def ListLedger(self, request: Any, context: Any) -> Any:
        return await self._unary(self.hub.ListLedger, request, context)

    async def ListAudit(self, request: Any, context: Any) -> Any:
        return await self._unary(self.hub.ListAudit, request, context)

    async def BudgetHistory(self, request: Any, context: Any) -> Any:
        return await self._unary(self.hub.BudgetHistory, request, context)

    async def RecordPrivacyAudit(self, request: Any, context: Any) -> Any:
        return await self._unary(self.hub.RecordPrivacyAudit, request, context)

    async def ListPrivacyAudits(self, request: Any, context: Any) -> Any:
        return await self._unary(self.hub.ListPrivacyAudits, request, context)

    # -- who is calling ---------------------------------------------------------
    async def _caller(self, context: grpc.aio.ServicerContext[Any, Any], metadata_key: str) -> str:
        who = tls.peer_identity(context)  # type: ignore[arg-type]
        if who is not None:
            return who.name
        # --insecure-dev only: no certificate, so the caller names itself.
        name = dict(context.invocation_metadata() or ()).get(metadata_key)
        if not isinstance(name, str) or not name:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"without TLS the caller must send its name in {metadata_key!r}",
            )
        return str(name)

    async def _session_id(self, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        """The student's 2PC session named in the call's metadata: rounds run on that session only."""
        session_id = protocol.session_id(tuple(context.invocation_metadata() or ()))
        if not session_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, protocol.NO_SESSION)
        return session_id

    async def _admit(
        self, identity: str, what: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Callable[[], None]:
        try:
            return self.engine.links.admit_stream(identity, what)
        except LimitError as err:
            log.warning("refused a %s stream: %s", what, err)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        raise AssertionError("unreachable")

    # -- answering parties ------------------------------------------------------
    async def Connect(
        self,
        request_iterator: AsyncIterator[guardian_pb2.PartyMessage],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[guardian_pb2.HubMessage]:
        name = await self._caller(context, "capc-party")
        # Counted from the start: streams that never register are held to the limit too.
        release = await self._admit(name, "Connect", context)
        try:
            async for item in self._party_stream(name, request_iterator, context):
                yield item
        finally:
            release()

    async def _party_stream(
        self,
        name: str,
        request_iterator: AsyncIterator[guardian_pb2.PartyMessage],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[guardian_pb2.HubMessage]:
        try:
            await self._run(self.ledger.budget, name)
        except UnknownPartyError:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{name} is not a registered answering party; ask the guardian's operator to "
                "register it",
            )
        peer = context.peer()
        register = await self._registration(name, request_iterator, context)
        # The party's vote weight is the count its operator pinned, not what it claims:
        # its proofs hold it to the count it declares, so a larger one is refused here.
        # A refusal is audited at most once an interval per party: a deviating hospital
        # reconnecting in a loop cannot grow the log without bound.
        unrecorded = self._audit_due(("teachers", name), count=False)
        try:
            teachers = await self._run(
                functools.partial(
                    self.ledger.admit_teachers,
                    actor=name,
                    audit=unrecorded is not None,
                    unrecorded=unrecorded or 0,
                ),
                name,
                len(register.teachers),
            )
        except TeacherCountError as err:
            self._audit_due(("teachers", name))
            log.warning("refused %s's Register: %s", name, err)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(err))
        try:
            link = await self._run(
                self.engine.attach, name, peer, lambda: not context.done(), teachers
            )
        except DuplicateLinkError as err:
            await self._refuse_duplicate(name, peer, err, context)
        # The Register declares the cap the party set itself: the guardian holds no larger
        # one for it from here on. Taken once the stream is the party's only one, so a
        # refused second stream declares nothing.
        try:
            await self._run(budgets.declare, self.ledger, name, register)
        except RequestError as err:
            self.engine.detach(link)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        # Teachers attested DP-trained: their training is charged here once per digest
        # (refused past the party's cap) before the party may vote in rounds that
        # charge nothing per answer.
        try:
            link.trained = await self._run(budgets.attest, self.ledger, name, register)
        except RequestError as err:
            self.engine.detach(link)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except TrainingRefusedError as err:
            self.engine.detach(link)
            log.warning("refused %s's DP-SGD training: %s", name, err)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        log.info("answering party %s connected from %s", name, peer)
        reader = asyncio.create_task(self._read_party(name, link, request_iterator))
        try:
            registered = await self._run(budgets.registered, self.ledger, name)
            yield guardian_pb2.HubMessage(header=HEADER, registered=registered)
            # Rounds the party's ledger still holds open from before (a restart on either side).
            await self._run(self.engine.settle, name, list(register.open_rounds)[:MAX_SETTLE])
            while (item := await link.outbox.aget()) is not None:
                yield item
        finally:
            reader.cancel()
            self.engine.detach(link)
            link.outbox.close()

    async def _registration(
        self,
        name: str,
        request_iterator: AsyncIterator[guardian_pb2.PartyMessage],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> guardian_pb2.Register:
        """The Register message a stream must open with: the party's teachers, its own cap
        and accounting, and the rounds its ledger holds open."""
        try:
            first = await anext(aiter(request_iterator))
        except (StopAsyncIteration, grpc.RpcError):
            await context.abort(
                grpc.StatusCode.CANCELLED, f"{name} closed its stream before registering"
            )
        try:
            protocol.check_version(first.header, "guardian")
        except RequestError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        if first.WhichOneof("body") != "register":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "a Connect stream opens with a Register message naming the party's teachers",
            )
        teachers = len(first.register.teachers)
        if not 1 <= teachers <= MAX_TEACHERS_PER_PARTY:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{name} registered {teachers} teachers; a party votes with 1 to "
                f"{MAX_TEACHERS_PER_PARTY}",
            )
        return first.register

    async def _read_party(
        self,
        name: str,
        link: PartyLink,
        request_iterator: AsyncIterator[guardian_pb2.PartyMessage],
    ) -> None:
        try:
            async for msg in request_iterator:
                link.heard()
                if msg.header.protocol_version != PROTOCOL_VERSION:
                    log.warning(
                        "%s speaks protocol %d; ignoring its message",
                        name,
                        msg.header.protocol_version,
                    )
                    continue
                await self._on_party_message(name, link, msg)
        except (grpc.RpcError, tls.PeerRevokedError, asyncio.CancelledError):
            pass
        finally:
            self.engine.detach(link)
            link.outbox.close()
            log.info("answering party %s disconnected", name)

    async def _on_party_message(
        self, name: str, link: PartyLink, msg: guardian_pb2.PartyMessage
    ) -> None:
        """One message of party ``name``'s Connect stream, in its protocol version: handed
        to the handler of its kind (a kind this guardian does not know is ignored)."""
        kind = msg.WhichOneof("body")
        handler = self._party_handlers.get(kind or "")
        if handler is not None:
            await handler(self, name, link, msg)

    async def _on_shares(self, name: str, link: PartyLink, msg: guardian_pb2.PartyMessage) -> None:
        try:
            self.engine.receive_shares(name, msg.shares)
        except RoundInputError as err:
            self._cancel(name, link, msg.shares.round_id, "shares", err)

    async def _on_relay(self, name: str, link: PartyLink, msg: guardian_pb2.PartyMessage) -> None:
        try:
            box, frame = self.engine.relay_to_student(name, msg.relay)
        except RoundInputError as err:
            self._cancel(name, link, msg.relay.round_id, "a relayed frame", err)
            return
        await _put(box, frame, f"the student of round {msg.relay.round_id}")

    async def _on_failure(self, name: str, _: PartyLink, msg: guardian_pb2.PartyMessage) -> None:
        await self._on_party_failure(name, msg.failure)

    async def _on_heartbeat(self, name: str, _: PartyLink, msg: guardian_pb2.PartyMessage) -> None:
        # Both kept in memory and written with the others' (services.guardian.notes).
        self.engine.notes.seen(name)
        asked = self.engine.not_open(list(msg.heartbeat.open_rounds)[:MAX_SETTLE])
        if asked:
            await self._run(self.engine.settle, name, asked)

    async def _on_report(self, name: str, _: PartyLink, msg: guardian_pb2.PartyMessage) -> None:
        try:
            self.engine.notes.report(name, serde.spend_report_from_proto(msg.report))
        except RequestError as err:
            log.warning("refused a spend report from %s: %s", name, err)

    #: A party's message kind -> its handler.
    _party_handlers: ClassVar[dict[str, PartyHandler]] = {
        "shares": _on_shares,
        "relay": _on_relay,
        "failure": _on_failure,
        "heartbeat": _on_heartbeat,
        "report": _on_report,
    }

    async def _on_party_failure(self, name: str, failure: guardian_pb2.RoundFailure) -> None:
        """Party ``name`` could not answer a round; a budget refusal goes in the audit log."""
        asked = self.engine.report_failure(name, failure.round_id, failure.reason)
        # Only for a round that asked it: a party cannot fill the log.
        if asked and failure.budget_refused:
            await self._run(
                functools.partial(
                    self.ledger.record,
                    name,
                    "party_refused_budget",
                    {"party": name, "round": failure.round_id},
                    note=failure.reason,
                )
            )

    def _cancel(
        self, name: str, link: PartyLink, round_id: int, what: str, err: RoundInputError
    ) -> None:
        # A message the round cannot take: the party is told, the stream stays up.
        log.warning("refused %s from %s: %s", what, name, err)
        with contextlib.suppress(queue.Full):  # a party that reads nothing is not told
            link.outbox.put_nowait(
                guardian_pb2.HubMessage(
                    header=HEADER,
                    cancelled=guardian_pb2.RoundCancelled(round_id=round_id, reason=str(err)),
                )
            )

    def _audit_due(self, key: tuple[str, str], count: bool = True) -> int | None:
        """The refusals of ``key`` (kind, party) left unrecorded since its last audit entry
        when another is due (one per DUPLICATE_AUDIT_EVERY_S), else None. ``count``: this
        refusal happened (it is audited when due, else counted); False only asks."""
        now = time.monotonic()
        last, unrecorded = self._refusals.get(key, (-math.inf, 0))
        due = now - last >= DUPLICATE_AUDIT_EVERY_S
        if count:
            self._refusals[key] = (now, 0) if due else (last, unrecorded + 1)
        return unrecorded if due else None

    async def _refuse_duplicate(
        self,
        name: str,
        peer: str,
        err: DuplicateLinkError,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> NoReturn:
        who = tls.peer_identity(context)  # type: ignore[arg-type]
        log.warning(
            "refused a second stream for %s from %s: already connected from %s",
            name,
            peer,
            err.connected_from,
        )
        unrecorded = self._audit_due(("duplicate", name))
        if unrecorded is not None:
            await self._run(
                self.ledger.record,
                name,
                "duplicate_connection_refused",
                {
                    "party": name,
                    "peer": peer,
                    "connected_from": err.connected_from,
                    "certificate_sha256": who.fingerprint if who else None,
                    "refused_unrecorded_before": unrecorded,
                },
            )
        await context.abort(
            grpc.StatusCode.ALREADY_EXISTS,
            f"{name} is already connected (from {err.connected_from}); a second stream under "
            "the same identity is refused and recorded in the guardian's audit log (once a "
            "minute at most). A party "
            f"that is restarting gets back in once its old stream is gone (at most "
            f"{self.engine.silent_after:.0f} s). Otherwise its key is in two places: revoke "
            f"the certificate (`capc pki revoke {name}`) and issue a new one",
        )
        raise AssertionError("unreachable")

    # -- the student ------------------------------------------------------------
    async def OpenRound(
        self, request: guardian_pb2.OpenRoundRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> guardian_pb2.OpenRoundReply:
        querier = await self._caller(context, "capc-student")
        session_id = await self._session_id(context)
        code: grpc.StatusCode
        try:
            rnd = await self._run(self.engine.begin_round, querier, request, session_id)
            try:
                await rnd.complete.wait_async(self.engine.share_timeout)
            except asyncio.CancelledError:
                # The student gave up waiting: the round will never be computed.
                self._pool.submit(
                    self.engine.abandon_round, rnd, "the student cancelled its OpenRound call"
                )
                raise
            return await self._run(self.engine.finish_round, rnd)
        except REFUSALS as err:
            code, details = status_of(err), str(err)
        await context.abort(code, details)
        raise AssertionError("unreachable")

    async def Compute(
        self,
        request_iterator: AsyncIterator[guardian_pb2.MpcFrame],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[guardian_pb2.MpcFrame]:
        querier = await self._caller(context, "capc-student")
        session_id = await self._session_id(context)
        release = await self._admit(querier, "Compute", context)
        chan = StreamChannel(HEADER)
        started = threading.Event()

        def work() -> None:
            try:
                self.engine.serve_compute(querier, chan, session_id, ended=chan.ended.is_set)
            except Exception as err:
                log.warning("2PC session with %s ended: %s", querier, err)
            finally:
                chan.close()
                chan.stop_reading()

        def start() -> None:
            # The session's thread starts with its first frame: an idle stream holds none.
            started.set()
            threading.Thread(target=work, name=f"capc-compute-{querier}", daemon=True).start()

        def pumped(_: object) -> None:
            if not started.is_set():
                chan.close()  # no session ran: end the stream here

        pump = asyncio.create_task(chan.pump_async(request_iterator, on_first=start))
        pump.add_done_callback(pumped)
        try:
            async for msg in chan.outgoing_async():
                yield msg
            if chan.refused is not None:
                log.warning("refused %s's 2PC stream: %s", querier, chan.refused)
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, chan.refused)
        finally:
            pump.cancel()
            chan.close()
            chan.stop_reading()
            release()

    async def Relay(
        self,
        request_iterator: AsyncIterator[guardian_pb2.RelayFrame],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[guardian_pb2.RelayFrame]:
        querier = await self._caller(context, "capc-student")
        session_id = await self._session_id(context)
        release = await self._admit(querier, "Relay", context)
        box = self.engine.open_relay(querier, session_id)

        async def read() -> None:
            try:
                async for frame in request_iterator:
                    await self._relay_to_party(querier, session_id, frame)
            except (grpc.RpcError, tls.PeerRevokedError, asyncio.CancelledError):
                pass
            finally:
                self.engine.close_relay(querier, session_id, box)

        reader = asyncio.create_task(read())
        try:
            while (item := await box.aget()) is not None:
                yield item
        finally:
            reader.cancel()
            self.engine.close_relay(querier, session_id, box)
            release()

    async def _relay_to_party(
        self, querier: str, session_id: bytes, frame: guardian_pb2.RelayFrame
    ) -> None:
        """Hand one frame of the student's Relay stream to the party it names."""
        if frame.header.protocol_version != PROTOCOL_VERSION:
            log.warning(
                "%s relays with protocol %d; ignored", querier, frame.header.protocol_version
            )
            return
        try:
            outbox, message = self.engine.relay_to_party(querier, session_id, frame)
        except RoundInputError as err:
            log.warning("refused a relayed frame from %s: %s", querier, err)
            return
        await _put(outbox, message, frame.party)


async def _put(box: BoundedBuffer[T], item: T, reader: str) -> None:
    """Hand ``item`` on, waiting for room: the sender is held back while ``reader`` catches up."""
    try:
        await asyncio.wait_for(box.aput(item), STREAM_SEND_TIMEOUT_S)
    except TimeoutError:
        log.warning("%s took nothing for %g s; a frame was dropped", reader, STREAM_SEND_TIMEOUT_S)
