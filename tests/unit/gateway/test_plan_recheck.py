"""Issue 56: a plan re-checked whenever the teacher counts that register differ from it.
Only ``capc up`` re-checked, once at its start; a consortium started otherwise (capc
guardian, each hospital's own capc party) never did. The guardian now re-checks the task
against the counts its connected hospitals registered at every read of the parties, and
``capcctl budget`` (the gateway's budget list) shows its warnings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from services.common.ledger import Ledger
from services.gateway.app import create_app
from services.gateway.tokens import TokenStore
from services.guardian.hub import GuardianHub
from services.proto.capc.v1 import guardian_pb2
from tests.unit.gateway.test_hospital_scope import Context, ToTheHub

TASK = {
    "num_classes": 10,
    "input_shape": [1, 4, 4],
    "mechanism": {"name": "gnmax", "sigma": 8.0},
    "quorum": 2,
}


def test_the_guardian_rechecks_the_task_against_the_teachers_that_connect(
    tmp_path: Path,
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'g.db'}")
    ledger.create_task("t", TASK)
    for name in ("hospital-a", "hospital-b", "hospital-c"):
        ledger.register_party(name, 10.0, actor="test")
    hub = GuardianHub(ledger)

    def warnings() -> list[str]:
        request = guardian_pb2.ListPartiesRequest(header=ToTheHub(hub, "").header)
        return list(hub.ListParties(request, Context()).plan_warnings)  # type: ignore[arg-type]

    # Planned for 40 teachers each, and so they connect: nothing to say.
    links = {
        n: hub.engine.attach(n, teachers=40) for n in ("hospital-a", "hospital-b", "hospital-c")
    }
    assert warnings() == []
    # hospital-c brings one model of its own: the same epsilon for 1 of 81 votes, and a
    # round of the quorum's 2 may have 41 voters.
    hub.engine.detach(links["hospital-c"])
    hub.engine.attach("hospital-c", teachers=1)
    found = warnings()
    assert any("hospital-c (1 of 81 votes)" in w for w in found), found
    # capcctl budget reads them from the gateway's budget list.
    tokens = TokenStore(str(tmp_path / "t.db"))
    secret, _ = tokens.create("admin", "dr-admin")
    with TestClient(create_app(ToTheHub(hub, ""), tokens)) as c:
        body: Any = c.get("/v1/admin/budgets", headers={"Authorization": f"Bearer {secret}"})
        assert body.status_code == 200, body.text
        assert body.json()["plan_warnings"] == found
