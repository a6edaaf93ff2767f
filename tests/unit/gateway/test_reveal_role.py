"""Revealing a hospital's records to the answering hospitals is an admin's choice, and
the name of who made it travels to the student party, into every round it opens, and
into the guardian's audit entry. Before, any analyst token could set it, and the audit
named only the querier's certificate."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from fastapi.testclient import TestClient

from capc.round.messages import QueryBatch, RoundRequest
from services.common import serde
from services.common.ledger import Ledger
from services.gateway.app import create_app
from services.gateway.backends import Backends
from services.gateway.tokens import TokenStore
from services.guardian.loop import bind_querier, terms_for
from services.proto.capc.v1 import common_pb2, student_pb2
from services.student.store import JobStore

T = TypeVar("T")


class Recording(Backends):
    """The gateway's backends, keeping each CreateJob the student party would get (the
    student party itself is not running; nothing else is called)."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1:1", "127.0.0.1:1", None)
        self.created: list[student_pb2.CreateJobRequest] = []

    def student_call(self, fn: Callable[..., T], request: object) -> T:
        assert isinstance(request, student_pb2.CreateJobRequest)
        self.created.append(request)
        job = student_pb2.Job(id="j1", state="queued", requested=request.count)
        return job  # type: ignore[return-value]


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[TestClient, Recording, dict[str, dict[str, str]]]]:
    tokens = TokenStore(str(tmp_path / "t.db"))
    auth = {}
    for role in ("analyst", "admin"):
        secret, _ = tokens.create(role, f"dr-{role}")
        auth[role] = {"Authorization": f"Bearer {secret}"}
    backends = Recording()
    with TestClient(create_app(backends, tokens)) as c:
        yield c, backends, auth
    backends.close()


def records() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.zeros((4, 1, 28, 28), np.float32))
    return buf.getvalue()


def upload(c: TestClient, auth: dict[str, str], reveal: bool) -> Any:
    data = {"reveal_records_to_answerers": "true"} if reveal else {}
    files = {"file": ("own.npy", records())}
    return c.post("/v1/jobs/upload", headers=auth, files=files, data=data)


def test_an_analyst_cannot_reveal_records(
    gateway: tuple[TestClient, Recording, dict[str, dict[str, str]]],
) -> None:
    c, backends, auth = gateway
    r = upload(c, auth["analyst"], reveal=True)
    assert r.status_code == 403, r.text
    assert "needs the admin role" in r.json()["detail"] and "dr-analyst" in r.json()["detail"]
    assert backends.created == []  # refused before the student party hears of it
    # Unrevealed uploads stay an analyst's, and name nobody.
    assert upload(c, auth["analyst"], reveal=False).status_code == 201
    assert backends.created[-1].revealed_by == ""


def test_an_admins_choice_names_the_token_holder_down_to_the_guardians_audit(
    gateway: tuple[TestClient, Recording, dict[str, dict[str, str]]], tmp_path: Path
) -> None:
    c, backends, auth = gateway
    r = upload(c, auth["admin"], reveal=True)
    assert r.status_code == 201, r.text
    sent = backends.created[-1]
    assert sent.reveal_records_to_answerers
    who = sent.revealed_by
    assert who.startswith("gateway token ") and "(dr-admin, admin)" in who
    # The student party keeps it with the job ...
    store = JobStore(f"sqlite:///{tmp_path / 's.db'}")
    job = store.create("t", np.zeros((4, 2), np.float32), 2, revealed=True, revealed_by=who)
    again = store.get(job.id)
    assert again is not None and again.revealed and again.revealed_by == who
    assert store.jobs()[0].revealed_by == who
    # ... sends it with each round it opens ...
    request = serde.round_request_to_proto(
        RoundRequest("k", "h0-querier", QueryBatch("tensor", 4), b"\x00" * 32),
        common_pb2.Header(protocol_version=2),
        common_pb2.QueryBatch(tensor=common_pb2.Tensor(shape=[4, 2])),
        hospital="h0",
        reveal=True,
        revealed_by=again.revealed_by,
    )
    # ... and the guardian's audit entry of the clear records names the person.
    ledger = Ledger(f"sqlite:///{tmp_path / 'g.db'}")
    ledger.register_party("h0", 10.0, teachers=1, actor="test")
    bind_querier(ledger, "h0-querier", "h0", actor="test")
    terms = terms_for(ledger, "h0-querier", request, 4)
    assert terms.disclosure is not None and terms.disclosure["revealed_by"] == who
