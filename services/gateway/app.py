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

import io
import json
import math
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, FastAPI, File, Form, HTTPException, Path, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common import serde
from services.common.limits import (
    DEFAULT_BATCH,
    DEFAULT_LIST_PAGE,
    GATEWAY_REQUESTS_PER_MINUTE,
    HEALTHZ_REQUESTS_PER_MINUTE,
    MAX_LIST_PAGE,
    MAX_TENSOR_BYTES,
    MAX_UPLOAD_BYTES,
    MAX_UPLOADS_IN_FLIGHT_BYTES,
    RESULTS_PAGE,
)
from services.common.protocol import WHO_MAY_RECORD, RequestError
from services.gateway import schemas
from services.gateway.backends import BackendError, Backends, HealthCache
from services.gateway.datasets import DatasetError, DatasetTooLargeError, parse_dataset
from services.gateway.from_proto import (
    fields,
    job_out,
    loop_out,
    model_out,
    party_out,
    privacy_audit_out,
)
from services.gateway.metrics import GatewayMetrics
from services.gateway.ratelimit import MemoryBudget, TokenBuckets
from services.gateway.tokens import Principal, Role, TokenError, TokenStore
from services.proto.capc.v1 import common_pb2, guardian_pb2, student_pb2

JOB_ID = Path(pattern=schemas.ID_PATTERN, description="a job or model id (UUID)")
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MECHANISM_OVERRIDE: TypeAdapter[dict[str, float]] = TypeAdapter(schemas.MechanismOverride)
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": schemas.ErrorOut} for code in (401, 403, 404, 409, 422, 429, 502, 503)
}
#: Seconds a request refused for the shared upload budget is told to wait: an upload
#: of the largest size is read and handed on in a few seconds.
UPLOAD_RETRY_S = 5
#: Copies of an upload's queries, at their float32 size, that parsing and sending
#: hold beside its body (see upload_job); reserved from the same budget.
UPLOAD_COPIES = 3


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes with 413, and any body that would take
    ``budget`` (shared by every request in flight) past its limit with 503 and
    Retry-After, both before they are buffered. Bytes are reserved as they arrive, chunk
    by chunk, and held until the response is sent, so the budget may over-count a
    request that stopped early, never under-count. A declared Content-Length is not
    reserved (a connection declaring the largest body and sending nothing, no token
    needed, would hold the budget for nothing): it is refused early when it does not
    fit the room left now.
    """

    def __init__(self, app: ASGIApp, limit: int, budget: MemoryBudget) -> None:
        self.app, self.limit, self.budget = app, limit, budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        length = headers.get(b"content-length")
        declared = int(length) if length is not None and length.isdigit() else None
        if declared is not None and declared > self.limit:
            await self._refuse(send, 413, self._too_large())
            return
        if declared and self.budget.held + declared > self.budget.limit:
            await self._refuse(send, 503, self._busy(declared))
            return
        held = 0
        seen = 0
        started = False
        # Set when this middleware refuses the body midway: the app may turn the
        # exception into an error of its own (a form parser's 400), which is replaced.
        refusal: tuple[int, str] | None = None

        async def counted() -> Message:
            nonlocal seen, held, refusal
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    refusal = (413, self._too_large())
                    raise _RefusedError
                if seen > held:
                    if not self.budget.take(seen - held):
                        refusal = (503, self._busy(seen - held))
                        raise _RefusedError
                    held = seen
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if refusal is not None:
                if not started:
                    started = True
                    await self._refuse(send, *refusal)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _RefusedError:
            if not started and refusal is not None:
                started = True
                await self._refuse(send, *refusal)
        finally:
            self.budget.give(held)

    def _too_large(self) -> str:
        return (
            f"request body exceeds the gateway's limit of {self.limit} bytes; "
            "split the dataset into several jobs"
        )

    def _busy(self, wanted: int) -> str:
        return busy_detail(self.budget, wanted)

    async def _refuse(self, send: Send, status: int, detail: str) -> None:
        headers = [(b"content-type", b"application/json")]
        if status == 503:
            headers.append((b"retry-after", str(UPLOAD_RETRY_S).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps({"detail": detail}).encode()})


class _UploadsBusyError(Exception):
    """An upload's parsed queries do not fit the shared budget beside the others."""


def busy_detail(budget: MemoryBudget, wanted: int) -> str:
    """What a request refused for the shared upload budget is told."""
    return (
        f"the gateway holds {budget.held} bytes of other uploads and takes at most "
        f"{budget.limit} bytes at once (--max-uploads-mb); this request needs {wanted} more. "
        f"Retry in {UPLOAD_RETRY_S} s, or ask the gateway's operator for a larger "
        "--max-uploads-mb"
    )


