"""What the gateway admits at once: one memory budget for every request body in flight
(not only a limit per request), and an open /healthz that answers from a cached reading
of the backends and is held to a rate per client address.

Concurrency is driven by hand over ASGI: a stalled upload holds its share of the budget
until the test releases it (asyncio events, no sleeps), and the clock is injected.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import Message

from services.common.limits import HEALTH_CACHE_SECONDS
from services.gateway.app import create_app
from services.gateway.backends import Backends, HealthCache
from services.gateway.ratelimit import MemoryBudget
from services.gateway.routes.jobs import UPLOAD_OVERHEAD
from services.gateway.tokens import TokenStore

UPLOAD = "/v1/jobs/upload"
#: The start of a multipart upload, so that the form parser reads on for the file.
PART = (
    b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="q.npy"\r\n'
    b"Content-Type: application/octet-stream\r\n\r\n"
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class HealthCounting(Backends):
    """Backends whose health is read from memory, counting the reads."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1:1", "127.0.0.1:1", None, task="t")
        self.health_reads = 0
        self.guardian = "SERVING"

    def health(self) -> dict[str, str]:
        self.health_reads += 1
        return {"student": "SERVING", "guardian": self.guardian}


@pytest.fixture
def backends() -> Iterator[HealthCounting]:
    b = HealthCounting()
    yield b
    b.close()


@pytest.fixture
def store(tmp_path: Path) -> TokenStore:
    return TokenStore(str(tmp_path / "t.db"))


class Request:
    """One POST driven over ASGI by hand. ``chunks`` are handed to the app one per
    ``receive``; with ``stall`` the request stops before its last chunk, sets
    ``stalled`` and waits for ``go``."""

    def __init__(
        self,
        chunks: list[bytes],
        token: str,
        declare_length: bool = True,
        stall: bool = False,
    ) -> None:
        self.chunks, self.stall = list(chunks), stall
        self.stalled, self.go = asyncio.Event(), asyncio.Event()
        headers = [
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"multipart/form-data; boundary=xyz"),
        ]
        if declare_length:
            headers.append((b"content-length", str(sum(map(len, chunks))).encode()))
        self.scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": UPLOAD,
            "raw_path": UPLOAD.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("10.0.0.1", 5000),
            "server": ("testserver", 80),
        }
        self.status: int | None = None
        self.headers: dict[bytes, bytes] = {}
        self.body = b""

    async def receive(self) -> Message:
        if not self.chunks:
            await asyncio.Event().wait()  # the app never reads past the end
        if self.stall and len(self.chunks) == 1:
            self.stalled.set()
            await self.go.wait()
        chunk = self.chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = dict(message.get("headers", []))
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")

    async def run(self, app: FastAPI) -> Request:
        # A guard against a hang only: every step below is ordered by events.
        await asyncio.wait_for(app(self.scope, self.receive, self.send), 60)
        return self

    @property
    def detail(self) -> str:
        return str(json.loads(self.body)["detail"])


def test_concurrent_uploads_share_one_memory_budget(
    backends: HealthCounting, store: TokenStore
) -> None:
    app = create_app(backends, store, max_upload_bytes=1000, uploads_in_flight_bytes=1500)
    budget: MemoryBudget = app.state.uploads
    token = store.create("analyst", "uploader")[0]

    async def scenario() -> None:
        # A declares 1,000 bytes, sends 900 and stalls before its last chunk, holding them.
        a = Request([PART + b"-" * (900 - len(PART)), b"-" * 100], token, stall=True)
        held = asyncio.create_task(a.run(app))
        await asyncio.wait_for(a.stalled.wait(), 60)
        assert budget.held == 900
        # Each of B and C fits the per-request limit; B's declared 700 do not fit beside
        # A's 900 and are refused before a byte is read.
        b = await Request([b"-" * 700], token).run(app)
        assert b.status == 503, b.body
        assert b.headers[b"retry-after"] == b"5"
        assert "at most 1500 bytes at once" in b.detail and "--max-uploads-mb" in b.detail
        assert "holds 900 bytes" in b.detail and "Retry in 5 s" in b.detail
        c = await Request([b"-" * 400], token).run(app)
        assert c.status != 503, c.body  # admitted (then refused as a malformed form)
        assert budget.held == 900  # C gave back what it held
        # Without a Content-Length the body is counted chunk by chunk as it arrives.
        chunks = [PART + b"-" * (350 - len(PART)), b"-" * 350]
        d = await Request(chunks, token, declare_length=False).run(app)
        assert d.status == 503 and "needs 350 more" in d.detail, d.body
        assert budget.held == 900
        a.go.set()
        await held
        assert a.status != 503 and budget.held == 0
        again = await Request([b"-" * 600], token).run(app)
        assert again.status != 503, again.body

    asyncio.run(scenario())
    # The per-request limit still answers first, with 413.
    with TestClient(app) as client:
        big = client.post(UPLOAD, content=b"-" * 1001, headers={"Authorization": f"Bearer {token}"})
        assert big.status_code == 413 and "limit of 1000 bytes" in big.json()["detail"]


