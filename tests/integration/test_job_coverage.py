"""Issue 56: a job the answering hospitals' caps cannot cover in full is refused before it
spends anything, on the gateway's JSON and upload routes alike.

Before, only ``capcctl loop run`` checked, in the client: a raw REST upload of 450
records to a loop gateway ran 256 of them, failed with RESOURCE_EXHAUSTED and had charged
each other hospital 6.57 eps. Here the gateway runs in process over the real guardian
hub (a real ledger with caps) and the real student party servicer (its runner records
what it would run); nothing is spent either way.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast

import grpc
import numpy as np
import pytest
from fastapi.testclient import TestClient

from capc.task_config import TaskConfig, config_hash
from services.common import protocol
from services.common.ledger import Ledger
from services.gateway.app import create_app
from services.gateway.backends import BackendError, Backends
from services.gateway.coverage import Coverage, coverage, shortfall
from services.gateway.tokens import TokenStore
from services.guardian.hub import GuardianHub
from services.guardian.loop import bind_querier
from services.proto.capc.v1 import guardian_pb2, student_pb2
from services.student.loop import LoopIdentity
from services.student.servicer import JobRunner, StudentParty
from services.student.store import JobStore
from services.student.training import ModelTrainer

T = TypeVar("T")
SHAPE = (1, 4, 4)
TASK = {
    "num_classes": 3,
    "input_shape": list(SHAPE),
    "mechanism": {"name": "gnmax", "sigma": 40.0},
    "quorum": 2,
}
#: hospital-2's cap is the smallest: it sets what a loop of hospital-0's can buy.
CAPS = {"hospital-0": 10.0, "hospital-1": 10.0, "hospital-2": 2.0}


class AbortedError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code


class Context:
    """The one ServicerContext method the servicers use here."""

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise AbortedError(code, details)


class Runner:
    """The student party's job runner, recording what it would run (and so spend)."""

    def __init__(self) -> None:
        self.submitted: list[str] = []

    def submit(self, job_id: str) -> None:
        self.submitted.append(job_id)


class InProcess(Backends):
    """The gateway's backends with the student party's and the guardian hub's servicers
    called in this process."""

    def __init__(self, party: StudentParty, hub: GuardianHub) -> None:
        super().__init__("127.0.0.1:1", "127.0.0.1:1", None, task="t")
        self.party, self.hub_servicer = party, hub

    def call(self, service: str, fn: Callable[..., T], request: object) -> T:
        ctx = cast(grpc.ServicerContext, Context())
        try:
            if isinstance(request, student_pb2.CreateJobRequest):
                return cast(T, self.party.CreateJob(request, ctx))
            if isinstance(request, student_pb2.GetLoopRequest):
                return cast(T, self.party.GetLoop(request, ctx))
            if isinstance(request, student_pb2.ListJobsRequest):
                return cast(T, self.party.ListJobs(request, ctx))
            if isinstance(request, guardian_pb2.ListPartiesRequest):
                return cast(T, self.hub_servicer.ListParties(request, ctx))
        except AbortedError as err:
            raise BackendError(service, err.code, str(err)) from None
        raise NotImplementedError(type(request).__name__)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger(f"sqlite:///{tmp_path / 'g.db'}")
    ledger.create_task("t", TASK)
    for name, cap in CAPS.items():
        ledger.register_party(name, cap, teachers=1, actor="test")
    bind_querier(ledger, "hospital-0-querier", "hospital-0", actor="test")
    return ledger


