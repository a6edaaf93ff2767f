"""Admin reads of parties, budgets, their history and the guardian's ledger. Nobody here
can change a cap: each hospital sets its own."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from services.common.limits import DEFAULT_LIST_PAGE, MAX_LIST_PAGE
from services.gateway import schemas
from services.gateway.deps import ERRORS, NAME, Admin, Backend
from services.gateway.replies import fields, party_out
from services.gateway.scope import own_party, shown
from services.proto.capc.v1 import guardian_pb2

router = APIRouter()


@router.get("/v1/admin/parties", response_model=schemas.PartyList, responses=ERRORS, tags=["admin"])
def parties(_: Admin, backends: Backend) -> schemas.PartyList:
    reply = backends.list_parties()
    mine = shown(backends, reply)
    return schemas.PartyList(
        parties=[
            party_out(p, reply.delta) for p in reply.parties if mine is None or p.name in mine
        ],
        delta=reply.delta,
        accounting=reply.accounting,
        plan_warnings=list(reply.plan_warnings),
    )


@router.get(
    "/v1/admin/budgets", response_model=schemas.BudgetList, responses=ERRORS, tags=["admin"]
)
def budgets(_: Admin, backends: Backend) -> schemas.BudgetList:
    reply = backends.list_parties()
    mine = shown(backends, reply)
    return schemas.BudgetList(
        task=backends.task,
        delta=reply.delta,
        accounting=reply.accounting,
        budgets=[
            schemas.BudgetOut(
                **party_out(p, reply.delta).model_dump(),
                party=p.name,
                delta=reply.delta,
                accounting=reply.accounting,
            )
            for p in reply.parties
            if p.role == "answerer" and (mine is None or p.name in mine)
        ],
        plan_warnings=list(reply.plan_warnings),
    )


@router.get(
    "/v1/admin/budgets/history",
    response_model=schemas.History,
    responses=ERRORS,
    tags=["admin"],
    summary="Each party's epsilon after every ledger entry, for charts",
)
def history(
    _: Admin,
    backends: Backend,
    party: Annotated[str | None, Query(pattern=NAME)] = None,
    max_points: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> schemas.History:
    reply = backends.guardian_call(
        backends.hub.BudgetHistory,
        guardian_pb2.BudgetHistoryRequest(
            header=backends.header,
            party=own_party(backends, party) or "",
            max_points=max_points,
        ),
    )
    return schemas.History(
        delta=reply.delta,
        series=[
            schemas.HistorySeries(
                **fields(s, points=[schemas.HistoryPoint(**fields(p)) for p in s.points])
            )
            for s in reply.series
        ],
    )


@router.get("/v1/admin/ledger", response_model=schemas.LedgerPage, responses=ERRORS, tags=["admin"])
def ledger(
    _: Admin,
    backends: Backend,
    party: Annotated[str | None, Query(pattern=NAME)] = None,
    round_id: Annotated[int | None, Query(ge=1, le=2**62)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_PAGE)] = DEFAULT_LIST_PAGE,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
) -> schemas.LedgerPage:
    reply = backends.guardian_call(
        backends.hub.ListLedger,
        guardian_pb2.ListLedgerRequest(
            header=backends.header,
            party=own_party(backends, party) or "",
            round_id=round_id or 0,
            limit=limit,
            offset=offset,
        ),
    )
    # An export read on its own must carry the delta its numbers are at.
    status = backends.list_parties()
    named = {e.party for e in reply.entries}
    shown = [p for p in status.parties if p.name in named]
    return schemas.LedgerPage(
        entries=[schemas.LedgerEntryOut(**fields(e)) for e in reply.entries],
        limit=limit,
        offset=offset,
        ledger_delta=status.delta,
        rounds_asked={p.name: p.rounds_asked for p in shown},
        full_delta={p.name: p.full_delta for p in shown},
    )