def npy(n: int) -> bytes:
    """An .npy of ``n`` uint8 queries of shape (1, 2, 2): 4 n bytes as float32."""
    buf = io.BytesIO()
    np.save(buf, np.zeros((n, 1, 2, 2), dtype=np.uint8))
    return buf.getvalue()


def test_parsed_queries_are_reserved_from_the_same_budget_before_inflating(
    backends: HealthCounting, store: TokenStore
) -> None:
    # 250 queries: a 1,128-byte .npy whose queries take 3 x 4,000 bytes to parse and send.
    data = npy(250)
    limit = 15_000 + UPLOAD_OVERHEAD  # room for one such upload's objects too
    app = create_app(backends, store, max_upload_bytes=3000, uploads_in_flight_bytes=limit)
    budget: MemoryBudget = app.state.uploads
    token = store.create("analyst", "uploader")[0]
    head = {"Authorization": f"Bearer {token}"}
    with TestClient(app) as c:

        def upload() -> Any:
            return c.post(UPLOAD, files={"file": ("q.npy", data)}, headers=head)

        # Alone it fits; it then fails at the (unreachable) student party, and every
        # byte it held is given back.
        alone = upload()
        assert alone.status_code == 503 and budget.held == 0
        assert "student party is not answering" in alone.json()["detail"]
        # With 4,000 bytes held by another request, its 12,000 (with the 1,128 of its
        # body's second copy and UPLOAD_OVERHEAD) do not fit beside them.
        assert budget.take(4000)
        busy = upload()
        assert busy.status_code == 503 and busy.headers["retry-after"] == "5"
        assert (
            f"needs {13128 + UPLOAD_OVERHEAD} more" in busy.json()["detail"] and budget.held == 4000
        )
        budget.give(4000)
        # One that could not fit even alone is too large, not early.
        buf = io.BytesIO()
        np.savez_compressed(buf, x=np.zeros((2000, 1, 2, 2), dtype=np.uint8))
        assert len(buf.getvalue()) < 3000  # the body fits; its 24,000 parsed bytes do not
        big = c.post(UPLOAD, files={"file": ("q.npz", buf.getvalue())}, headers=head)
        assert big.status_code == 413, big.text
        assert f"over the {limit} bytes the gateway gives all uploads" in big.json()["detail"]
        assert budget.held == 0
    with pytest.raises(ValueError, match="raise --max-uploads-mb"):
        create_app(backends, store, max_upload_bytes=3000, uploads_in_flight_bytes=2999)


def test_the_memory_budget_refuses_what_does_not_fit_and_takes_it_back() -> None:
    budget = MemoryBudget(10)
    assert budget.take(6) and not budget.take(5) and budget.held == 6
    assert budget.take(4) and budget.held == 10
    budget.give(10)
    assert budget.held == 0
    with pytest.raises(ValueError, match="held"):
        budget.give(1)
    with pytest.raises(ValueError, match="at least 1 byte"):
        MemoryBudget(0)


def test_healthz_answers_from_a_cached_reading(backends: HealthCounting, store: TokenStore) -> None:
    clock = Clock()
    with TestClient(create_app(backends, store, clock=clock)) as c:
        first = c.get("/healthz")
        assert first.status_code == 200 and first.json()["age_s"] == 0
        clock.now += HEALTH_CACHE_SECONDS - 1
        for _ in range(20):
            r = c.get("/healthz")
        assert r.json()["age_s"] == HEALTH_CACHE_SECONDS - 1
        assert backends.health_reads == 1
        backends.guardian = "UNREACHABLE"
        assert c.get("/healthz").status_code == 200  # still the cached reading
        clock.now += 1
        down = c.get("/healthz")
        assert down.status_code == 503 and down.json()["backends"]["guardian"] == "UNREACHABLE"
        assert backends.health_reads == 2


