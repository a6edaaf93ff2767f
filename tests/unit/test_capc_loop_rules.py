"""The CaPC loop's rules, without processes: the guardian's binding and audit, the
student party's refusal of clear records, and the gateway's report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from capc.privacy.events import GaussianEvent
from capc.round.errors import RoundRequestError
from capc.task_config import TaskConfig, config_hash
from services.common.ledger import Ledger
from services.gateway.replies import loop_out
from services.guardian.loop import (
    ALLOW,
    REFUSE,
    bind_querier,
    declare_outside,
    hospital_of,
    is_outside,
    keep_clear_policy,
    parse_querier,
    terms_for,
)
from services.proto.capc.v1 import common_pb2, guardian_pb2, student_pb2
from services.student.loop import LoopIdentity, clear_records_refusal

TASK = {"num_classes": 10, "input_shape": [1, 8, 8], "mechanism": {"name": "gnmax", "sigma": 2.0}}


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger(f"sqlite:///{tmp_path / 'g.db'}")
    for name in ("h0", "h1", "h2"):
        ledger.register_party(name, 10.0, teachers=1, actor="test")
    bind_querier(ledger, "h0-querier", "h0", actor="test")
    return ledger


def test_a_binding_to_a_party_no_one_registered_is_refused(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'g.db'}")
    ledger.register_party("hospital-0", 10.0, teachers=1, actor="test")
    # A case or spacing slip would bind to nobody, and hospital-0 would vote on its own queries.
    with pytest.raises(ValueError, match="'Hospital-0' is no registered answering party"):
        bind_querier(ledger, "hospital-0-querier", "Hospital-0", actor="test")
    with pytest.raises(ValueError, match="no leading or trailing spaces"):
        parse_querier("hospital-0-querier=hospital-0 ")
    bind_querier(ledger, "hospital-0-querier", "hospital-0", actor="test")


def request(
    source: str, *, hospital: str = "", reveal: bool = False
) -> guardian_pb2.OpenRoundRequest:
    if source == "tensor":
        queries = common_pb2.QueryBatch(tensor=common_pb2.Tensor(shape=[2, 1, 8, 8]))
    else:
        queries = common_pb2.QueryBatch(recipe=common_pb2.Recipe(generator="gaussian", count=2))
    return guardian_pb2.OpenRoundRequest(queries=queries, hospital=hospital, reveal_records=reveal)


def test_parse_querier_says_what_to_write() -> None:
    assert parse_querier("h0-querier=h0") == ("h0-querier", "h0")
    for bad in ("h0-querier", "=h0", "h0-querier=", "h0=h0"):
        with pytest.raises(ValueError, match="--querier"):
            parse_querier(bad)


def test_a_bound_querier_always_leaves_its_hospital_out(ledger: Ledger) -> None:
    assert hospital_of(ledger, "h0-querier") == "h0"
    terms = terms_for(ledger, "h0-querier", request("recipe"), 2)
    assert terms.left_out == {"h0"} and terms.disclosure is None
    assert terms_for(ledger, "other", request("recipe"), 2).left_out == frozenset()
    bindings = [e for e in ledger.audit_entries() if e.action == "bind_querier"]
    assert bindings[0].detail["hospital"] == "h0"


def test_a_claim_that_differs_from_the_binding_is_refused(ledger: Ledger) -> None:
    with pytest.raises(RoundRequestError, match="bound it to h0"):
        terms_for(ledger, "h0-querier", request("recipe", hospital="h1"), 2)
    with pytest.raises(RoundRequestError, match="--querier other=h1"):
        terms_for(ledger, "other", request("recipe", hospital="h1"), 2)


def test_clear_records_need_the_choice_and_are_disclosed(ledger: Ledger) -> None:
    with pytest.raises(RoundRequestError, match="reveal_records"):
        terms_for(ledger, "h0-querier", request("tensor"), 2)
    terms = terms_for(ledger, "h0-querier", request("tensor", reveal=True), 2)
    assert terms.disclosure == {"querier": "h0-querier", "hospital": "h0", "records": 2}


def test_the_disclosure_is_audited_with_the_reservation(ledger: Ledger) -> None:
    ledger.create_task("t", TASK, actor="test")
    ledger.register_party("h1", 100.0)
    disclosure = {"querier": "h0-querier", "hospital": "h0", "records": 2}
    res = ledger.reserve(
        "k1",
        "t",
        "h0-querier",
        2,
        {"h1": GaussianEvent(1.0, 2.0)},
        mechanism="gnmax",
        quorum=1,
        disclosure=disclosure,
    )
    entry = next(e for e in ledger.audit_entries() if e.action == "clear_records")
    assert entry.actor == "h0-querier"
    assert entry.detail == {"round": res.round_id, **disclosure}
    ledger.verify_audit()


def test_a_new_consortium_refuses_clear_records_no_binding_covers(ledger: Ledger) -> None:
    """The attack: a hospital's querier that claims no hospital. Before, its records went
    to every hospital in the clear, its own hospital voting, and nothing was audited."""
    assert keep_clear_policy(ledger, None, fresh=True, actor="test") == REFUSE
    with pytest.raises(RoundRequestError, match=r"no binding covers it.*--outside-querier h0-spy"):
        terms_for(ledger, "h0-spy", request("tensor"), 2)
    with pytest.raises(RoundRequestError, match="no binding covers it"):
        terms_for(ledger, "h0-spy", request("tensor", reveal=True), 2)
    # Synthetic queries are no one's records.
    assert terms_for(ledger, "h0-spy", request("recipe"), 2).disclosure is None
    # A student the operator declared outside sends its records, each round audited.
    declare_outside(ledger, "student", actor="test")
    assert is_outside(ledger, "student") and hospital_of(ledger, "student") is None
    terms = terms_for(ledger, "student", request("tensor"), 2)
    assert terms.left_out == frozenset()
    assert terms.disclosure == {
        "querier": "student",
        "hospital": None,
        "records": 2,
        "outside": True,
    }
    with pytest.raises(RoundRequestError, match="outside the consortium"):
        terms_for(ledger, "student", request("recipe", hospital="h1"), 2)
    # The bound querier's rules are unchanged.
    with pytest.raises(RoundRequestError, match="reveal_records"):
        terms_for(ledger, "h0-querier", request("tensor"), 2)
    policy = [e for e in ledger.audit_entries() if e.action == "clear_records_policy"]
    assert policy[0].detail["policy"] == "refuse"
    with pytest.raises(ValueError, match="registered answering party"):
        declare_outside(ledger, "h1", actor="test")


def test_an_older_ledger_keeps_allowing_until_the_operator_says(ledger: Ledger) -> None:
    assert keep_clear_policy(ledger, None, fresh=False, actor="test") == ALLOW
    assert terms_for(ledger, "other", request("tensor"), 2).disclosure is None
    # Kept: a later start without the option does not change it, an explicit one does.
    assert keep_clear_policy(ledger, None, fresh=True, actor="test") == ALLOW
    assert keep_clear_policy(ledger, REFUSE, fresh=False, actor="test") == REFUSE
    with pytest.raises(RoundRequestError, match="no binding covers it"):
        terms_for(ledger, "other", request("tensor"), 2)


def test_a_hospitals_student_party_refuses_clear_records_without_the_choice() -> None:
    task = TaskConfig.parse("t", TASK, config_hash(TASK))
    hospital = LoopIdentity("h0", "h0-querier")
    refusal = clear_records_refusal(hospital, task, "tensor", False)
    assert refusal is not None and "reveal_records_to_answerers" in refusal
    assert "encrypted" in refusal
    assert clear_records_refusal(hospital, task, "tensor", True) is None
    assert clear_records_refusal(hospital, task, "recipe", False) is None
    assert clear_records_refusal(LoopIdentity("", "student"), task, "tensor", False) is None


def test_the_gateway_reports_the_gain_and_the_spend() -> None:
    def model(i: str, jobs: list[str], acc: float) -> student_pb2.StudentModel:
        metrics = json.dumps({"test_accuracy": acc})
        return student_pb2.StudentModel(id=i, state="done", job_ids=jobs, metrics_json=metrics)

    report = student_pb2.LoopReport(
        hospital="h0",
        querier="h0-querier",
        before=model("m1", [], 0.3),
        after=model("m2", ["j"], 0.6),
        labels_bought=600,
        records_revealed=600,
        jobs=1,
    )
    spends = guardian_pb2.ListPartiesReply(querier_hospital="h0")
    spends.querier_epsilon.update({"h0": 0.0, "h1": 2.5, "h2": 3.0})
    out = loop_out(report, spends)
    assert out.gain == pytest.approx(0.3)
    assert out.epsilon_by_party == {"h1": 2.5, "h2": 3.0} and out.epsilon_spent == 3.0
    assert out.bound_hospital == "h0" and out.labels_bought == 600
    empty = loop_out(student_pb2.LoopReport(), guardian_pb2.ListPartiesReply())
    assert empty.before is None and empty.gain is None and empty.epsilon_spent == 0.0
    assert np.isfinite(out.accuracy_after or np.nan)


def test_the_admin_sees_every_loop_the_guardian_bound(ledger: Ledger) -> None:
    """Issue 56: the consortium's dashboard had no loop row. The guardian lists every
    bound querier, and the gateway's /v1/admin/loops reads each one's spends from it."""
    from services.gateway.routes.models import loop_spends
    from services.guardian.hub import GuardianHub
    from services.guardian.loop import bound_queriers

    # A name with SQL LIKE's wildcards: matched as written, not as a pattern.
    bind_querier(ledger, "h1_q%", "h1", actor="test")
    ledger.keep_setting("querier-hospitalX", "h2", actor="test", action="test", detail={})
    assert bound_queriers(ledger) == {"h0-querier": "h0", "h1_q%": "h1"}
    hub = GuardianHub(ledger)
    header = common_pb2.Header(protocol_version=2)

    class ToTheHub:
        """The gateway's two guardian reads, answered by the real hub in process."""

        def list_parties(self) -> guardian_pb2.ListPartiesReply:
            return hub.ListParties(guardian_pb2.ListPartiesRequest(header=header), None)  # type: ignore[arg-type]

        def querier_spends(self, querier: str) -> guardian_pb2.ListPartiesReply:
            request = guardian_pb2.ListPartiesRequest(header=header, querier=querier)
            return hub.ListParties(request, None)  # type: ignore[arg-type]

    loops = loop_spends(ToTheHub())  # type: ignore[arg-type]
    assert [(x.hospital, x.querier) for x in loops] == [("h0", "h0-querier"), ("h1", "h1_q%")]
    assert all(x.epsilon_by_party == {} and x.epsilon_spent == 0.0 for x in loops)
    static = Path(__file__).resolve().parents[2] / "services" / "gateway" / "static"
    assert "/v1/admin/loops" in (static / "dashboard.js").read_text()
    assert 'id="loops"' in (static / "dashboard.html").read_text()
