"""capc's bytes in the side-by-side rows: the line fitted to measured jobs, the rows
filled from it job by job, and the saved results made that way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from experiments.side_by_side import bytes_fit
from experiments.side_by_side.capc_runs import CapcConfig
from experiments.side_by_side.tuned import SHIPPED
from experiments.side_by_side.wire import MEASURED

ROOT = Path(__file__).resolve().parents[2]
PER_ROUND, PER_QUERY, SESSION = 15_000.0, 7_000.0, 28_000


def _job(
    role: str, q: int, per_round: float = PER_ROUND, per_query: float = PER_QUERY
) -> dict[str, Any]:
    return {
        "role": role,
        "queries": q,
        "bytes": round(per_round * bytes_fit.rounds(q) + per_query * q),
    }


def _measurements(teachers: int = 5) -> dict[str, Any]:
    methods = [
        {
            "dataset": "d",
            "teachers_per_hospital": teachers,
            "method": method,
            # The first job's extra is the session; only the fit jobs make the line.
            "jobs": [
                {**_job("first", 8), "bytes": _job("first", 8)["bytes"] + SESSION},
                _job("fit", 8),
                _job("fit", 264),
                _job("check", 600),
            ],
        }
        for method in ("capc-diet-student", "capc-pate-public", "capc-loop")
    ]
    consortia = [
        {
            "dataset": "d",
            "teachers_per_hospital": teachers,
            "setup_bytes": 123_456,
            "querier_setup_bytes": 4_321,
        }
    ]
    return {"batch": 256, "methods": methods, "consortia": consortia}


def _cell(
    method: str, queries: list[int], teachers: int = 5, seed: int = 1
) -> list[dict[str, Any]]:
    return [
        {
            "dataset": "d",
            "method": method,
            "n": 50,
            "epsilon": e,
            "seed": seed,
            "queries": q,
            "accuracy": 0.5,
            "bytes_sent": None,
            "teachers_per_hospital": teachers,
        }
        for e, q in zip(bytes_fit.EPSILONS, queries, strict=True)
    ]


def _line(q: int) -> float:
    return PER_ROUND * bytes_fit.rounds(q) + PER_QUERY * q


def test_the_grid_constants_are_the_grids() -> None:
    assert CapcConfig().epsilons == bytes_fit.EPSILONS
    assert CapcConfig().batch == bytes_fit.BATCH


def test_the_line_goes_through_its_two_jobs_and_predicts_a_third() -> None:
    line = bytes_fit.fit([(8, _job("fit", 8)["bytes"]), (264, _job("fit", 264)["bytes"])])
    assert line.per_round == pytest.approx(PER_ROUND)
    assert line.per_query == pytest.approx(PER_QUERY)
    assert line.predict(600) == pytest.approx(_line(600))
    assert bytes_fit.rounds(256) == 1 and bytes_fit.rounds(257) == 2 and bytes_fit.rounds(0) == 0
    # Jobs of full rounds only, one twice the other, cannot tell a round from its queries.
    with pytest.raises(ValueError, match="cannot tell"):
        bytes_fit.fit([(256, 1000), (512, 2000)])


def test_a_row_is_the_sum_of_the_jobs_that_bought_its_queries() -> None:
    rows = _cell("capc-diet-student", [57, 201, 1005, 3201])
    got = bytes_fit.fill(rows, _measurements())
    jobs = [57, 144, 804, 2196]
    expected = [sum(round(_line(q)) for q in jobs[: i + 1]) + SESSION for i in range(4)]
    assert [r["bytes_sent"] for r in got] == expected
    assert got[-1]["job_bytes"][0] == round(_line(57)) + SESSION
    # Jobs are priced one by one: 1 + 1 + 4 + 9 rounds, not the 13 of one 3,201-query job.
    assert got[-1]["bytes_sent"] != round(_line(3201)) + SESSION
    assert all(r["bytes_measured"].startswith(bytes_fit.FITTED) for r in got)
    assert {r["consortium_setup_bytes"] for r in got} == {123_456}
    assert [r["accuracy"] for r in got] == [0.5] * 4  # nothing else moves
    assert rows[0]["bytes_sent"] is None  # the input is not changed


def test_a_row_with_other_job_sizes_gets_other_bytes() -> None:
    right = bytes_fit.fill(_cell("capc-pate-public", [9, 32, 160, 512]), _measurements())
    # The same queries at eps 10 bought by other jobs (256 and 224: one round less).
    wrong = bytes_fit.fill(_cell("capc-pate-public", [9, 32, 288, 512]), _measurements())
    assert wrong[-1]["bytes_sent"] == right[-1]["bytes_sent"] - PER_ROUND
    # Or one query more at eps 5.
    more = bytes_fit.fill(_cell("capc-pate-public", [9, 32, 161, 512]), _measurements())
    assert more[2]["bytes_sent"] == right[2]["bytes_sent"] + PER_QUERY
    # A job that buys nothing costs nothing; PATE-public's student session is already open.
    none = bytes_fit.fill(_cell("capc-pate-public", [0, 0, 10, 10]), _measurements())
    assert [r["bytes_sent"] for r in none] == [0, 0, round(_line(10)), round(_line(10))]
    loop = bytes_fit.fill(_cell("capc-loop", [0, 2, 10, 32]), _measurements())
    assert loop[1]["bytes_sent"] == round(_line(2)) + SESSION  # the querier's own session
    assert loop[0]["querier_setup_bytes"] == 4_321


def test_an_unmeasured_teacher_count_raises_and_is_not_extrapolated() -> None:
    rows = _cell("capc-diet-student", [9, 32, 160, 512], teachers=20)
    with pytest.raises(ValueError, match="20 teachers per hospital"):
        bytes_fit.fill(rows, _measurements(teachers=5))
    # Nor an unmeasured method.
    with pytest.raises(ValueError, match="capc-new"):
        bytes_fit.fill(_cell("capc-new", [1, 2, 3, 4]), _measurements())


def test_measured_rows_stay_and_a_cell_is_filled_whole() -> None:
    measured = [
        {**r, "bytes_sent": 7, "bytes_measured": "relay"} for r in _cell("capc-loop", [1, 2, 3, 4])
    ]
    assert bytes_fit.fill(measured, _measurements()) == measured
    mixed = [measured[0], *_cell("capc-loop", [1, 2, 3, 4])[1:]]
    with pytest.raises(ValueError, match="filled whole"):
        bytes_fit.fill(mixed, _measurements())
    missing_eps = _cell("capc-loop", [1, 2, 3, 4])[1:]
    with pytest.raises(ValueError, match="every eps"):
        bytes_fit.fill(missing_eps, _measurements())
    with pytest.raises(ValueError, match="fewer queries"):
        bytes_fit.fill(_cell("capc-loop", [5, 2, 3, 4]), _measurements())
    # Fitted rows are refitted from new measurements; other datasets are left alone.
    once = bytes_fit.fill(_cell("capc-loop", [1, 2, 3, 4]), _measurements())
    doubled = _measurements()
    for m in doubled["methods"]:
        m["jobs"] = [{**j, "bytes": 2 * j["bytes"]} for j in m["jobs"]]
    twice = bytes_fit.fill(once, doubled)
    assert twice[-1]["bytes_sent"] == 2 * once[-1]["bytes_sent"]
    assert bytes_fit.fill(once, doubled, datasets=["other"]) == once


@pytest.mark.skipif(
    "capc_bytes" not in json.loads((ROOT / "experiments/results/side-by-side.json").read_text()),
    reason="no capc_bytes measurements saved",
)
def test_the_saved_capc_rows_hold_measured_or_fitted_bytes() -> None:
    """Every saved capc row has bytes; the fitted ones are what the saved measurements
    give (refitted here), and each measured line predicted its check job closely."""
    saved = json.loads((ROOT / "experiments/results/side-by-side.json").read_text())
    rows, measured = saved["rows"], saved["capc_bytes"]
    # Rows run on the library pieces alone (the scenarios' central mode) sent nothing
    # over a wire: they say so, and carry no bytes rather than made-up ones.
    central = [r for r in rows if r["method"].startswith("capc-") and r.get("central_mode")]
    assert all(r["bytes_sent"] is None for r in central)
    capc = [r for r in rows if r["method"].startswith("capc-") and not r.get("central_mode")]
    assert capc and all(r["bytes_sent"] is not None for r in capc)
    assert all(r["bytes_sent"] > 0 for r in capc if r["queries"] > 0)
    # The grid's own runs are refitted whole: their rows that tuned reruns replaced are
    # kept under untuned_capc_rows, and a rerun's rows are measured, not fitted.
    rerun = [r for r in capc if not str(r.get("configuration", SHIPPED)).startswith(SHIPPED)]
    assert all(r["bytes_measured"] == MEASURED for r in rerun)
    grid = [r for r in rows if r not in rerun and not r.get("central_mode")]
    grid += saved.get("untuned_capc_rows", [])
    assert bytes_fit.fill(grid, measured) == grid
    for m in measured["methods"]:
        assert abs(m["check"]["relative_residual"]) < 0.02, m
        assert m["per_query"] > 0 and m["per_round"] > 0
    assert any(
        c.startswith("python -m experiments.side_by_side.capc_bytes") for c in saved["commands"]
    )
