"""The guardian's gRPC hub, behind mutual TLS.

Answering parties hold a Connect stream and receive work over it; the student
opens rounds and runs the 2PC over one long-lived Compute stream; the gateway
reads budgets (the guardian's ledger beside each party's own), the ledger and
the audit log. Nobody changes a cap over the network. The round logic itself
is :mod:`services.guardian.rounds`, the parties' own budgets
:mod:`services.guardian.budgets`; the streams and the round opening are
served as coroutines by :mod:`services.guardian.streams`, and the admin
handlers below are plain functions it runs on a thread pool.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from capc.planning.sizing import recheck
from capc.privacy.randomness import SecureRandom
from capc.round.training import TrainingCharge
from capc.task_config import TaskConfig
from services.common import protocol, serde, tls
from services.common.ledger import Ledger
from services.common.limits import (
    DEFAULT_LIST_PAGE,
    MAX_LIST_PAGE,
    ROUND_TIMEOUT_S,
)
from services.common.protocol import WHO_MAY_RECORD, RequestError, check_version
from services.guardian import budgets
from services.guardian.loop import bound_queriers, hospital_of
from services.guardian.notes import PartyNotes
from services.guardian.rounds import RoundEngine
from services.guardian.status import REFUSALS, status_of
from services.guardian.streams import AsyncGuardianHub
from services.proto.capc.v1 import common_pb2, guardian_pb2, guardian_pb2_grpc

log = logging.getLogger("capc.guardian")

SERVICE = "capc.v1.GuardianHub"
POLICY: dict[str, tuple[str, ...]] = {
    f"/{SERVICE}/Connect": ("answerer",),
    f"/{SERVICE}/OpenRound": ("student",),
    f"/{SERVICE}/Compute": ("student",),
    f"/{SERVICE}/CheckVotes": ("student",),
    f"/{SERVICE}/Relay": ("student",),
    f"/{SERVICE}/ListParties": ("gateway", "guardian"),
    f"/{SERVICE}/ListLedger": ("gateway", "guardian"),
    f"/{SERVICE}/ListAudit": ("gateway", "guardian"),
    f"/{SERVICE}/BudgetHistory": ("gateway", "guardian"),
    # The guardian's operator, or a hospital about itself (checked in the handler): an
    # audit may call a hospital's claim refuted, so the querier side only reads them.
    f"/{SERVICE}/RecordPrivacyAudit": ("guardian", "answerer"),
    f"/{SERVICE}/ListPrivacyAudits": ("gateway", "guardian"),
}
#: Seconds between passes of the reaper (at most; a short --round-timeout checks more often).
REAP_EVERY_S = 5.0


def check_header(header: common_pb2.Header, context: grpc.ServicerContext) -> None:
    """Refuse messages from another protocol version."""
    try:
        check_version(header, "guardian")
    except RequestError as err:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))


def page_limit(requested: int, context: grpc.ServicerContext) -> int:
    """Entries per page: DEFAULT_LIST_PAGE by default, at most MAX_LIST_PAGE."""
    limit = requested or DEFAULT_LIST_PAGE
    if limit > MAX_LIST_PAGE:
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"limit must be at most {MAX_LIST_PAGE}, got {limit}"
        )
    return limit


def audit_refusal(role: str, name: str, party: str) -> str | None:
    """Why the identity (``role``, ``name``) may not record a privacy audit against
    ``party``, or None when it may: the guardian's operator against anyone, a hospital
    against itself only (the role policy already keeps every other role out)."""
    if role == "guardian" or (role == "answerer" and name == party):
        return None
    if role == "answerer":
        return (
            f"{name} may record privacy audits against itself only, not against {party!r}; "
            + WHO_MAY_RECORD
        )
    return f"{name} (role {role}) may read privacy audits but not record them; " + WHO_MAY_RECORD


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
        quorum = 0
        warnings: list[str] = []
        online = self.engine.teachers()
        if request.header.task:
            try:
                projections = self._projections(
                    request.header.task,
                    request.querier,
                    # Zero means the task's own, as in a job's request.
                    dict(request.overrides),
                )
                config, digest = self.ledger.task(request.header.task)
                task = TaskConfig.parse(request.header.task, config, digest)
                quorum = task.quorum
                # The task was planned for some teacher counts; those that registered
                # (a hospital bringing one model of its own) are re-checked at each read.
                names = sorted(online)
                warnings = recheck(
                    task.mechanism.to_config(),
                    task.outputs,
                    quorum,
                    [online[n] for n in names],
                    names,
                )
            except REFUSALS as err:
                context.abort(status_of(err), str(err))
        trained = self.engine.links.trained()
        trainings: dict[str, list[TrainingCharge]] = {}
        for t in self.ledger.trainings():
            trainings.setdefault(t.party, []).append(t)
        reply = guardian_pb2.ListPartiesReply(
            parties=[
                serde.party_status_to_proto(
                    b,
                    self.ledger.delta,
                    budgets.compare(self.ledger, b),
                    connected=b.name in online,
                    projection=projections.get(b.name, serde.NO_PROJECTION),
                    teachers=online.get(b.name, 0),
                    trainings=trainings.get(b.name, ()),
                    dp_trained=b.name in trained,
                    rounds_epsilon=self._rounds_epsilon(b.name, trainings.get(b.name, ())),
                )
                for b in self.ledger.budgets()
            ],
            delta=self.ledger.delta,
            accounting=f"{self.ledger.accounting.summary}, data-independent charges",
            quorum=quorum,
            plan_warnings=warnings,
        )
        reply.bound_queriers.update(bound_queriers(self.ledger))
        if request.querier:
            # The CaPC loop: what one querier's rounds cost each party, and whose it is.
            for p in reply.parties:
                reply.querier_epsilon[p.name] = self.ledger.querier_spent(request.querier, p.name)
            reply.querier_hospital = hospital_of(self.ledger, request.querier) or ""
        return reply

    def _rounds_epsilon(self, name: str, trainings: Sequence[TrainingCharge]) -> float | None:
        """Epsilon of ``name``'s round charges alone: its spend less its trainings' losses
        (None: it has none, and its spend is all rounds)."""
        if not trainings:
            return None
        acct = self.ledger.accounting
        loss = self.ledger.spent_loss(name)
        for t in trainings:
            loss = loss - acct.filter_cost(t.attestation.event())
        return acct.spent(np.maximum(loss, 0.0), self.ledger.delta).epsilon

    def _projections(
        self, task_name: str, querier: str = "", overrides: dict[str, float] | None = None
    ) -> dict[str, tuple[float, float, int]]:
        """Per answering party: (vote weight, participation rate, queries its remaining
        budget covers at ``task_name``'s worst case, in expectation under vanishing).
        With ``querier``: no more than its allowance's rest on the party covers, as the
        ledger's reservation admits; with a job's ``overrides``, at the mechanism so
        raised (a job's pre-check reads this). TaskError for overrides the task refuses."""
        config, digest = self.ledger.task(task_name)
        task = TaskConfig.parse(task_name, config, digest)
        # A projection of a job not yet created: its overrides resolved as its creation will.
        task = task.tightened(overrides)
        caps = {b.name: b.cap for b in self.ledger.budgets()}
        allowance, held = self.ledger.allowance_left(querier) if querier else (None, {})
        accounting, delta = self.ledger.accounting, self.ledger.delta
        out = {}
        for name, (weight, rate) in self.engine.rates(task).items():
            fit = 0
            if task.mechanism.trained_teachers_only:
                # Nothing is charged per answer: no budget limits the queries (-1).
                fit = -1
            elif rate > 0 and weight > 0:
                unit = task.mechanism.worst_case(1, weight)
                count = self.ledger.queries_fit(unit, caps[name], name)
                if allowance is not None:
                    count = min(count, accounting.max_count(unit, allowance, delta, held.get(name)))
                fit = int(count / rate)
            out[name] = (weight, rate, fit)
        return out

    def CheckVotes(
        self, request: guardian_pb2.VoteCheck, context: grpc.ServicerContext
    ) -> guardian_pb2.VoteCheckReply:
        """The student's verifier shares of a round's vote validity proofs: the guardian
        leaves invalid votes out and queues the round's 2PC (RoundEngine.check_votes)."""
        check_header(request.header, context)
        who = tls.peer_identity(context)
        meta = dict(context.invocation_metadata() or ())
        # --insecure-dev only: without a certificate the student names itself.
        querier = who.name if who is not None else str(meta.get("capc-student") or "")
        if not querier:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "without TLS the caller must send its name in 'capc-student'",
            )
        session_id = protocol.session_id(tuple(context.invocation_metadata() or ()))
        if not session_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, protocol.NO_SESSION)
        try:
            return self.engine.check_votes(querier, session_id, request)
        except REFUSALS as err:
            context.abort(status_of(err), str(err))

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
            head=serde.audit_head_to_proto(self.ledger.audit_head()),
            audit_public_key="" if key is None else key[0],
            disputes=[
                guardian_pb2.VoteDispute(**dataclasses.asdict(d)) for d in self.ledger.disputes()
            ],
        )

    def BudgetHistory(
        self, request: guardian_pb2.BudgetHistoryRequest, context: grpc.ServicerContext
    ) -> guardian_pb2.BudgetHistoryReply:
        check_header(request.header, context)
        budgets_now = {b.name: b for b in self.ledger.budgets()}
        caps = {name: b.cap for name, b in budgets_now.items()}
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
                    rounds_asked=budgets_now[name].rounds_asked,
                    full_delta=budgets_now[name].full_delta(self.ledger.delta),
                    points=[
                        guardian_pb2.BudgetPoint(at=at, epsilon=eps, round_id=rid)
                        for at, eps, rid in history.get(name, [])
                    ],
                )
                for name in names
            ],
            delta=self.ledger.delta,
        )

    def RecordPrivacyAudit(
        self, request: guardian_pb2.RecordPrivacyAuditRequest, context: grpc.ServicerContext
    ) -> guardian_pb2.PrivacyAudit:
        check_header(request.header, context)
        who = tls.peer_identity(context)
        if who is not None:
            refusal = audit_refusal(who.role, who.name, request.party)
            if refusal is not None:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
        # The recorded actor is who authenticated; a name in the request counts only
        # without TLS (--insecure-dev). With TLS, what the caller says of itself is kept
        # as the entry's untrusted note.
        actor = who.name if who else (request.actor or "insecure-dev")
        note = (request.actor or None) if who else None
        try:
            kept = self.ledger.record_privacy_audit(
                request.party,
                canaries=request.canaries,
                guesses=request.guesses,
                correct=request.correct,
                attack=request.attack,
                confidence=request.confidence or 0.95,
                actor=actor[:128],
                note=note,
            )
        except REFUSALS as err:
            context.abort(status_of(err), str(err))
        if kept.refuted:
            log.warning(
                "privacy audit of %s refutes its claimed epsilon %.4g: lower bound %.4g",
                kept.party,
                kept.claimed_epsilon,
                kept.empirical_lower,
            )
        return serde.privacy_audit_to_proto(kept)

    def ListPrivacyAudits(
        self, request: guardian_pb2.ListPrivacyAuditsRequest, context: grpc.ServicerContext
    ) -> guardian_pb2.ListPrivacyAuditsReply:
        check_header(request.header, context)
        limit = page_limit(request.limit, context)
        return guardian_pb2.ListPrivacyAuditsReply(
            audits=[
                serde.privacy_audit_to_proto(a)
                for a in self.ledger.privacy_audits(request.party or None, limit)
            ]
        )


