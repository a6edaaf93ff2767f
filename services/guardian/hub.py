"""The guardian's gRPC hub, behind mutual TLS.

Answering parties hold a Connect stream and receive work over it; the student
opens rounds and runs the 2PC over one long-lived Compute stream; the gateway
reads budgets (the guardian's ledger beside each party's own), the ledger and
the audit log. Nobody changes a cap over the network. The round logic itself
is :mod:`services.guardian.rounds`, the parties' own budgets
:mod:`services.guardian.budgets`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from capc.privacy.randomness import SecureRandom
from services.common import protocol, tls
from services.common.ledger import (
    DuplicateRoundError,
    Ledger,
    LedgerError,
    PartyBudget,
    QuorumError,
    UnknownPartyError,
    UnknownTaskError,
)
from services.common.limits import DEFAULT_LIST_PAGE, MAX_LIST_PAGE
from services.common.mpc_stream import StreamChannel
from services.common.protocol import PROTOCOL_VERSION, RequestError, check_version
from services.common.task import TaskConfig, TaskError
from services.guardian import budgets
from services.guardian.rounds import (
    DuplicateLinkError,
    RoundEngine,
    RoundInputError,
    RoundRefusedError,
)
from services.proto.capc.v1 import common_pb2, guardian_pb2, guardian_pb2_grpc

log = logging.getLogger("capc.guardian")

SERVICE = "capc.v1.GuardianHub"
POLICY: dict[str, tuple[str, ...]] = {
    f"/{SERVICE}/Connect": ("answerer",),
    f"/{SERVICE}/OpenRound": ("student",),
    f"/{SERVICE}/Compute": ("student",),
    f"/{SERVICE}/Relay": ("student",),
    f"/{SERVICE}/ListParties": ("gateway", "guardian"),
    f"/{SERVICE}/ListLedger": ("gateway", "guardian"),
    f"/{SERVICE}/ListAudit": ("gateway", "guardian"),
    f"/{SERVICE}/BudgetHistory": ("gateway", "guardian"),
}
HEADER = protocol.header()
#: Most open rounds one message may ask the guardian to settle.
MAX_SETTLE = 256


def check_header(header: common_pb2.Header, context: grpc.ServicerContext) -> None:
    """Refuse messages from another protocol version."""
    try:
        check_version(header, "guardian")
    except RequestError as err:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))


def _session_id(context: grpc.ServicerContext) -> bytes:
    """The student's 2PC session named in the call's metadata: rounds run on that session only."""
    sid = dict(context.invocation_metadata()).get("capc-session-id")
    try:
        session_id = bytes.fromhex(sid) if isinstance(sid, str) else b""
    except ValueError:
        session_id = b""
    if len(session_id) != 16:
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            "open a Compute stream first and send its 16-byte hex 'capc-session-id' in the metadata",
        )
    return session_id


def page_limit(requested: int, context: grpc.ServicerContext) -> int:
    """Entries per page: DEFAULT_LIST_PAGE by default, at most MAX_LIST_PAGE."""
    limit = requested or DEFAULT_LIST_PAGE
    if limit > MAX_LIST_PAGE:
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"limit must be at most {MAX_LIST_PAGE}, got {limit}"
        )
    return limit


def _status(
    b: PartyBudget,
    connected: bool = False,
    projection: tuple[float, float, int] = (1.0, 1.0, -1),
    own: budgets.Comparison | None = None,
) -> guardian_pb2.PartyStatus:
    weight, participation, queries_left = projection
    own = own or budgets.Comparison("unreported")
    return guardian_pb2.PartyStatus(
        registered_cap=b.registered_cap,
        declared_cap=b.declared_cap or 0.0,
        party_epsilon_spent=own.party_spent,
        party_through_round=own.through,
        party_open_rounds=own.open_rounds,
        party_reported_at=own.reported_at,
        ledgers=own.state,
        ledger_gap=own.gap,
        vote_weight=weight,
        participation=participation,
        queries_left=queries_left,
        name=b.name,
        role=b.role,
        status=b.status,
        connected=connected,
        epsilon_cap=b.cap,
        epsilon_spent=b.spent,
        epsilon_remaining=b.remaining,
        best_order=b.best_order or 0.0,
        rounds=b.rounds,
        last_seen=b.last_seen.isoformat() if b.last_seen else "",
    )


class GuardianHub(guardian_pb2_grpc.GuardianHubServicer):
    """Admin side of the hub over a :class:`Ledger`."""

    def __init__(self, ledger: Ledger, engine: RoundEngine | None = None) -> None:
        self.ledger = ledger
        self.engine = engine or RoundEngine(ledger)

    def ListParties(
        self, request: guardian_pb2.ListPartiesRequest, context: grpc.ServicerContext
    ) -> guardian_pb2.ListPartiesReply:
        check_header(request.header, context)
        projections: dict[str, tuple[float, float, int]] = {}
        if request.header.task:
            try:
                projections = self._projections(request.header.task)
            except (UnknownTaskError, TaskError) as err:
                context.abort(grpc.StatusCode.NOT_FOUND, str(err))
        online = set(self.engine.connected())
        return guardian_pb2.ListPartiesReply(
            parties=[
                _status(
                    b,
                    b.name in online,
                    projections.get(b.name, (1.0, 1.0, -1)),
                    budgets.compare(self.ledger, b),
                )
                for b in self.ledger.budgets()
            ],
            delta=self.ledger.delta,
            accounting=f"{self.ledger.accounting.summary}, data-independent charges",
        )

    def _projections(self, task_name: str) -> dict[str, tuple[float, float, int]]:
        """Per answering party: (vote weight, participation rate, queries its remaining
        budget covers at ``task_name``'s worst case, in expectation under vanishing)."""
        config, digest = self.ledger.task(task_name)
        task = TaskConfig.parse(task_name, config, digest)
        caps = {b.name: b.cap for b in self.ledger.budgets()}
        out = {}
        for name, (weight, rate) in self.engine.rates(task).items():
            fit = 0
            if rate > 0 and weight > 0:
                unit = task.mechanism.worst_case(1, weight)
                fit = int(self.ledger.queries_fit(unit, caps[name], name) / rate)
            out[name] = (weight, rate, fit)
        return out

    def ListLedger(
        self, request: guardian_pb2.ListLedgerRequest, context: grpc.ServicerContext
    ) -> guardian_pb2.ListLedgerReply:
        check_header(request.header, context)
        limit = page_limit(request.limit, context)
        rows = self.ledger.entries(
            party=request.party or None,
            round_id=request.round_id or None,
            limit=limit,
            offset=request.offset,
        )
        return guardian_pb2.ListLedgerReply(
            entries=[guardian_pb2.LedgerEntry(**dataclasses.asdict(r)) for r in rows]
        )

    def ListAudit(
        self, request: guardian_pb2.ListAuditRequest, context: grpc.ServicerContext
    ) -> guardian_pb2.ListAuditReply:
        check_header(request.header, context)
        limit = page_limit(request.limit, context)
        _, problem = self.ledger.check_audit()
        key = self.ledger.audit_key()
        return guardian_pb2.ListAuditReply(
            entries=[
                guardian_pb2.AuditEntry(
                    seq=e.seq,
                    at=e.at,
                    actor=e.actor,
                    action=e.action,
                    detail_json=json.dumps(e.detail, sort_keys=True),
                    hash=e.hash,
                    note=e.note or "",
                    signature=e.signature or "",
                )
                for e in self.ledger.audit_entries(limit, request.offset)
            ],
            chain_valid=problem is None,
            head=budgets.head_to_proto(self.ledger.audit_head()),
            audit_public_key="" if key is None else key[0],
        )

    def BudgetHistory(
        self, request: guardian_pb2.BudgetHistoryRequest, context: grpc.ServicerContext
    ) -> guardian_pb2.BudgetHistoryReply:
        check_header(request.header, context)
        caps = {b.name: b.cap for b in self.ledger.budgets()}
        if request.party and request.party not in caps:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no party named {request.party!r}")
        points = request.max_points or 500
        if points > 10_000:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_points must be at most 10000")
        history = self.ledger.history(request.party or None, points)
        names = [request.party] if request.party else sorted(caps)
        return guardian_pb2.BudgetHistoryReply(
            series=[
                guardian_pb2.BudgetSeries(
                    party=name,
                    epsilon_cap=caps[name],
                    points=[
                        guardian_pb2.BudgetPoint(at=at, epsilon=eps, round_id=rid)
                        for at, eps, rid in history.get(name, [])
                    ],
                )
                for name in names
            ],
            delta=self.ledger.delta,
        )

    def _caller(self, context: grpc.ServicerContext, metadata_key: str) -> str:
        who = tls.peer_identity(context)
        if who is not None:
            return who.name
        # --insecure-dev only: no certificate, so the caller names itself.
        meta = dict(context.invocation_metadata())
        name = meta.get(metadata_key)
        if not isinstance(name, str) or not name:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"without TLS the caller must send its name in {metadata_key!r}",
            )
        assert isinstance(name, str)
        return name

    def Connect(
        self, request_iterator: Iterator[guardian_pb2.PartyMessage], context: grpc.ServicerContext
    ) -> Iterator[guardian_pb2.HubMessage]:
        name = self._caller(context, "capc-party")
        try:
            self.ledger.budget(name)
        except UnknownPartyError:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{name} is not a registered answering party; ask the guardian's operator to register it",
            )
        # A party's first message declares the cap it set itself: the guardian holds no
        # larger one for it from here on. Taken once the stream is the party's only one,
        # so a refused second stream declares nothing.
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("body") != "register":
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "the first message on a Connect stream must be Register, with the party's "
                "own epsilon cap",
            )
        peer = context.peer()
        try:
            link = self.engine.attach(name, peer, context.is_active)
        except DuplicateLinkError as err:
            self._refuse_duplicate(name, peer, err, context)
        try:
            budgets.declare(self.ledger, name, first.register)
        except RequestError as err:
            self.engine.detach(link)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        log.info("answering party %s connected from %s", name, peer)

        def refuse(round_id: int, what: str, accept: Callable[[str, Any], None], body: Any) -> None:
            # A message the round cannot take: the party is told, the stream stays up.
            try:
                accept(name, body)
            except RoundInputError as err:
                log.warning("refused %s from %s: %s", what, name, err)
                link.outbox.put(
                    guardian_pb2.HubMessage(
                        header=HEADER,
                        cancelled=guardian_pb2.RoundCancelled(round_id=round_id, reason=str(err)),
                    )
                )

        def read() -> None:
            try:
                for msg in request_iterator:
                    link.heard()
                    kind = msg.WhichOneof("body")
                    if msg.header.protocol_version != PROTOCOL_VERSION:
                        log.warning(
                            "%s speaks protocol %d; ignoring its message",
                            name,
                            msg.header.protocol_version,
                        )
                        continue
                    if kind == "shares":
                        refuse(
                            msg.shares.round_id, "shares", self.engine.receive_shares, msg.shares
                        )
                    elif kind == "relay":
                        refuse(
                            msg.relay.round_id,
                            "a relayed frame",
                            self.engine.relay_to_student,
                            msg.relay,
                        )
                    elif kind == "failure":
                        asked = self.engine.report_failure(
                            name, msg.failure.round_id, msg.failure.reason
                        )
                        # Only for a round that asked it: a party cannot fill the log.
                        if asked and msg.failure.budget_refused:
                            self.ledger.record(
                                name,
                                "party_refused_budget",
                                {"party": name, "round": msg.failure.round_id},
                                note=msg.failure.reason,
                            )
                    elif kind == "heartbeat":
                        self.ledger.touch(name)
                        self.engine.settle(name, list(msg.heartbeat.open_rounds)[:MAX_SETTLE])
                    elif kind == "report":
                        try:
                            budgets.store_report(self.ledger, name, msg.report)
                        except RequestError as err:
                            log.warning("refused a spend report from %s: %s", name, err)
            except grpc.RpcError:
                pass
            finally:
                self.engine.detach(link)
                link.outbox.put(None)
                log.info("answering party %s disconnected", name)

        threading.Thread(target=read, name=f"capc-party-{name}", daemon=True).start()
        yield guardian_pb2.HubMessage(
            header=HEADER, registered=budgets.registered(self.ledger, name)
        )
        # Rounds the party's ledger still holds open from before (a restart on either side).
        self.engine.settle(name, list(first.register.open_rounds)[:MAX_SETTLE])
        while True:
            item = link.outbox.get()
            if item is None:
                return
            yield item

    def _refuse_duplicate(
        self, name: str, peer: str, err: DuplicateLinkError, context: grpc.ServicerContext
    ) -> NoReturn:
        who = tls.peer_identity(context)
        log.warning(
            "refused a second stream for %s from %s: already connected from %s",
            name,
            peer,
            err.connected_from,
        )
        self.ledger.record(
            name,
            "duplicate_connection_refused",
            {
                "party": name,
                "peer": peer,
                "connected_from": err.connected_from,
                "certificate_sha256": who.fingerprint if who else None,
            },
        )
        context.abort(
            grpc.StatusCode.ALREADY_EXISTS,
            f"{name} is already connected (from {err.connected_from}); a second stream under "
            "the same identity is refused and recorded in the guardian's audit log. A party "
            f"that is restarting gets back in once its old stream is gone (at most "
            f"{self.engine.silent_after:.0f} s). Otherwise its key is in two places: revoke "
            f"the certificate (`capc pki revoke {name}`) and issue a new one",
        )

    def OpenRound(
        self, request: guardian_pb2.OpenRoundRequest, context: grpc.ServicerContext
    ) -> guardian_pb2.OpenRoundReply:
        querier = self._caller(context, "capc-student")
        session_id = _session_id(context)
        try:
            return self.engine.open_round(querier, request, session_id)
        except (RequestError, UnknownTaskError) as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except QuorumError as err:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        except DuplicateRoundError as err:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, str(err))
        except (RoundRefusedError, LedgerError, TaskError) as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        raise AssertionError("unreachable")

    def Compute(
        self, request_iterator: Iterator[guardian_pb2.MpcFrame], context: grpc.ServicerContext
    ) -> Iterator[guardian_pb2.MpcFrame]:
        querier = self._caller(context, "capc-student")
        session_id = _session_id(context)
        chan = StreamChannel(HEADER)
        chan.attach(request_iterator)

        def work() -> None:
            try:
                self.engine.serve_compute(querier, chan, session_id, ended=chan.ended.is_set)
            except Exception as err:
                log.warning("2PC session with %s ended: %s", querier, err)
            finally:
                chan.close()

        threading.Thread(target=work, name=f"capc-compute-{querier}", daemon=True).start()
        yield from chan.outgoing()

    def Relay(
        self, request_iterator: Iterator[guardian_pb2.RelayFrame], context: grpc.ServicerContext
    ) -> Iterator[guardian_pb2.RelayFrame]:
        querier = self._caller(context, "capc-student")
        session_id = _session_id(context)
        box = self.engine.open_relay(querier, session_id)

        def read() -> None:
            try:
                for frame in request_iterator:
                    if frame.header.protocol_version != PROTOCOL_VERSION:
                        log.warning(
                            "%s relays with protocol %d; ignored",
                            querier,
                            frame.header.protocol_version,
                        )
                        continue
                    try:
                        self.engine.relay_to_party(querier, session_id, frame)
                    except RoundInputError as err:
                        log.warning("refused a relayed frame from %s: %s", querier, err)
            except grpc.RpcError:
                pass
            finally:
                self.engine.close_relay(querier, session_id, box)

        threading.Thread(target=read, name=f"capc-relay-{querier}", daemon=True).start()
        while True:
            item = box.get()
            if item is None:
                return
            yield item


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    health: health.HealthServicer

    def stop(self, grace: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()


def serve(
    ledger: Ledger,
    address: str,
    files: tls.TLSFiles | None,
    workers: int = 64,
    share_timeout: float = 60.0,
    rng: SecureRandom | None = None,
) -> RunningServer:
    """Start the hub on ``address`` ("host:port", port 0 picks one). ``files=None`` is --insecure-dev."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers),
        interceptors=[tls.server_interceptor(POLICY, files)],
        options=list(tls.SERVER_OPTIONS),
    )
    guardian_pb2_grpc.add_GuardianHubServicer_to_server(
        GuardianHub(ledger, RoundEngine(ledger, share_timeout, rng)), server
    )
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if files is None:
        log.warning(tls.INSECURE_WARNING)
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, tls.server_credentials(files))
    if port == 0:
        raise OSError(f"could not listen on {address}")
    server.start()
    health_servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(server, port, health_servicer)
