"""Labelling jobs: programmatic queries or an uploaded dataset in, labels out."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, File, Form, HTTPException, Query, UploadFile
from fastapi.responses import Response
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool

from services.common import serde
from services.common.limits import (
    DEFAULT_BATCH,
    DEFAULT_LIST_PAGE,
    MAX_LIST_PAGE,
    MAX_TENSOR_BYTES,
    RESULTS_PAGE,
)
from services.common.protocol import RequestError
from services.gateway import schemas
from services.gateway.backends import BackendError, Backends
from services.gateway.bodylimit import UPLOAD_RETRY_S, busy_detail
from services.gateway.coverage import coverage, shortfall
from services.gateway.datasets import DatasetError, DatasetTooLargeError, parse_dataset
from services.gateway.deps import ERRORS, JOB_ID, Analyst, Backend, Uploads
from services.gateway.replies import job_out
from services.gateway.tokens import Principal, Role
from services.proto.capc.v1 import common_pb2, student_pb2

MECHANISM_OVERRIDE: TypeAdapter[dict[str, float]] = TypeAdapter(schemas.MechanismOverride)

#: Copies of an upload's queries, at their float32 size, that parsing and sending
#: hold at once beside its body; reserved from the same budget. Parsing: the inflated
#: array (at most 8 bytes a value) and its float32 copy, at most 3. Building the request
#: (upload_request): the float32 array, its bytes and the request's copy of them, 3.
#: Sending: the request, its serialised bytes and gRPC's copy of those, 3 (the array
#: and its bytes are dropped before). Before, the tensor was copied into a QueryBatch
#: and again into the request while the array was still held: 6 and more, while 3
#: were reserved (eight uploads of 31 KiB once took 1.37 GiB under a 1 GiB budget).
UPLOAD_COPIES = 3
#: What one upload holds besides its body and queries (the form parser's, the
#: framework's and the thread pool's objects: under 100 KiB measured), reserved too.
UPLOAD_OVERHEAD = 256 * 1024


class _UploadsBusyError(Exception):
    """An upload's parsed queries do not fit the shared budget beside the others."""


router = APIRouter()
log = logging.getLogger(__name__)


#: Jobs still to spend: their remaining queries are counted before a new job's.
UNFINISHED = ("queued", "running")


def pending_queries(backends: Backends) -> int:
    """Queries the student party's unfinished jobs have still to label (pages of the
    jobs list until a page comes back short)."""
    pending, offset = 0, 0
    while True:
        page = backends.list_jobs(MAX_LIST_PAGE, offset).jobs
        pending += sum(
            max(0, int(j.requested) - int(j.processed)) for j in page if j.state in UNFINISHED
        )
        if len(page) < MAX_LIST_PAGE:
            return pending
        offset += len(page)


def refuse_uncovered(
    backends: Backends, count: int, overrides: Mapping[str, float] | None, partial: bool
) -> None:
    """409 when the answering hospitals' caps cannot cover a job of ``count`` queries
    (:mod:`services.gateway.coverage`) beside what the unfinished jobs still have to
    label, before it spends anything; nothing with ``partial``.

    The new job is projected at its mechanism ``overrides`` (only more noise or a higher
    threshold: cheaper per query), so one that fits at them is not refused. Unfinished
    jobs may run at the task's own mechanism, the dearest per query; so with any
    pending, the new job and the pending queries together must also fit at the task's
    mechanism (an upper bound on what they spend together: it may refuse a job that
    would just fit, never pass one that stops part way for want of cap)."""
    if partial:
        return
    try:
        spends = backends.job_spends(overrides)
        pending = pending_queries(backends)
        dearest = spends if not overrides or not pending else backends.job_spends(None)
    except BackendError as err:
        # Without the projection the job runs as far as the caps let it: the guardian
        # still refuses every round a party cannot afford, so nothing is overspent (and
        # overrides the task refuses are refused by the student party as well).
        log.warning("job not checked against the caps: %s", err)
        return
    why = shortfall(count, coverage(spends))
    if why is None and pending:
        why = shortfall(count, coverage(dearest), pending=pending)
    if why is not None:
        raise HTTPException(409, why)


