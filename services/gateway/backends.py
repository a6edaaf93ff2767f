"""The gateway's gRPC clients: the student party's jobs API and the guardian's admin reads.

The gateway holds nothing secret: it dials both over mutual TLS with its own
``gateway`` certificate, and each service checks that role on every call.
gRPC failures become :class:`BackendError` with the HTTP status they map to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common import protocol, tls
from services.common.limits import HEALTH_CACHE_SECONDS
from services.proto.capc.v1 import (
    common_pb2,
    guardian_pb2,
    guardian_pb2_grpc,
    student_pb2,
    student_pb2_grpc,
)

T = TypeVar("T")

#: How a backend's status reads over REST: the caller's mistakes stay 4xx.
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 422,
    grpc.StatusCode.OUT_OF_RANGE: 422,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


class BackendError(Exception):
    """A backend refused or failed a call; ``status`` is the HTTP status to answer with."""

    def __init__(self, service: str, code: grpc.StatusCode | None, details: str) -> None:
        self.status = HTTP_STATUS.get(code, 502) if code is not None else 502
        self.code = code.name if code is not None else "UNKNOWN"
        if self.status < 500:
            prefix = ""
        elif code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            # Certificates on one side or the other: the operator's to fix, not the caller's.
            prefix = f"the {service} and the gateway do not accept each other: "
        else:
            prefix = f"the {service} is not answering: "
        super().__init__(f"{prefix}{details}")


@dataclass
class Backends:
    """Stubs for the student party and the guardian; ``files=None`` only with --insecure-dev."""

    student: str
    guardian: str
    files: tls.TLSFiles | None
    server_name: str | None = None
    task: str = ""
    timeout: float = 30.0
    #: A hospital's own gateway (over its CaPC loop's student party): the hospital whose
    #: admin view it gives ("" for the consortium's gateway: every party's).
    hospital: str = ""

    def __post_init__(self) -> None:
        # Each address must lead to the role the gateway means to reach there.
        self._student_channel = tls.secure_channel(
            self.student, self.files, self.server_name, role="student"
        )
        self._guardian_channel = tls.secure_channel(
            self.guardian, self.files, self.server_name, role="guardian"
        )
        self.jobs = student_pb2_grpc.StudentPartyStub(self._student_channel)
        self.hub = guardian_pb2_grpc.GuardianHubStub(self._guardian_channel)
        # The student party's querier name, read once (it is fixed for its life).
        self._querier: str | None = None

    @property
    def header(self) -> common_pb2.Header:
        return protocol.header(self.task)

    def call(self, service: str, fn: Callable[..., T], request: object) -> T:
        try:
            return fn(request, timeout=self.timeout)
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else None
            details = err.details() if hasattr(err, "details") else str(err)
            raise BackendError(service, code, details or "no details") from None

    def student_call(self, fn: Callable[..., T], request: object) -> T:
        return self.call("student party", fn, request)

    def guardian_call(self, fn: Callable[..., T], request: object) -> T:
        return self.call("guardian", fn, request)

    def health(self) -> dict[str, str]:
        """Each backend's gRPC health status name (SERVING, NOT_SERVING, UNREACHABLE)."""
        out = {}
        for name, channel, service in (
            ("student", self._student_channel, "capc.v1.StudentParty"),
            ("guardian", self._guardian_channel, "capc.v1.GuardianHub"),
        ):
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=3.0
                )
                out[name] = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.RpcError:
                out[name] = "UNREACHABLE"
        return out

    # -- typed shortcuts ----------------------------------------------------------
    def list_parties(self) -> guardian_pb2.ListPartiesReply:
        reply: guardian_pb2.ListPartiesReply = self.guardian_call(
            self.hub.ListParties, guardian_pb2.ListPartiesRequest(header=self.header)
        )
        return reply

    def querier_spends(
        self, querier: str, overrides: Mapping[str, float] | None = None
    ) -> guardian_pb2.ListPartiesReply:
        """Parties with what ``querier``'s rounds charged each (the CaPC loop); queries
        left projected at the task's mechanism raised by ``overrides`` (a job's)."""
        reply: guardian_pb2.ListPartiesReply = self.guardian_call(
            self.hub.ListParties,
            guardian_pb2.ListPartiesRequest(
                header=self.header, querier=querier, overrides=dict(overrides or {})
            ),
        )
        return reply

    def job_spends(
        self, overrides: Mapping[str, float] | None = None
    ) -> guardian_pb2.ListPartiesReply:
        """ListParties for the student party's querier: each party's projection at the
        task, the task's quorum, and the hospital a CaPC loop's querier is bound to (its
        teachers never answer the loop's queries)."""
        if self._querier is None:
            report: student_pb2.LoopReport = self.call(
                "student party",
                self.jobs.GetLoop,
                student_pb2.GetLoopRequest(header=self.header),
            )
            self._querier = report.querier
        return self.querier_spends(self._querier, overrides)

    def list_jobs(self, limit: int, offset: int) -> student_pb2.ListJobsReply:
        reply: student_pb2.ListJobsReply = self.student_call(
            self.jobs.ListJobs,
            student_pb2.ListJobsRequest(header=self.header, limit=limit, offset=offset),
        )
        return reply

    def close(self) -> None:
        self._student_channel.close()
        self._guardian_channel.close()


class HealthCache:
    """``Backends.health`` read at most once per ``ttl`` seconds, however often or
    concurrently /healthz is asked: ``read()`` returns the states and their age (s).

    While one caller refreshes a stale reading (up to two 3 s health checks when a
    backend is slow or down), the others answer at once from the stale one, with its
    age: an open endpoint must not park a worker thread per request for seconds, or a
    burst of probes would stall every other request the gateway's thread pool serves.
    Only the very first reading, with nothing to answer from, is waited for."""

    def __init__(
        self,
        backends: Backends,
        ttl: float = HEALTH_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backends, self.ttl, self.clock = backends, ttl, clock
        self._cached: tuple[float, dict[str, str]] | None = None
        # Held by the one caller reading the backends: the others never dial them too.
        self._lock = threading.Lock()

    def read(self) -> tuple[dict[str, str], float]:
        cached = self._cached
        stale = cached is None or self.clock() - cached[0] >= self.ttl
        # One refresher; the rest take the stale reading rather than queue behind it.
        if stale and self._lock.acquire(blocking=cached is None):
            try:
                cached = self._cached
                if cached is None or self.clock() - cached[0] >= self.ttl:
                    states = self.backends.health()
                    cached = self._cached = (self.clock(), states)
            finally:
                self._lock.release()
        if cached is None:  # unreachable: a first reading is waited for above
            raise RuntimeError("no health reading")
        at, states = cached
        return dict(states), max(0.0, self.clock() - at)
