"""Issue 56's loop budget path and displays, without a consortium: a loop the others'
caps cannot finish is refused before it spends; no display invites adding epsilon up
per label or per round; a labelled file's predictions are scored."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.gateway.replies import loop_out
from services.proto.capc.v1 import guardian_pb2, student_pb2

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients"))
from capc_client import cli as capcctl  # noqa: E402
from capc_client.models import (  # noqa: E402
    Budget,
    BudgetList,
    LedgerEntry,
    LedgerPage,
    Loop,
)


def _loop(queries_left: dict[str, int]) -> Loop:
    return Loop(
        hospital="hospital-0",
        querier="hospital-0-querier",
        bound_hospital="hospital-0",
        before=None,
        after=None,
        accuracy_before=None,
        accuracy_after=None,
        gain=None,
        labels_bought=0,
        records_revealed=0,
        jobs=0,
        epsilon_by_party={},
        epsilon_spent=0.0,
        queries_left=queries_left,
    )


def test_a_loop_the_caps_cannot_finish_is_refused_before_it_spends() -> None:
    # The case: 450 records against caps covering 256 stopped at 256/450.
    why = capcctl.loop_shortfall(_loop({"hospital-1": 300, "hospital-2": 256}), 450)
    assert why is not None
    assert "hospital-2" in why and "only 256" in why and "Nothing was spent" in why
    assert capcctl.loop_shortfall(_loop({"hospital-1": 300, "hospital-2": 256}), 256) is None
    assert "no record can be labelled" in str(capcctl.loop_shortfall(_loop({"h": 0}), 1))
    # A gateway that does not report what is left: the guardian's refusal stays the check.
    assert capcctl.loop_shortfall(_loop({}), 10**6) is None


def test_the_gateway_reports_what_the_answering_hospitals_have_left() -> None:
    spends = guardian_pb2.ListPartiesReply(
        parties=[
            guardian_pb2.PartyStatus(name="hospital-0", role="answerer", queries_left=5),
            guardian_pb2.PartyStatus(name="hospital-1", role="answerer", queries_left=300),
            guardian_pb2.PartyStatus(name="hospital-2", role="answerer", queries_left=256),
            guardian_pb2.PartyStatus(name="student", role="student", queries_left=-1),
        ],
        querier_hospital="hospital-0",
    )
    report = student_pb2.LoopReport(hospital="hospital-0", querier="hospital-0-querier")
    out = loop_out(report, spends)
    # The bound hospital never answers its own loop: its cap is not the loop's limit.
    assert out.queries_left == {"hospital-1": 300, "hospital-2": 256}


def test_no_display_divides_or_lists_epsilon_per_label_or_round(
    capsys: pytest.CaptureFixture[str],
) -> None:
    static = ROOT / "services" / "gateway" / "static"
    html = (static / "dashboard.html").read_text()
    js = (static / "dashboard.js").read_text()
    assert "per label" not in html
    assert "epsilon_spent / loop.labels_bought" not in js.replace("  ", " ")

    class Gateway:
        """What cmd_ledger reads: one party's two rounds, and its composed total."""

        def ledger(self, *_: Any) -> LedgerPage:
            entry = {"party": "hospital-1", "kind": "charge", "mechanism": "gnmax"}
            return LedgerPage(
                entries=[
                    LedgerEntry(
                        **entry,
                        round_id=i,
                        round_state="settled",
                        task="images",
                        queries=256,
                        epsilon_alone=2.2884,
                        at="now",
                    )
                    for i in (1, 2)
                ],
                limit=50,
                offset=0,
            )

        def budgets(self) -> BudgetList:
            budget = Budget(
                party="hospital-1",
                epsilon_cap=10.0,
                epsilon_spent=3.5,
                epsilon_remaining=6.5,
                delta=1e-5,
                best_order=0.0,
                accounting="gdp",
            )
            return BudgetList(task="images", delta=1e-5, accounting="gdp", budgets=[budget])

    args = argparse.Namespace(party=None, round=None, limit=50, offset=0, json=False)
    assert capcctl.cmd_ledger(Gateway(), args) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    # Two rounds of 2.2884 each compose to 3.5, not 4.5768: the per-round figure is gone
    # and the composed total is shown.
    assert "2.2884" not in out
    assert "hospital-1       eps 3.5000 of 10" in out and "not the sum of rounds" in out


def test_predictions_on_a_labelled_file_are_scored(tmp_path: Path) -> None:
    path = tmp_path / "labelled.npz"
    np.savez(path, x=np.zeros((4, 3), np.float32), y=np.array([0, 1, 1, 0]))
    truth = capcctl._true_labels(path)
    assert truth == [0, 1, 1, 0]
    assert capcctl.prediction_accuracy([0, 1, 0, 0], truth) == 0.75
    assert capcctl.prediction_accuracy([[0, 1], [1, 1]], [[0, 1], [1, 0]]) == 0.5
    unlabelled = tmp_path / "x.npz"
    np.savez(unlabelled, x=np.zeros((2, 3), np.float32))
    assert capcctl._true_labels(unlabelled) is None
    with pytest.raises(ValueError, match="2 predictions for 4"):
        capcctl.prediction_accuracy([0, 1], truth)