def upload_request(
    backends: Backends,
    queries: list[np.ndarray],
    batch: int,
    overrides: Mapping[str, float] | None,
    reveal: bool,
    revealed_by: str,
) -> student_pb2.CreateJobRequest:
    """The CreateJob request of an upload's float32 ``queries`` (a one-element list the
    request takes the array out of, so that it is freed as soon as its bytes are made),
    the tensor written once, in place: no intermediate Tensor or QueryBatch copies."""
    request = student_pb2.CreateJobRequest(
        header=backends.header,
        batch_size=batch,
        reveal_records_to_answerers=reveal,
        revealed_by=revealed_by if reveal else "",
        mechanism_overrides=dict(overrides or {}),
    )
    x = np.ascontiguousarray(queries.pop(), dtype=np.float32)
    request.count = len(x)
    tensor = request.queries.tensor
    tensor.shape.extend(x.shape)
    tensor.dtype = "float32"
    data = x.tobytes()
    del x  # the array goes before the request copies its bytes
    tensor.data = data
    return request


def _send(backends: Backends, request: student_pb2.CreateJobRequest) -> Any:
    return job_out(backends.student_call(backends.jobs.CreateJob, request))


def holder(who: Principal) -> str:
    """How the guardian's audit names the token holder who chose to reveal records."""
    return f"gateway token {who.token_id} ({who.name}, {who.role.value})"


def _create(
    backends: Backends,
    queries: common_pb2.QueryBatch,
    count: int,
    batch: int,
    overrides: Mapping[str, float] | None,
    reveal: bool = False,
    revealed_by: str = "",
) -> Any:
    request = student_pb2.CreateJobRequest(
        header=backends.header,
        queries=queries,
        count=count,
        batch_size=batch,
        reveal_records_to_answerers=reveal,
        revealed_by=revealed_by if reveal else "",
        # The student party resolves them once, into the job's mechanism.
        mechanism_overrides=dict(overrides or {}),
    )
    return job_out(backends.student_call(backends.jobs.CreateJob, request))


@router.post(
    "/v1/jobs",
    status_code=201,
    response_model=schemas.JobOut,
    responses=ERRORS,
    tags=["jobs"],
    summary="Label programmatic queries",
)
def create_job(body: schemas.JobCreate, _: Analyst, backends: Backend) -> schemas.JobOut:
    refuse_uncovered(backends, body.count, body.mechanism, body.allow_partial)
    recipe = common_pb2.Recipe(
        generator=body.recipe.generator or "",
        params_json=json.dumps(body.recipe.params, sort_keys=True),
        seed=body.recipe.seed,
        start=body.recipe.start,
        count=body.count,
    )
    # No shape: the student fills in its task's input shape.
    result: schemas.JobOut = _create(
        backends,
        common_pb2.QueryBatch(recipe=recipe),
        body.count,
        body.batch_size,
        body.mechanism,
    )
    return result


@router.post(
    "/v1/jobs/upload",
    status_code=201,
    response_model=schemas.JobOut,
    responses={**ERRORS, 413: {"model": schemas.ErrorOut}},
    tags=["jobs"],
    summary="Label an uploaded unlabelled dataset",
)
async def upload_job(
    who: Analyst,
    backends: Backend,
    budget: Uploads,
    file: Annotated[UploadFile, File(description=parse_dataset.__doc__ or "")],
    batch_size: Annotated[schemas.BatchSize, Form()] = DEFAULT_BATCH,
    reveal_records_to_answerers: Annotated[
        bool,
        Form(
            description="the file holds the querying hospital's own records: send them "
            "to the answering hospitals in the clear (audited by the guardian, naming this "
            "token's holder). Needs an admin token. A hospital's student party refuses its "
            "records in a plaintext task without it"
        ),
    ] = False,
    mechanism: Annotated[
        str | None,
        Form(
            max_length=1024,
            description='JSON object of mechanism overrides, e.g. {"sigma": 2.0}',
        ),
    ] = None,
    allow_partial: Annotated[bool, Form(description=schemas.ALLOW_PARTIAL)] = False,
) -> schemas.JobOut:
    if reveal_records_to_answerers and not who.may(Role.ADMIN):
        # Showing patients' records to every answering hospital is the consortium's
        # gravest choice: not any analyst's, and the audit names who made it.
        raise HTTPException(
            403,
            f"reveal_records_to_answerers needs the admin role; token {who.token_id} "
            f"({who.name}) is {who.role.value}. Ask an admin, or leave the records "
            "unrevealed (an encrypted task sends them only as ciphertexts)",
        )
    try:
        overrides = MECHANISM_OVERRIDE.validate_json(mechanism) if mechanism else None
    except ValidationError as err:
        raise HTTPException(422, f"mechanism: {err.errors()[0]['msg']}") from None
    taken = body = 0

    def reserve(float32_bytes: int) -> None:
        # What parsing and sending hold at once beside the body (UPLOAD_COPIES), the
        # body's second copy, read out of the upload (the first is BodyLimit's), and the
        # request's own objects (UPLOAD_OVERHEAD).
        nonlocal taken
        wanted = UPLOAD_COPIES * float32_bytes + body + UPLOAD_OVERHEAD
        # The body itself is already held (BodyLimit): a request that cannot fit even
        # alone is too large, not early.
        if body + taken + wanted > budget.limit:
            raise DatasetTooLargeError(
                f"the upload's {float32_bytes} bytes of float32 queries take {wanted} bytes "
                f"to parse and send, beside its body, over the {budget.limit} bytes the "
                "gateway gives all uploads at once (--max-uploads-mb); split it into "
                "several jobs"
            )
        if not budget.take(wanted):
            raise _UploadsBusyError(busy_detail(budget, wanted))
        taken += wanted

    try:
        # Sized from its headers against what one job's message carries, before it is
        # inflated (integer uploads grow fourfold as float32); inflating is CPU work,
        # kept off the event loop that serves every other request.
        data = await file.read()
        body = len(data)
        queries = [await run_in_threadpool(parse_dataset, data, MAX_TENSOR_BYTES, reserve)]
        del data
        await run_in_threadpool(
            refuse_uncovered, backends, len(queries[0]), overrides, allow_partial
        )
        request = await run_in_threadpool(
            upload_request,
            backends,
            queries,
            batch_size,
            overrides,
            reveal_records_to_answerers,
            holder(who),
        )
        result: schemas.JobOut = await run_in_threadpool(_send, backends, request)
        return result
    except DatasetTooLargeError as err:
        raise HTTPException(413, str(err)) from None
    except DatasetError as err:
        raise HTTPException(422, str(err)) from None
    except _UploadsBusyError as err:
        raise HTTPException(503, str(err), headers={"Retry-After": str(UPLOAD_RETRY_S)}) from None
    finally:
        budget.give(taken)