def test_healthz_is_held_to_a_rate_per_client_address(
    backends: HealthCounting, store: TokenStore
) -> None:
    clock = Clock()
    app = create_app(backends, store, clock=clock, healthz_per_minute=3)
    with TestClient(app, client=("10.0.0.1", 1)) as busy:
        assert [busy.get("/healthz").status_code for _ in range(3)] == [200] * 3
        r = busy.get("/healthz")
        assert r.status_code == 429 and r.headers["retry-after"] == "20"
        assert "10.0.0.1 is over its 3 /healthz requests per minute" in r.json()["detail"]
        with TestClient(app, client=("10.0.0.2", 1)) as other:
            assert other.get("/healthz").status_code == 200
        clock.now += 20
        assert busy.get("/healthz").status_code == 200
        assert busy.get("/healthz").status_code == 429
    assert backends.health_reads == 2  # refused requests read nothing


class HealthStalled(HealthCounting):
    """Backends whose health reading, once ``stall`` is set, waits for ``go`` (a backend
    that does not answer its health check until the test lets it)."""

    def __init__(self) -> None:
        super().__init__()
        self.stall = False
        self.entered = threading.Event()
        self.go = threading.Event()

    def health(self) -> dict[str, str]:
        if self.stall:
            self.entered.set()
            self.go.wait()
        return super().health()


def test_a_slow_health_reading_holds_up_no_other_probe(store: TokenStore) -> None:
    """While one /healthz refreshes a stale reading from a backend that does not answer,
    every other probe is answered at once from the stale reading with its age, and reads
    no backend: a burst of open probes cannot park the gateway's worker threads. (Before,
    each waited on the refresh's lock for up to two 3 s health checks.)"""
    backends = HealthStalled()
    clock = Clock()
    cache = HealthCache(backends, ttl=5.0, clock=clock)
    try:
        assert cache.read() == ({"student": "SERVING", "guardian": "SERVING"}, 0.0)
        clock.now += 7.0
        backends.stall, backends.guardian = True, "UNREACHABLE"
        refresher = threading.Thread(target=cache.read, daemon=True)
        refresher.start()
        assert backends.entered.wait(timeout=60), "the refresh never read the backends"
        answered: list[tuple[dict[str, str], float]] = []
        probes = [
            threading.Thread(target=lambda: answered.append(cache.read()), daemon=True)
            for _ in range(8)
        ]
        for t in probes:
            t.start()
        # A deadlock guard only (answered at once, or never): one deadline for all.
        deadline = time.monotonic() + 30
        for t in probes:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        stuck = sum(t.is_alive() for t in probes)
        backends.go.set()
        refresher.join(timeout=60)
        assert stuck == 0, f"{stuck} probes waited for the slow backend"
        assert answered == [({"student": "SERVING", "guardian": "SERVING"}, 7.0)] * 8
        assert backends.health_reads == 2  # the first reading and the one refresh
        assert cache.read() == ({"student": "SERVING", "guardian": "UNREACHABLE"}, 0.0)
    finally:
        backends.go.set()
        backends.close()


def test_a_declared_length_that_never_arrives_holds_no_budget(
    backends: HealthCounting, store: TokenStore
) -> None:
    """Connections that declare the largest Content-Length and send nothing (no token
    needed: the budget is taken before routing) would, if the declared length were
    reserved on arrival, shut every body out of the gateway for as long as they stay
    open. Only bytes that arrived are held; a declared length that does not fit the
    room left now is still refused early, without reserving anything."""
    app = create_app(backends, store, max_upload_bytes=1000, uploads_in_flight_bytes=1500)
    budget: MemoryBudget = app.state.uploads
    token = store.create("analyst", "uploader")[0]

    async def scenario() -> None:
        idle = [Request([b"-" * 1000], "none", stall=True) for _ in range(3)]
        tasks = []
        for r in idle:
            tasks.append(asyncio.create_task(r.run(app)))
            await asyncio.wait_for(r.stalled.wait(), 60)
            assert budget.held == 0, "a declared length that never arrived holds the budget"
        honest = await Request([PART, b"-" * (600 - len(PART))], token).run(app)
        assert honest.status != 503, honest.body  # admitted (then refused as a bad form)
        # Real bytes are held: 900 arrived, so 700 more declared do not fit, refused early.
        full = Request([PART + b"-" * (900 - len(PART)), b"-" * 100], token, stall=True)
        held = asyncio.create_task(full.run(app))
        await asyncio.wait_for(full.stalled.wait(), 60)
        assert budget.held == 900
        early = await Request([b"-" * 700], token).run(app)
        assert early.status == 503 and "needs 700 more" in early.detail, early.body
        assert budget.held == 900
        for r in [*idle, full]:
            r.go.set()
        await asyncio.gather(held, *tasks)
        assert budget.held == 0

    asyncio.run(scenario())
