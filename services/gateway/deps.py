"""What the gateway's routes share: bearer-token checks by role, the backends, the
limits and health state the app holds, and the parameters and error responses every
route declares.

The app keeps one of each in ``app.state`` (set by
:func:`services.gateway.app.create_app`); a route asks for it as a dependency.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.gateway import schemas
from services.gateway.backends import Backends, HealthCache
from services.gateway.metrics import GatewayMetrics
from services.gateway.ratelimit import MemoryBudget, TokenBuckets
from services.gateway.tokens import Principal, Role, TokenError, TokenStore

JOB_ID = Path(pattern=schemas.ID_PATTERN, description="a job or model id (UUID)")
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": schemas.ErrorOut} for code in (401, 403, 404, 409, 422, 429, 502, 503)
}

BEARER = HTTPBearer(auto_error=False, description="a token from `capc gateway token create`")


def principal(
    request: Request, credentials: HTTPAuthorizationCredentials | None, role: Role
) -> Principal:
    """The caller's token, verified against the app's token store and charged to its rate
    limit; 401 says what is wrong, 429 when to come back."""
    if credentials is None:
        raise HTTPException(
            401,
            "missing bearer token: send 'Authorization: Bearer capc_...' "
            f"(an admin creates one with `capc gateway token create --role {role.value}`)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    store: TokenStore = request.app.state.tokens
    try:
        who = store.verify(credentials.credentials)
    except TokenError as err:
        raise HTTPException(401, str(err), headers={"WWW-Authenticate": "Bearer"}) from None
    buckets: TokenBuckets = request.app.state.buckets
    wait = buckets.take(who.token_id)
    if wait > 0:
        seconds = max(1, math.ceil(wait))
        raise HTTPException(
            429,
            f"token {who.token_id} ({who.name}) is over its {buckets.per_minute} requests "
            f"per minute; retry in {seconds} s, or ask the gateway's operator for a higher "
            "--rate-limit",
            headers={"Retry-After": str(seconds)},
        )
    return who


def needs(role: Role) -> Callable[..., Principal]:
    """A dependency admitting tokens whose role grants ``role`` (403 otherwise)."""

    def check(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
    ) -> Principal:
        who = principal(request, credentials, role)
        if not who.may(role):
            raise HTTPException(
                403, f"this needs the {role.value} role; token {who.token_id} is {who.role.value}"
            )
        return who

    return check


def backends(request: Request) -> Backends:
    """The gRPC clients of the student party and the guardian."""
    live: Backends = request.app.state.backends
    return live


def uploads(request: Request) -> MemoryBudget:
    """The memory budget every upload in flight shares (bytes)."""
    budget: MemoryBudget = request.app.state.uploads
    return budget


def health(request: Request) -> HealthCache:
    """The backends' health as last read."""
    cache: HealthCache = request.app.state.health
    return cache


def probes(request: Request) -> TokenBuckets:
    """The /healthz rate limit, one bucket per client address."""
    buckets: TokenBuckets = request.app.state.probes
    return buckets


def metrics(request: Request) -> GatewayMetrics:
    """The gateway's Prometheus metrics."""
    gauges: GatewayMetrics = request.app.state.metrics
    return gauges


Analyst = Annotated[Principal, Depends(needs(Role.ANALYST))]
Admin = Annotated[Principal, Depends(needs(Role.ADMIN))]
Scraper = Annotated[Principal, Depends(needs(Role.METRICS))]
Backend = Annotated[Backends, Depends(backends)]
Uploads = Annotated[MemoryBudget, Depends(uploads)]
Health = Annotated[HealthCache, Depends(health)]
Probes = Annotated[TokenBuckets, Depends(probes)]
Metrics = Annotated[GatewayMetrics, Depends(metrics)]