@router.get("/v1/jobs", response_model=schemas.JobList, responses=ERRORS, tags=["jobs"])
def list_jobs(
    _: Analyst,
    backends: Backend,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_PAGE)] = DEFAULT_LIST_PAGE,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
) -> schemas.JobList:
    reply = backends.list_jobs(limit, offset)
    return schemas.JobList(jobs=[job_out(j) for j in reply.jobs], limit=limit, offset=offset)


@router.get("/v1/jobs/{job_id}", response_model=schemas.JobOut, responses=ERRORS, tags=["jobs"])
def get_job(job_id: Annotated[str, JOB_ID], _: Analyst, backends: Backend) -> schemas.JobOut:
    return job_out(
        backends.student_call(
            backends.jobs.GetJob, student_pb2.WatchJobRequest(header=backends.header, id=job_id)
        )
    )


def _results(backends: Backends, job_id: str) -> tuple[student_pb2.Job, np.ndarray, np.ndarray]:
    labels, queries, offset = [], [], 0
    while True:
        page = backends.student_call(
            backends.jobs.GetResults,
            student_pb2.GetResultsRequest(
                header=backends.header, id=job_id, offset=offset, limit=RESULTS_PAGE
            ),
        )
        n = int(page.labels.shape[0]) if page.labels.shape else 0
        if n:
            try:
                labels.append(serde.labels_from_proto(page.labels))
                queries.append(serde.tensor_from_proto(page.queries, "float32", "queries"))
            except RequestError as err:
                raise BackendError(
                    "student party", None, f"a malformed results page: {err}"
                ) from None
        offset += n
        if n == 0 or offset >= page.total:
            job = page.job
            break
    y = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
    x = np.concatenate(queries) if queries else np.zeros(0, dtype=np.float32)
    return job, x, y


@router.get(
    "/v1/jobs/{job_id}/results",
    responses={
        **ERRORS,
        200: {
            "description": "format=npz: an .npz with 'queries' and 'labels' (-1: not answered); "
            "format=json: the labels",
            # "model" puts LabelsOut in the components, so its $refs resolve.
            "model": schemas.LabelsOut,
            "content": {"application/octet-stream": {}},
        },
    },
    tags=["jobs"],
    summary="Download the labelled queries processed so far",
    response_class=Response,
)
def job_results(
    job_id: Annotated[str, JOB_ID],
    _: Analyst,
    backends: Backend,
    format: Annotated[str, Query(pattern="^(npz|json)$")] = "npz",
) -> Response:
    job, x, y = _results(backends, job_id)
    if format == "json":
        body = schemas.LabelsOut(job=job_out(job), labels=y.tolist())
        return Response(body.model_dump_json(), media_type="application/json")
    buf = io.BytesIO()
    np.savez(buf, queries=x, labels=y)
    return Response(
        buf.getvalue(),
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="capc-job-{job_id}.npz"'},
    )
