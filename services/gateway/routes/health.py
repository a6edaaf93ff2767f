"""``/healthz`` (open, limited per client address) and ``/metrics`` (a metrics or admin token)."""

from __future__ import annotations

import math

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.gateway import schemas
from services.gateway.deps import ERRORS, Health, Metrics, Probes, Scraper

router = APIRouter()


@router.get(
    "/healthz",
    response_model=schemas.Health,
    responses={429: {"model": schemas.ErrorOut}},
    tags=["operations"],
    summary="The backends' health, as last read (at most once per few seconds)",
)
def healthz(request: Request, response: Response, probes: Probes, health: Health) -> schemas.Health:
    # No token here, so the limit is per client address; behind a proxy that is
    # the proxy's, and the proxy's own limits apply to the clients behind it.
    address = request.client.host if request.client else "unknown"
    wait = probes.take(address)
    if wait > 0:
        seconds = max(1, math.ceil(wait))
        raise HTTPException(
            429,
            f"{address} is over its {probes.per_minute} /healthz requests per minute; "
            f"retry in {seconds} s (a probe every few seconds stays far below)",
            headers={"Retry-After": str(seconds)},
        )
    states, age = health.read()
    ok = all(v == "SERVING" for v in states.values())
    response.status_code = 200 if ok else 503
    return schemas.Health(status="ok" if ok else "degraded", backends=states, age_s=age)


@router.get(
    "/metrics",
    tags=["operations"],
    response_class=Response,
    responses={
        **{code: ERRORS[code] for code in (401, 403, 429)},
        200: {"description": "Prometheus text format", "content": {"text/plain": {}}},
    },
    summary="Prometheus metrics (a metrics or admin token)",
)
def prometheus(_: Scraper, metrics: Metrics) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