class _RefusedError(Exception):
    """BodyLimit refused the body it was reading; its response is already chosen."""


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


Analyst = Annotated[Principal, Depends(needs(Role.ANALYST))]
Admin = Annotated[Principal, Depends(needs(Role.ADMIN))]
Scraper = Annotated[Principal, Depends(needs(Role.METRICS))]


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
    metrics = GatewayMetrics(backends, clock)
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
    health = HealthCache(backends, clock=clock)
    probes = TokenBuckets(healthz_per_minute, clock)
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

    # -- health, metrics, dashboard --------------------------------------------------
    @app.get(
        "/healthz",
        response_model=schemas.Health,
        responses={429: {"model": schemas.ErrorOut}},
        tags=["operations"],
        summary="The backends' health, as last read (at most once per few seconds)",
    )
    def healthz(request: Request, response: Response) -> schemas.Health:
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

    @app.get(
        "/metrics",
        tags=["operations"],
        response_class=Response,
        responses={
            **{code: ERRORS[code] for code in (401, 403, 429)},
            200: {"description": "Prometheus text format", "content": {"text/plain": {}}},
        },
        summary="Prometheus metrics (a metrics or admin token)",
    )
    def prometheus(_: Scraper) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    static = resources.files("services.gateway") / "static"

    @app.get("/dashboard", response_class=HTMLResponse, tags=["operations"])
    def dashboard() -> HTMLResponse:
        return HTMLResponse((static / "dashboard.html").read_text())

    @app.get("/dashboard.js", tags=["operations"], response_class=Response)
    def dashboard_js() -> Response:
        return Response((static / "dashboard.js").read_text(), media_type="text/javascript")

    # -- jobs ------------------------------------------------------------------------
    def _create(
        queries: common_pb2.QueryBatch, count: int, batch: int, mech: Any, reveal: bool = False
    ) -> Any:
        request = student_pb2.CreateJobRequest(
            header=backends.header,
            queries=queries,
            count=count,
            batch_size=batch,
            reveal_records_to_answerers=reveal,
        )
        if mech is not None:
            request.mechanism.CopyFrom(mech)
        return job_out(backends.student_call(backends.jobs.CreateJob, request))

    @app.post(
        "/v1/jobs",
        status_code=201,
        response_model=schemas.JobOut,
        responses=ERRORS,
        tags=["jobs"],
        summary="Label programmatic queries",
    )
    def create_job(body: schemas.JobCreate, _: Analyst) -> schemas.JobOut:
        recipe = common_pb2.Recipe(
            generator=body.recipe.generator or "",
            params_json=json.dumps(body.recipe.params, sort_keys=True),
            seed=body.recipe.seed,
            start=body.recipe.start,
            count=body.count,
        )
        # No shape: the student fills in its task's input shape.
        result: schemas.JobOut = _create(
            common_pb2.QueryBatch(recipe=recipe),
            body.count,
            body.batch_size,
            serde.overrides_to_proto(body.mechanism),
        )
        return result

    @app.post(
        "/v1/jobs/upload",
        status_code=201,
        response_model=schemas.JobOut,
        responses={**ERRORS, 413: {"model": schemas.ErrorOut}},
        tags=["jobs"],
        summary="Label an uploaded unlabelled dataset",
    )
    async def upload_job(
        _: Analyst,
        file: Annotated[UploadFile, File(description=parse_dataset.__doc__ or "")],
        batch_size: Annotated[schemas.BatchSize, Form()] = DEFAULT_BATCH,
        reveal_records_to_answerers: Annotated[
            bool,
            Form(
                description="the file holds the querying hospital's own records: send them "
                "to the answering hospitals in the clear (audited by the guardian). A "
                "hospital's student party refuses its records in a plaintext task without it"
            ),
        ] = False,
        mechanism: Annotated[
            str | None,
            Form(
                max_length=1024,
                description='JSON object of mechanism overrides, e.g. {"sigma": 2.0}',
            ),
        ] = None,
    ) -> schemas.JobOut:
        try:
            overrides = MECHANISM_OVERRIDE.validate_json(mechanism) if mechanism else None
        except ValidationError as err:
            raise HTTPException(422, f"mechanism: {err.errors()[0]['msg']}") from None
        budget: MemoryBudget = app.state.uploads
        taken = body = 0

        def reserve(float32_bytes: int) -> None:
            # What parsing and sending hold beside the body: the inflated array (at most
            # its float32 size), its float32 copy and the message's copy of that.
            nonlocal taken
            wanted = UPLOAD_COPIES * float32_bytes
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
            x = await run_in_threadpool(parse_dataset, data, MAX_TENSOR_BYTES, reserve)
            tensor = serde.queries_to_proto(x)
            result: schemas.JobOut = await run_in_threadpool(
                _create,
                common_pb2.QueryBatch(tensor=tensor),
                len(x),
                batch_size,
                serde.overrides_to_proto(overrides),
                reveal_records_to_answerers,
            )
            return result
        except DatasetTooLargeError as err:
            raise HTTPException(413, str(err)) from None
        except DatasetError as err:
            raise HTTPException(422, str(err)) from None
        except _UploadsBusyError as err:
            raise HTTPException(
                503, str(err), headers={"Retry-After": str(UPLOAD_RETRY_S)}
            ) from None
        finally:
            budget.give(taken)

    @app.get("/v1/jobs", response_model=schemas.JobList, responses=ERRORS, tags=["jobs"])
    def list_jobs(
        _: Analyst,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST_PAGE)] = DEFAULT_LIST_PAGE,
        offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    ) -> schemas.JobList:
        reply = backends.list_jobs(limit, offset)
        return schemas.JobList(jobs=[job_out(j) for j in reply.jobs], limit=limit, offset=offset)

    @app.get("/v1/jobs/{job_id}", response_model=schemas.JobOut, responses=ERRORS, tags=["jobs"])
    def get_job(job_id: Annotated[str, JOB_ID], _: Analyst) -> schemas.JobOut:
        return job_out(
            backends.student_call(
                backends.jobs.GetJob, student_pb2.WatchJobRequest(header=backends.header, id=job_id)
            )
        )

    def _results(job_id: str) -> tuple[student_pb2.Job, np.ndarray, np.ndarray]:
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

    @app.get(
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
        format: Annotated[str, Query(pattern="^(npz|json)$")] = "npz",
    ) -> Response:
        job, x, y = _results(job_id)
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

    # -- student models ------------------------------------------------------------------
    @app.post(
        "/v1/models",
        status_code=201,
        response_model=schemas.ModelOut,
        responses=ERRORS,
        tags=["models"],
        summary="Train a student model on the labels of finished jobs",
    )
    def train_model(body: schemas.ModelCreate, _: Analyst) -> schemas.ModelOut:
        model = backends.student_call(
            backends.jobs.TrainModel,
            student_pb2.TrainModelRequest(
                header=backends.header,
                job_ids=body.job_ids,
                architecture=body.architecture or "",
                epochs=body.epochs,
                seed=body.seed,
                l2=body.l2 or 0.0,
                semi_supervised=body.semi_supervised,
            ),
        )
        return model_out(model)

    @app.get(
        "/v1/loop",
        response_model=schemas.LoopOut,
        responses=ERRORS,
        tags=["models"],
        summary="The CaPC loop: the hospital's model before and after, and what it cost",
    )
    def loop(_: Analyst) -> schemas.LoopOut:
        report = backends.student_call(
            backends.jobs.GetLoop, student_pb2.GetLoopRequest(header=backends.header)
        )
        return loop_out(report, backends.querier_spends(report.querier))

    @app.get("/v1/models", response_model=schemas.ModelList, responses=ERRORS, tags=["models"])
    def list_models(_: Analyst) -> schemas.ModelList:
        reply = backends.student_call(
            backends.jobs.ListModels, student_pb2.ListModelsRequest(header=backends.header)
        )
        return schemas.ModelList(models=[model_out(m) for m in reply.models])

    @app.get(
        "/v1/models/{model_id}", response_model=schemas.ModelOut, responses=ERRORS, tags=["models"]
    )
    def get_model(model_id: Annotated[str, JOB_ID], _: Analyst) -> schemas.ModelOut:
        return model_out(
            backends.student_call(
                backends.jobs.GetModel,
                student_pb2.GetModelRequest(header=backends.header, id=model_id),
            )
        )

    def _model_file(model_id: str) -> student_pb2.ModelFile:
        reply: student_pb2.ModelFile = backends.student_call(
            backends.jobs.DownloadModel,
            student_pb2.GetModelRequest(header=backends.header, id=model_id),
        )
        return reply

    @app.get(
        "/v1/models/{model_id}/weights",
        responses={
            **ERRORS,
            200: {
                "description": "the checkpoint: a torch state dict with its model card",
                "content": {"application/octet-stream": {}},
            },
        },
        tags=["models"],
        response_class=Response,
    )
    def model_weights(model_id: Annotated[str, JOB_ID], _: Analyst) -> Response:
        f = _model_file(model_id)
        return Response(
            f.checkpoint,
            media_type="application/octet-stream",
            headers={"Content-Disposition": f'attachment; filename="capc-student-{model_id}.pt"'},
        )

    @app.post(
        "/v1/models/{model_id}/predict",
        response_model=schemas.PredictOut,
        responses={**ERRORS, 413: {"model": schemas.ErrorOut}},
        tags=["models"],
        summary="Predict one or many records with a trained student model",
        description="Each record's prediction depends on that record alone: a batch of one "
        "is predicted exactly as it would be among others (a current-statistics model reads "
        "the stored statistics of its reference batch).",
    )
    def predict(
        model_id: Annotated[str, JOB_ID], body: schemas.PredictIn, _: Analyst
    ) -> schemas.PredictOut:
        try:
            records = np.asarray(body.records, dtype=np.float32)
        except (ValueError, TypeError):
            raise HTTPException(
                422,
                "records: every record must be a nested list of numbers of the task's input "
                "shape, all records of the same shape",
            ) from None
        if records.ndim < 2 or records.dtype == object:
            raise HTTPException(
                422, "records: a list of records, each of the task's input shape (at least 1-D)"
            )
        reply = backends.student_call(
            backends.jobs.Predict,
            student_pb2.PredictRequest(
                header=backends.header, id=model_id, records=serde.queries_to_proto(records)
            ),
        )
        try:
            labels = serde.labels_from_proto(reply.labels)
            scores = serde.tensor_from_proto(reply.scores, "float32", "scores")
        except RequestError as err:
            raise BackendError("student party", None, f"a malformed prediction: {err}") from None
        return schemas.PredictOut(model=reply.id, labels=labels.tolist(), scores=scores.tolist())

    @app.get("/v1/models/{model_id}/card", responses=ERRORS, tags=["models"])
    def model_card(model_id: Annotated[str, JOB_ID], _: Analyst) -> dict[str, Any]:
        card: dict[str, Any] = json.loads(_model_file(model_id).card_json)
        return card

    # -- admin ---------------------------------------------------------------------
    @app.get(
        "/v1/admin/parties", response_model=schemas.PartyList, responses=ERRORS, tags=["admin"]
    )
    def parties(_: Admin) -> schemas.PartyList:
        reply = backends.list_parties()
        return schemas.PartyList(
            parties=[party_out(p, reply.delta) for p in reply.parties],
            delta=reply.delta,
            accounting=reply.accounting,
        )

    @app.get(
        "/v1/admin/budgets", response_model=schemas.BudgetList, responses=ERRORS, tags=["admin"]
    )
    def budgets(_: Admin) -> schemas.BudgetList:
        reply = backends.list_parties()
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
                if p.role == "answerer"
            ],
        )

    @app.get(
        "/v1/admin/budgets/history",
        response_model=schemas.History,
        responses=ERRORS,
        tags=["admin"],
        summary="Each party's epsilon after every ledger entry, for charts",
    )
    def history(
        _: Admin,
        party: Annotated[str | None, Query(pattern=NAME)] = None,
        max_points: Annotated[int, Query(ge=1, le=10_000)] = 500,
    ) -> schemas.History:
        reply = backends.guardian_call(
            backends.hub.BudgetHistory,
            guardian_pb2.BudgetHistoryRequest(
                header=backends.header, party=party or "", max_points=max_points
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

    @app.get(
        "/v1/admin/ledger", response_model=schemas.LedgerPage, responses=ERRORS, tags=["admin"]
    )
    def ledger(
        _: Admin,
        party: Annotated[str | None, Query(pattern=NAME)] = None,
        round_id: Annotated[int | None, Query(ge=1, le=2**62)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST_PAGE)] = DEFAULT_LIST_PAGE,
        offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    ) -> schemas.LedgerPage:
        reply = backends.guardian_call(
            backends.hub.ListLedger,
            guardian_pb2.ListLedgerRequest(
                header=backends.header,
                party=party or "",
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

    @app.get("/v1/admin/audit", response_model=schemas.AuditPage, responses=ERRORS, tags=["admin"])
    def audit(
        _: Admin,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST_PAGE)] = DEFAULT_LIST_PAGE,
        offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    ) -> schemas.AuditPage:
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

    @app.get(
        "/v1/admin/privacy-audits",
        response_model=schemas.PrivacyAuditList,
        responses=ERRORS,
        tags=["admin"],
        summary="Empirical privacy audits (canary attacks) beside each party's claimed epsilon",
    )
    def privacy_audits(
        _: Admin,
        party: Annotated[str | None, Query(pattern=NAME)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST_PAGE)] = DEFAULT_LIST_PAGE,
    ) -> schemas.PrivacyAuditList:
        reply = backends.guardian_call(
            backends.hub.ListPrivacyAudits,
            guardian_pb2.ListPrivacyAuditsRequest(
                header=backends.header, party=party or "", limit=limit
            ),
        )
        return schemas.PrivacyAuditList(audits=[privacy_audit_out(a) for a in reply.audits])

    @app.post(
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

    return app
