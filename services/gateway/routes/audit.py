"""Admin reads of the guardian's signed audit log and of the empirical privacy audits
(which no gateway token may record)."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from services.common.limits import DEFAULT_LIST_PAGE, MAX_LIST_PAGE
from services.common.protocol import WHO_MAY_RECORD
from services.gateway import schemas
from services.gateway.deps import ERRORS, NAME, Admin, Backend
from services.gateway.replies import fields, privacy_audit_out
from services.gateway.scope import own_party
from services.proto.capc.v1 import guardian_pb2

router = APIRouter()


@router.get("/v1/admin/audit", response_model=schemas.AuditPage, responses=ERRORS, tags=["admin"])
def audit(
    _: Admin,
    backends: Backend,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_PAGE)] = DEFAULT_LIST_PAGE,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
) -> schemas.AuditPage:
    # Whole on a hospital's own gateway too: one hash chain, verified from its start
    # (services.gateway.scope).
    reply = backends.guardian_call(
        backends.hub.ListAudit,
        guardian_pb2.ListAuditRequest(header=backends.header, limit=limit, offset=offset),
    )
    return schemas.AuditPage(
        entries=[
            schemas.AuditEntryOut(
                **fields(e, detail=json.loads(e.detail_json or "{}"), note=e.note or None)
            )
            for e in reply.entries
        ],
        chain_valid=reply.chain_valid,
        head=schemas.AuditHeadOut(**fields(reply.head)),
        audit_public_key=reply.audit_public_key,
        disputes=[schemas.DisputeOut(**fields(d)) for d in reply.disputes],
        limit=limit,
        offset=offset,
    )


@router.get(
    "/v1/admin/privacy-audits",
    response_model=schemas.PrivacyAuditList,
    responses=ERRORS,
    tags=["admin"],
    summary="Empirical privacy audits (canary attacks) beside each party's claimed epsilon",
)
def privacy_audits(
    _: Admin,
    backends: Backend,
    party: Annotated[str | None, Query(pattern=NAME)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_PAGE)] = DEFAULT_LIST_PAGE,
) -> schemas.PrivacyAuditList:
    reply = backends.guardian_call(
        backends.hub.ListPrivacyAudits,
        guardian_pb2.ListPrivacyAuditsRequest(
            header=backends.header, party=own_party(backends, party) or "", limit=limit
        ),
    )
    return schemas.PrivacyAuditList(audits=[privacy_audit_out(a) for a in reply.audits])


@router.post(
    "/v1/admin/privacy-audits",
    responses=ERRORS,
    tags=["admin"],
    summary="Refused: audits are recorded by the guardian's operator or the hospital itself",
    description="A privacy audit may call a hospital's claim refuted, so the querier "
    "side reads audits and never writes them: the guardian's operator records one "
    "with the guardian's certificate, a hospital's auditor with its own "
    "(`capc audit record`). Always 403 (401 without a token).",
)
def record_privacy_audit(who: Admin) -> Response:
    raise HTTPException(
        403,
        f"token {who.token_id} ({who.name}) may read privacy audits here (GET) but no "
        f"gateway token may record one: {WHO_MAY_RECORD}",
    )
