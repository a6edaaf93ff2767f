"""/metrics needs a scrape token and reads the backends at most once per cache period;
every token is held to its requests per minute with a 429 that says when to retry."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from services.gateway.app import create_app
from services.gateway.backends import BackendError, Backends
from services.gateway.metrics import METRICS_CACHE_SECONDS
from services.gateway.tokens import TokenStore
from services.proto.capc.v1 import guardian_pb2, student_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingBackends(Backends):
    """Backends that answer from memory and count the reads /metrics makes."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1:1", "127.0.0.1:1", None, task="t")
        self.party_reads = 0
        self.job_reads = 0
        self.guardian_down = False
        self.gate = threading.Event()
        self.gate.set()

    def list_parties(self) -> guardian_pb2.ListPartiesReply:
        self.party_reads += 1
        self.gate.wait(5)
        if self.guardian_down:
            raise BackendError("guardian", None, "down")
        return guardian_pb2.ListPartiesReply(
            parties=[
                guardian_pb2.PartyStatus(
                    name="hospital-a", role="answerer", epsilon_spent=1.5, epsilon_cap=8.0
                )
            ],
            delta=1e-5,
        )

    def list_jobs(self, limit: int, offset: int) -> student_pb2.ListJobsReply:
        self.job_reads += 1
        return student_pb2.ListJobsReply(
            jobs=[student_pb2.Job(state="done", processed=10, answered=7, rounds=2)]
        )


@pytest.fixture
def backends() -> Iterator[CountingBackends]:
    b = CountingBackends()
    yield b
    b.close()


@pytest.fixture
def store(tmp_path: Path) -> TokenStore:
    return TokenStore(str(tmp_path / "t.db"))


def bearer(store: TokenStore, role: str, name: str = "") -> dict[str, str]:
    return {"Authorization": f"Bearer {store.create(role, name or role)[0]}"}


def test_metrics_need_a_scrape_token_and_hide_budgets_from_everyone_else(
    backends: CountingBackends, store: TokenStore
) -> None:
    with TestClient(create_app(backends, store)) as c:
        anonymous = c.get("/metrics")
        assert anonymous.status_code == 401, anonymous.text
        assert "hospital-a" not in anonymous.text and "epsilon" not in anonymous.text
        assert "--role metrics" in anonymous.json()["detail"]
        analyst = c.get("/metrics", headers=bearer(store, "analyst"))
        assert analyst.status_code == 403 and "metrics role" in analyst.json()["detail"]
        scraper = bearer(store, "metrics", "prometheus")
        r = c.get("/metrics", headers=scraper)
        assert r.status_code == 200
        assert 'capc_party_epsilon_spent{party="hospital-a"} 1.5' in r.text
        assert "capc_queries_answered_total 7.0" in r.text
        assert c.get("/metrics", headers=bearer(store, "admin")).status_code == 200
        # The scrape token reads metrics and nothing else.
        for path in ("/v1/jobs", "/v1/admin/budgets"):
            assert c.get(path, headers=scraper).status_code == 403
    assert backends.party_reads == 1 and backends.job_reads == 1  # the rest came from the cache


def test_a_scrape_reads_the_backends_at_most_once_per_cache_period(
    backends: CountingBackends, store: TokenStore
) -> None:
    clock = Clock()
    with TestClient(create_app(backends, store, clock=clock)) as c:
        scraper = bearer(store, "metrics")
        for _ in range(20):
            assert c.get("/metrics", headers=scraper).status_code == 200
        assert (backends.party_reads, backends.job_reads) == (1, 1)
        clock.now += METRICS_CACHE_SECONDS + 0.1
        text = c.get("/metrics", headers=scraper).text
        assert (backends.party_reads, backends.job_reads) == (2, 2)
        # A backend that is down is not asked again on every scrape either.
        backends.guardian_down = True
        clock.now += METRICS_CACHE_SECONDS + 0.1
        for _ in range(5):
            text = c.get("/metrics", headers=scraper).text
        assert backends.party_reads == 3
        assert 'capc_backend_up{backend="guardian"} 0.0' in text


def test_concurrent_scrapes_share_one_backend_read(
    backends: CountingBackends, store: TokenStore
) -> None:
    with TestClient(create_app(backends, store)) as c:
        scraper = bearer(store, "metrics")
        backends.gate.clear()  # the guardian answers slowly
        codes: list[int] = []
        threads = [
            threading.Thread(
                target=lambda: codes.append(c.get("/metrics", headers=scraper).status_code)
            )
            for _ in range(6)
        ]
        for t in threads:
            t.start()
        backends.gate.wait(0.5)
        backends.gate.set()
        for t in threads:
            t.join(10)
    assert codes == [200] * 6
    assert backends.party_reads == 1


def test_each_token_is_held_to_its_rate_with_retry_after(
    backends: CountingBackends, store: TokenStore
) -> None:
    clock = Clock()
    app = create_app(backends, store, requests_per_minute=3, clock=clock)
    with TestClient(app) as c:
        busy, other = bearer(store, "metrics", "busy"), bearer(store, "metrics", "other")
        assert [c.get("/metrics", headers=busy).status_code for _ in range(3)] == [200] * 3
        r = c.get("/metrics", headers=busy)
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "20"  # one request every 20 s at 3 a minute
        detail = r.json()["detail"]
        assert "3 requests per minute" in detail and "retry in 20 s" in detail
        assert "busy" in detail
        # Another token has its own bucket.
        assert c.get("/metrics", headers=other).status_code == 200
        clock.now += 19
        r = c.get("/metrics", headers=busy)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        clock.now += 1
        assert c.get("/metrics", headers=busy).status_code == 200
        assert c.get("/metrics", headers=busy).status_code == 429
        # Refused requests do not count, and a minute's rest refills the whole burst.
        clock.now += 60
        assert [c.get("/metrics", headers=busy).status_code for _ in range(4)] == [
            200,
            200,
            200,
            429,
        ]
        # Without a token there is no bucket to spend: the 401 says what is missing.
        assert c.get("/v1/jobs").status_code == 401


def test_the_rate_limit_is_a_serve_option() -> None:
    from services.commands.cli import build_parser

    args = build_parser().parse_args(
        ["gateway", "serve", "--student", "s:1", "--guardian", "g:1", "--rate-limit", "120"]
    )
    assert args.rate_limit == 120
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["gateway", "serve", "--student", "s:1", "--guardian", "g:1", "--rate-limit", "0"]
        )