def test_a_demo_without_a_terminal_prints_no_address_of_a_stopped_consortium() -> None:
    from services.commands.demo import dashboard_line, will_serve

    def args(**kw: bool) -> argparse.Namespace:
        return argparse.Namespace(**{"serve": False, "no_serve": False, "json": False, **kw})

    assert not will_serve(args(), terminal=False)
    assert not will_serve(args(json=True), terminal=True)
    assert will_serve(args(), terminal=True) and will_serve(args(serve=True), terminal=False)
    url = "https://127.0.0.1:8443/dashboard"
    assert url in dashboard_line(url, serving=True)
    stopped = dashboard_line(url, serving=False)
    assert "https://" not in stopped and "--serve" in stopped


def test_a_pending_own_ledger_report_is_not_shown_as_a_plain_agreement() -> None:
    from capc_client.models import PartyLedger

    # Issue 56: right after a round, "own ledger: agree (eps 0.0000, gap 0)" stood beside
    # a guardian spend of 6.5730. The hospital had not yet reported that round: the two
    # agreed through round 0 only.
    stale = PartyLedger(state="agree", epsilon_spent=0.0, through_round=0, open_rounds=0)
    text = capcctl.own_ledger_text(stale, 6.573)
    assert text.startswith("agree through round 0 (its eps 0.0000, gap 0)")
    assert "pending" in text
    current = PartyLedger(state="agree", epsilon_spent=6.573, through_round=4, open_rounds=0)
    assert capcctl.own_ledger_text(current, 6.573) == (
        "agree through round 4 (its eps 6.5730, gap 0)"
    )
    unreported = PartyLedger(state="unreported", epsilon_spent=0, through_round=0, open_rounds=0)
    assert capcctl.own_ledger_text(unreported, 1.0) == "unreported"


def test_the_loop_display_says_which_model_before_is() -> None:
    from capc_client.models import StudentModel

    model = StudentModel(
        id="m1",
        state="done",
        job_ids=[],
        architecture="mlp",
        epochs=10,
        examples=30,
        metrics={
            "test_accuracy": 0.833,
            "before_model": "logistic regression, L2 0.01",
            "before_choice": {
                "the student's default model (mlp)": 0.5,
                "logistic regression, L2 0.01": 0.875,
                "logistic regression, L2 0.1": None,
            },
        },
        error="",
        created_at="now",
    )
    text = capcctl.before_text(model)
    assert text.startswith("logistic regression, L2 0.01 on 30 own records")
    assert "default model (mlp) 0.500" in text and "L2 0.1 failed" in text
    assert capcctl.before_text(None) == "not trained"
    loop = _loop({}).model_copy(update={"before": model, "accuracy_before": 0.833})
    lines = capcctl._loop_lines(loop)
    assert any(line.startswith("before: logistic regression") for line in lines)


def test_a_job_stopped_part_way_says_its_labels_stay_usable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """capcctl jobs submit --allow-partial --wait (or watch): a job the caps stopped part
    way names the command that trains on what it bought; one that bought nothing does not."""
    from capc_client.models import Job

    def job(answered: int) -> Job:
        return Job.model_validate(
            {
                "id": "j1",
                "state": "failed",
                "requested": 100,
                "processed": answered,
                "answered": answered,
                "rounds": 1,
                "task": "images",
                "source": "recipe",
                "progress": answered / 100,
                "error": "RESOURCE_EXHAUSTED: too few parties can afford the round",
                "created_at": "2026-01-01T00:00:00Z",
            }
        )

    class Gateway:
        def __init__(self, answered: int) -> None:
            self.answered = answered

        def wait(self, job_id: str, on_progress: Any = None) -> Job:
            return job(self.answered)

    args = argparse.Namespace(json=False, quiet=True)
    assert capcctl._watch(Gateway(40), args, "j1") == 1  # type: ignore[arg-type]
    assert "its 40 answered labels stay usable: capcctl models train j1 --wait" in (
        capsys.readouterr().err
    )
    assert capcctl._watch(Gateway(0), args, "j1") == 1  # type: ignore[arg-type]
    assert "models train" not in capsys.readouterr().err


def test_capcctl_budget_shows_the_guardians_plan_warnings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    class Gateway:
        def budgets(self) -> BudgetList:
            return BudgetList(
                task="images",
                delta=1e-5,
                accounting="gdp",
                budgets=[],
                plan_warnings=["hospital-c (1 of 81 votes) carries under a tenth"],
            )

    args = argparse.Namespace(json=False)
    assert capcctl.cmd_budget(Gateway(), args) == 0  # type: ignore[arg-type]
    assert "warning: hospital-c (1 of 81 votes) carries under a tenth" in capsys.readouterr().out
