"""The REST gateway (FastAPI): jobs, student models, budgets and admin, plus the dashboard.

Every route under ``/v1`` needs a bearer token: analysts create and read jobs
and models; admins also read parties, budgets (the guardian's ledger beside
each hospital's own), the ledger and the signed audit log. Nobody here can
change a cap: each hospital sets its own. ``/metrics`` needs a ``metrics`` (scrape) or admin token: it
carries every party's cap and spend. Each token is held to its requests per
minute (429 with Retry-After). ``/healthz`` and the dashboard page are open;
the dashboard reads its data with the token the viewer gives it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from services.common.limits import (
    GATEWAY_REQUESTS_PER_MINUTE,
    HEALTHZ_REQUESTS_PER_MINUTE,
    MAX_UPLOAD_BYTES,
    MAX_UPLOADS_IN_FLIGHT_BYTES,
)
from services.gateway.backends import BackendError, Backends, HealthCache
from services.gateway.bodylimit import BodyLimit
from services.gateway.metrics import GatewayMetrics
from services.gateway.ratelimit import MemoryBudget, TokenBuckets
from services.gateway.routes import ROUTERS
from services.gateway.tokens import TokenStore


def create_app(
    backends: Backends,
    tokens: TokenStore,
    max_upload_bytes: int = MAX_UPLOAD_BYTES,
    requests_per_minute: int = GATEWAY_REQUESTS_PER_MINUTE,
    clock: Callable[[], float] = time.monotonic,
    uploads_in_flight_bytes: int = MAX_UPLOADS_IN_FLIGHT_BYTES,
    healthz_per_minute: int = HEALTHZ_REQUESTS_PER_MINUTE,
) -> FastAPI:
    """The gateway app over live backends; ``max_upload_bytes`` bounds any request body,
    ``uploads_in_flight_bytes`` all bodies held at once, ``requests_per_minute`` what
    each token may send and ``healthz_per_minute`` what each client address may ask of
    /healthz (``clock`` paces the rate limits, the health cache and the metrics cache)."""
    app = FastAPI(
        title="capc gateway",
        version="1",
        description="Labelling jobs, student models and privacy budgets of a capc consortium.",
    )
    # What the routes' dependencies (services.gateway.deps) read.
    app.state.backends = backends
    app.state.metrics = metrics = GatewayMetrics(backends, clock)
    app.state.tokens = tokens
    app.state.buckets = TokenBuckets(requests_per_minute, clock)
    if uploads_in_flight_bytes < max_upload_bytes:
        raise ValueError(
            f"the memory for all uploads at once ({uploads_in_flight_bytes} bytes, "
            f"--max-uploads-mb) is below the largest request body ({max_upload_bytes} bytes, "
            "--max-upload-mb): no upload of that size could ever be taken; raise "
            "--max-uploads-mb"
        )
    app.state.uploads = MemoryBudget(uploads_in_flight_bytes)
    app.state.health = HealthCache(backends, clock=clock)
    app.state.probes = TokenBuckets(healthz_per_minute, clock)
    app.add_middleware(BodyLimit, limit=max_upload_bytes, budget=app.state.uploads)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, err: RequestValidationError) -> JSONResponse:
        # Without the offending input: it may hold NaN, which JSON cannot carry, or bulk data.
        detail = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
            for e in err.errors()
        ]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(BackendError)
    async def backend_error(_: Request, err: BackendError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=err.status)

    @app.middleware("http")
    async def measure(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        metrics.requests.labels(request.method, path, str(response.status_code)).inc()
        metrics.latency.labels(path).observe(time.perf_counter() - start)
        return response

    for router in ROUTERS:
        app.include_router(router)
    return app