@dataclass
class RunningServer:
    """The hub serving on ``port``, on an event loop of its own thread."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    stopping: threading.Event
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    pool: futures.ThreadPoolExecutor
    #: The parties' reports and heartbeats (services.guardian.notes): written every
    #: second while the hub runs, and what is left once it stopped.
    notes: PartyNotes | None = None

    def stop(self, grace: float = 1.0) -> None:
        self.stopping.set()
        if self.loop.is_running():

            async def shut_down() -> None:
                await self.health.enter_graceful_shutdown()
                await self.server.stop(grace)

            asyncio.run_coroutine_threadsafe(shut_down(), self.loop).result(grace + 30)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        if self.notes is not None:
            try:
                self.notes.flush()
            except Exception:  # the ledger went first: the parties report again
                log.exception("writing the parties' last reports and heartbeats failed")
        self.pool.shutdown(wait=False, cancel_futures=True)


def serve(
    ledger: Ledger,
    address: str,
    files: tls.TLSFiles | None,
    workers: int = 32,
    share_timeout: float = 60.0,
    rng: SecureRandom | None = None,
    round_timeout: float = ROUND_TIMEOUT_S,
) -> RunningServer:
    """Start the hub on ``address`` ("host:port", port 0 picks one). ``files=None`` is --insecure-dev.

    Streams are served as coroutines on an event loop (services.guardian.streams):
    any number of them wait without a thread each. ``workers`` threads run what
    blocks (ledger transactions, the admin handlers). Rounds not released within
    ``round_timeout`` s of opening are aborted while it runs.
    """
    engine = RoundEngine(ledger, share_timeout, rng, round_timeout=round_timeout)
    # Checked here, in the caller's thread: a bad or revoked certificate fails serve().
    credentials = None if files is None else tls.server_credentials(files)
    interceptor = tls.async_server_interceptor(POLICY, files)
    pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="capc-guardian")
    servicer = AsyncGuardianHub(GuardianHub(ledger, engine), pool)
    loop = asyncio.new_event_loop()
    loop.set_default_executor(pool)

    async def start() -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
        server = grpc.aio.server(interceptors=[interceptor], options=list(tls.SERVER_OPTIONS))
        guardian_pb2_grpc.add_GuardianHubServicer_to_server(servicer, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        if credentials is None:
            log.warning(tls.INSECURE_WARNING)
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
        if port == 0:
            raise OSError(f"could not listen on {address}")
        await server.start()
        await health_servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        return server, port, health_servicer

    thread = threading.Thread(target=loop.run_forever, name="capc-guardian-loop", daemon=True)
    thread.start()
    try:
        server, port, health_servicer = asyncio.run_coroutine_threadsafe(start(), loop).result(60)
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        pool.shutdown(wait=False)
        raise
    stop = threading.Event()
    threading.Thread(
        target=_reap_forever, args=(engine, stop), name="capc-reaper", daemon=True
    ).start()
    threading.Thread(
        target=engine.notes.keep_writing, args=(stop,), name="capc-party-notes", daemon=True
    ).start()
    return RunningServer(server, port, health_servicer, stop, loop, thread, pool, engine.notes)


def _reap_forever(engine: RoundEngine, stop: threading.Event) -> None:
    # A quarter of the timeout keeps a stale round's overstay under 25 %.
    every = min(REAP_EVERY_S, engine.round_timeout / 4)
    while not stop.wait(every):
        try:
            engine.reap()
        except Exception:  # a ledger hiccup must not end the reaper; the next pass retries
            log.exception("reaping stale rounds failed")