def gateway(
    tmp_path: Path, ledger: Ledger, identity: LoopIdentity
) -> tuple[TestClient, Runner, dict[str, str]]:
    runner = Runner()
    task = TaskConfig.parse("t", TASK, config_hash(TASK))
    name = identity.querier or "student"
    store = JobStore(f"sqlite:///{tmp_path / f'jobs-{name}.db'}")
    party = StudentParty(store, cast(JobRunner, runner), task, cast(ModelTrainer, None), identity)
    tokens = TokenStore(str(tmp_path / "t.db"))
    secret, _ = tokens.create("admin", "dr-admin")
    client = TestClient(create_app(InProcess(party, GuardianHub(ledger)), tokens))
    return client, runner, {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def loop(tmp_path: Path, ledger: Ledger) -> Iterator[tuple[TestClient, Runner, dict[str, str]]]:
    c, runner, auth = gateway(tmp_path, ledger, LoopIdentity("hospital-0", "hospital-0-querier"))
    with c:
        yield c, runner, auth


def projected(ledger: Ledger) -> dict[str, int]:
    """Queries each party's cap covers, as the guardian projects them."""
    reply = GuardianHub(ledger).ListParties(
        guardian_pb2.ListPartiesRequest(header=protocol.header("t")),
        cast(grpc.ServicerContext, Context()),
    )
    return {p.name: int(p.queries_left) for p in reply.parties}


def upload(
    c: TestClient,
    auth: dict[str, str],
    n: int,
    partial: bool = False,
    mechanism: dict[str, float] | None = None,
) -> Any:
    buf = io.BytesIO()
    np.save(buf, np.zeros((n, *SHAPE), np.float32))
    data = {"reveal_records_to_answerers": "true"}
    if partial:
        data["allow_partial"] = "true"
    if mechanism is not None:
        data["mechanism"] = json.dumps(mechanism)
    return c.post(
        "/v1/jobs/upload", headers=auth, files={"file": ("own.npy", buf.getvalue())}, data=data
    )


def recipe(c: TestClient, auth: dict[str, str], n: int, **extra: Any) -> Any:
    body = {"recipe": {"generator": "gaussian"}, "count": n, **extra}
    return c.post("/v1/jobs", headers=auth, json=body)


def test_a_loop_upload_the_caps_cannot_finish_is_refused_before_it_spends(
    loop: tuple[TestClient, Runner, dict[str, str]], ledger: Ledger
) -> None:
    c, runner, auth = loop
    left = projected(ledger)
    # hospital-0 never answers its own loop: hospital-2 alone sets what it can buy.
    fit = left["hospital-2"]
    assert 0 < fit < left["hospital-1"] and fit < left["hospital-0"], left
    r = upload(c, auth, fit + 1)
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert f"asks for {fit + 1} queries" in detail and f"Submit at most {fit} queries" in detail
    assert "Nothing was spent" in detail and "--allow-partial" in detail
    assert f"hospital-2 {fit}" in detail and "hospital-0 " not in detail
    r = recipe(c, auth, fit + 1)
    assert r.status_code == 409 and f"at most {fit} queries" in r.json()["detail"]
    assert runner.submitted == []  # nothing was queued, so nothing was spent
    assert all(b.spent == 0 for b in ledger.budgets())
    # A job with mechanism overrides (more noise: cheaper per query) is checked at them,
    # not refused on the task's projection.
    assert recipe(c, auth, fit + 1, mechanism={"sigma": 80.0}).status_code == 201
    # That job is queued, still to spend: what the caps cover alone no longer fits beside
    # it (counted at the task's own, dearest mechanism), and the refusal says why.
    r = upload(c, auth, fit)
    assert r.status_code == 409 and "unfinished jobs will label" in r.json()["detail"]
    # A job that asks to stop where the caps end always runs.
    assert upload(c, auth, fit + 1, partial=True).status_code == 201
    assert recipe(c, auth, fit + 1, allow_partial=True).status_code == 201
    assert len(runner.submitted) == 3


def test_a_consortium_job_needs_a_quorum_not_every_hospital(tmp_path: Path, ledger: Ledger) -> None:
    """The consortium's own student party: a round needs 2 of the 3 hospitals, so a job
    runs to its end on the second-largest projection, however little the third has."""
    c, runner, auth = gateway(tmp_path, ledger, LoopIdentity("", ""))
    left = projected(ledger)
    second = sorted(left.values())[1]
    assert second > left["hospital-2"]
    with c:
        assert recipe(c, auth, second).status_code == 201
        r = recipe(c, auth, second + 1)
        assert r.status_code == 409, r.text
        assert f"Submit at most {second} queries" in r.json()["detail"]
    assert len(runner.submitted) == 1


def test_coverage_rules() -> None:
    reply = guardian_pb2.ListPartiesReply(quorum=2, querier_hospital="a")
    for name, left in (("a", 1000), ("b", 50), ("c", 7), ("d", -1)):
        reply.parties.add(name=name, role="answerer", queries_left=left)
    reply.parties.add(name="student", role="student", queries_left=-1)
    # d has no limit (DP-trained: charged nothing per answer); a is the loop's own.
    cover = coverage(reply)
    assert cover == Coverage(50, 2, {"b": 50, "c": 7, "d": None})
    assert shortfall(50, cover) is None and shortfall(51, cover) is not None
    reply.quorum = 4  # more than the three hospitals that answer
    few = coverage(reply)
    assert few.queries == 0
    assert "fewer than the task's quorum of 4" in (shortfall(1, few) or "")
    reply.quorum = 0  # no task in the request: a round needs one party
    assert coverage(reply).queries is None


def test_a_querier_allowance_below_the_caps_bounds_what_a_loop_job_may_ask(
    loop: tuple[TestClient, Runner, dict[str, str]], ledger: Ledger
) -> None:
    """A querier's allowance on each party (capc guardian --allowance) stops its rounds
    before the caps do: the pre-check read the caps alone, so a job the allowance cannot
    finish passed it, ran part way and left the answering hospitals charged."""
    c, runner, auth = loop
    fit = projected(ledger)["hospital-2"]
    ledger.set_allowance("hospital-0-querier", 0.5, actor="test")
    # What the allowance lets this querier's rounds buy of each party, as the ledger admits.
    task = TaskConfig.parse("t", TASK, config_hash(TASK))
    allowed = ledger.queries_fit(task.mechanism.worst_case(1, 1.0), 0.5)
    assert 0 < allowed < fit, (allowed, fit)
    r = recipe(c, auth, allowed + 1)
    assert r.status_code == 409, r.text
    assert f"Submit at most {allowed} queries" in r.json()["detail"]
    assert recipe(c, auth, allowed).status_code == 201
    assert len(runner.submitted) == 1


def test_a_mechanism_override_that_costs_about_as_much_is_still_checked(
    loop: tuple[TestClient, Runner, dict[str, str]], ledger: Ledger
) -> None:
    """A job with mechanism overrides skipped the pre-check: an override of a hair more
    noise ran a job twice what the caps cover, part way, with the hospitals charged. It
    is checked at the overridden mechanism."""
    c, runner, auth = loop
    fit = projected(ledger)["hospital-2"]
    # sigma 40.5 for the task's 40: each query costs (40 / 40.5)**2, about 0.975 of the
    # task's, so the caps cover about 2.5% more queries, never twice as many.
    r = recipe(c, auth, 2 * fit, mechanism={"sigma": 40.5})
    assert r.status_code == 409, r.text
    said = re.search(r"Submit at most (\d+) queries", r.json()["detail"])
    assert said is not None and fit < int(said.group(1)) < fit * 1.1, (fit, r.text)
    assert upload(c, auth, 2 * fit, mechanism={"sigma": 40.5}).status_code == 409
    assert runner.submitted == []
    # Twice the noise: a query costs a quarter, so twice the queries fit.
    assert recipe(c, auth, 2 * fit, mechanism={"sigma": 80.0}).status_code == 201


def test_jobs_queued_together_are_checked_together(
    loop: tuple[TestClient, Runner, dict[str, str]], ledger: Ledger
) -> None:
    c, runner, auth = loop
    fit = projected(ledger)["hospital-2"]
    assert recipe(c, auth, fit // 2).status_code == 201
    # The first job has spent nothing yet (queued): the caps still cover `fit` alone, but
    # after the first job's half the second would run half way and stop, charged.
    r = recipe(c, auth, fit)
    assert r.status_code == 409, r.text
    assert len(runner.submitted) == 1
