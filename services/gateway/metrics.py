"""Prometheus metrics: the gateway's own request counts and latencies, and the
consortium's state (rounds, queries answered and not answered, epsilon per
party), read from the backends when Prometheus scrapes, at most once per
METRICS_CACHE_SECONDS. /metrics needs a ``metrics`` (or admin) token: the
per-party caps and spend are the admin API's data, so a hospital's own gateway
(:mod:`services.gateway.scope`) gives that hospital's alone."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.gateway.backends import BackendError, Backends
from services.gateway.scope import shown

log = logging.getLogger("capc.gateway")
#: Jobs read per scrape (newest first); totals cover these.
SCRAPE_JOBS = 1000
#: Seconds one read of the backends serves scrapes for. Prometheus scrapes every 15 s
#: or more; several scrapers, or a scrape token in a loop, then cost the guardian and
#: the student party at most one read each per period.
METRICS_CACHE_SECONDS = 5.0


@dataclass(frozen=True)
class _Party:
    name: str
    spent: float
    cap: float
    connected: bool
    rounds: int
    own_spent: float
    diverged: bool


@dataclass(frozen=True)
class _Jobs:
    states: tuple[tuple[str, int], ...]
    rounds: int
    answered: int
    rejected: int
    round_seconds: float


@dataclass(frozen=True)
class _Snapshot:
    """What one read of the backends found: a few numbers per party and job totals, so
    the cache holds no more than the consortium has parties. None: the backend failed."""

    at: float
    parties: tuple[_Party, ...] | None
    jobs: _Jobs | None


class ConsortiumCollector(Collector):
    """The guardian's budgets and the student's jobs, read at most once per ``ttl``
    seconds however often or concurrently Prometheus scrapes."""

    def __init__(
        self,
        backends: Backends,
        ttl: float = METRICS_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backends, self.ttl, self.clock = backends, ttl, clock
        self._cached: _Snapshot | None = None
        # Held across the read: scrapes arriving meanwhile wait and share its result
        # instead of each asking the backends again.
        self._lock = threading.Lock()

    def snapshot(self) -> _Snapshot:
        with self._lock:
            cached = self._cached
            if cached is None or self.clock() - cached.at >= self.ttl:
                parties, jobs = self._parties(), self._jobs()
                # Stamped after the read, so a slow backend is not asked again at once.
                cached = self._cached = _Snapshot(self.clock(), parties, jobs)
            return cached

    def _parties(self) -> tuple[_Party, ...] | None:
        try:
            reply = self.backends.list_parties()
        except BackendError as err:
            log.warning("metrics: guardian unavailable: %s", err)
            return None
        # A hospital's own gateway scrapes what its admin views show: that hospital alone.
        mine = shown(self.backends, reply)
        return tuple(
            _Party(
                p.name,
                p.epsilon_spent,
                p.epsilon_cap,
                p.connected,
                p.rounds,
                p.party_epsilon_spent,
                p.ledgers == "diverged",
            )
            for p in reply.parties
            if mine is None or p.name in mine
        )

    def _jobs(self) -> _Jobs | None:
        try:
            jobs = self.backends.list_jobs(SCRAPE_JOBS, 0).jobs
        except BackendError as err:
            log.warning("metrics: student party unavailable: %s", err)
            return None
        states: dict[str, int] = {}
        for j in jobs:
            states[j.state] = states.get(j.state, 0) + 1
        return _Jobs(
            tuple(sorted(states.items())),
            sum(j.rounds for j in jobs),
            sum(j.answered for j in jobs),
            sum(j.processed - j.answered for j in jobs),
            sum(j.round_seconds for j in jobs),
        )

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        up = GaugeMetricFamily("capc_backend_up", "1 when the backend answered", labels=["backend"])
        up.add_metric(["guardian"], float(snap.parties is not None))
        up.add_metric(["student"], float(snap.jobs is not None))
        if snap.parties is not None:
            spent = GaugeMetricFamily(
                "capc_party_epsilon_spent",
                "epsilon spent (reservations included)",
                labels=["party"],
            )
            cap = GaugeMetricFamily("capc_party_epsilon_cap", "epsilon cap", labels=["party"])
            connected = GaugeMetricFamily(
                "capc_party_connected", "1 while the party holds its stream", labels=["party"]
            )
            rounds = CounterMetricFamily(
                "capc_party_rounds", "rounds the party was charged for", labels=["party"]
            )
            own = GaugeMetricFamily(
                "capc_party_own_epsilon_spent",
                "epsilon spent by the party's own ledger, as it last reported it",
                labels=["party"],
            )
            diverged = GaugeMetricFamily(
                "capc_party_ledgers_diverged",
                "1 when the party's own ledger and the guardian's disagree",
                labels=["party"],
            )
            for p in snap.parties:
                spent.add_metric([p.name], p.spent)
                cap.add_metric([p.name], p.cap)
                connected.add_metric([p.name], float(p.connected))
                rounds.add_metric([p.name], float(p.rounds))
                own.add_metric([p.name], p.own_spent)
                diverged.add_metric([p.name], float(p.diverged))
            yield from (spent, cap, connected, rounds, own, diverged)
        yield up
        jobs = snap.jobs
        if jobs is None:
            return
        by_state = GaugeMetricFamily("capc_jobs", "labelling jobs by state", labels=["state"])
        for state, n in jobs.states:
            by_state.add_metric([state], float(n))
        yield by_state
        yield CounterMetricFamily("capc_rounds", "labelling rounds run", value=float(jobs.rounds))
        yield CounterMetricFamily(
            "capc_queries_answered",
            "queries the consortium answered",
            value=float(jobs.answered),
        )
        yield CounterMetricFamily(
            "capc_queries_rejected",
            "queries the mechanism declined to answer (not confident enough)",
            value=float(jobs.rejected),
        )
        yield CounterMetricFamily(
            "capc_round_seconds",
            "seconds spent in rounds (open and 2PC), summed",
            value=jobs.round_seconds,
        )


class GatewayMetrics:
    """One registry per app, so tests and several apps in one process do not collide."""

    def __init__(self, backends: Backends, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "capc_gateway_requests",
            "REST requests by route and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "capc_gateway_request_seconds",
            "REST request latency",
            ["route"],
            registry=self.registry,
        )
        self.registry.register(ConsortiumCollector(backends, clock=clock))
