"""Prometheus metrics: the gateway's own request counts and latencies, and the
consortium's state (rounds, queries answered and not answered, epsilon per
party), read from the backends when Prometheus scrapes."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.gateway.backends import BackendError, Backends

log = logging.getLogger("capc.gateway")
#: Jobs read per scrape (newest first); totals cover these.
SCRAPE_JOBS = 1000


class ConsortiumCollector(Collector):
    """Reads the guardian's budgets and the student's jobs on every scrape."""

    def __init__(self, backends: Backends) -> None:
        self.backends = backends

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("capc_backend_up", "1 when the backend answered", labels=["backend"])
        try:
            parties = self.backends.list_parties()
            up.add_metric(["guardian"], 1.0)
        except BackendError as err:
            log.warning("metrics: guardian unavailable: %s", err)
            parties = None
            up.add_metric(["guardian"], 0.0)
        if parties is not None:
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
            for p in parties.parties:
                spent.add_metric([p.name], p.epsilon_spent)
                cap.add_metric([p.name], p.epsilon_cap)
                connected.add_metric([p.name], float(p.connected))
                rounds.add_metric([p.name], float(p.rounds))
            yield from (spent, cap, connected, rounds)
        try:
            jobs = self.backends.list_jobs(SCRAPE_JOBS, 0).jobs
            up.add_metric(["student"], 1.0)
        except BackendError as err:
            log.warning("metrics: student party unavailable: %s", err)
            jobs = None
            up.add_metric(["student"], 0.0)
        yield up
        if jobs is None:
            return
        by_state = GaugeMetricFamily("capc_jobs", "labelling jobs by state", labels=["state"])
        states: dict[str, int] = {}
        for j in jobs:
            states[j.state] = states.get(j.state, 0) + 1
        for state, n in sorted(states.items()):
            by_state.add_metric([state], float(n))
        yield by_state
        yield CounterMetricFamily(
            "capc_rounds", "labelling rounds run", value=float(sum(j.rounds for j in jobs))
        )
        yield CounterMetricFamily(
            "capc_queries_answered",
            "queries the consortium answered",
            value=float(sum(j.answered for j in jobs)),
        )
        yield CounterMetricFamily(
            "capc_queries_rejected",
            "queries the mechanism declined to answer (not confident enough)",
            value=float(sum(j.processed - j.answered for j in jobs)),
        )
        yield CounterMetricFamily(
            "capc_round_seconds",
            "seconds spent in rounds (open and 2PC), summed",
            value=float(sum(j.round_seconds for j in jobs)),
        )


class GatewayMetrics:
    """One registry per app, so tests and several apps in one process do not collide."""

    def __init__(self, backends: Backends) -> None:
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
        self.registry.register(ConsortiumCollector(backends))
