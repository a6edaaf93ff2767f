"""capc's grid at its tuned picks: which consortia run, at which eps, and which rows
replace which (no services run here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from experiments.side_by_side import tuned
from experiments.side_by_side.__main__ import build_parser, key, merged
from experiments.side_by_side.capc_runs import CapcConfig, Cell
from experiments.side_by_side.data import split

ROOT = Path(__file__).resolve().parents[2]
TWO_M0 = {"name": "2 m0, gnmax at the share", "teachers": 100, "labels": "retrain"}
TWO_M0["mechanism"] = {"name": "gnmax", "sigma": 80.0}
SHIPPED = {"name": "shipped: m0, gnmax at the share", "teachers": 50, "labels": "retrain"}
SHIPPED["mechanism"] = {"name": "gnmax", "sigma": 40.0}
OWN_X4 = {**SHIPPED, "name": "gnmax, own x4", "labels": "own-x4"}
AGREE = {**SHIPPED, "name": "gnmax, agree", "labels": "agree"}


def _pick(method: str, n: int, e: float, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "method": method,
        "n": n,
        "epsilon": e,
        "chosen": config["name"],
        "chosen_config": config,
    }


PICKS = [
    _pick("capc-diet-student", 1000, 1.0, TWO_M0),
    _pick("capc-diet-student", 1000, 2.0, TWO_M0),
    _pick("capc-diet-student", 1000, 5.0, SHIPPED),
    _pick("capc-diet-student", 1000, 10.0, SHIPPED),
    _pick("capc-pate-public", 1000, 10.0, TWO_M0),
    _pick("capc-loop", 1000, 1.0, OWN_X4),
    _pick("capc-diet-student", 50, 10.0, {**TWO_M0, "teachers": 10}),
    _pick("capc-loop", 1000, 2.0, AGREE),
]


def _row(method: str, n: int, e: float | None, seed: int, acc: float) -> dict[str, Any]:
    return {
        "dataset": "animal-mnist",
        "method": method,
        "n": n,
        "epsilon": e,
        "seed": seed,
        "accuracy": acc,
    }


def test_one_consortium_per_configuration_running_only_whom_chose_it() -> None:
    runs = tuned.runs(PICKS)
    assert [(r.n, r.configuration) for r in runs] == [
        (1000, TWO_M0["name"]),
        (1000, OWN_X4["name"]),
        (50, TWO_M0["name"]),
    ]
    big, own = runs[0], runs[1]
    # The student and PATE both chose 2 m0 at n = 1000: one consortium, each method
    # priced only up to the eps it chose it for; the loop's agree pick is not run.
    assert big.methods == {"capc-diet-student": (1.0, 2.0), "capc-pate-public": (10.0,)}
    assert big.own_weight == 1 and big.config(CapcConfig()).own_weight == 1
    # own-x4 runs as the student service's own_weight 4, the loop alone.
    assert own.methods == {"capc-loop": (1.0,)} and own.own_weight == 4
    assert own.config(CapcConfig()).own_weight == 4
    assert (big.teachers, big.mechanism) == (100, {"name": "gnmax", "sigma": 80.0})
    config = big.config(CapcConfig())
    assert (config.epsilons, config.teachers, config.mechanism) == (
        (1.0, 2.0, 10.0),
        100,
        {"name": "gnmax", "sigma": 80.0},
    )
    assert runs[2].teachers == 10
    # Sizes and methods narrow and order the runs.
    assert [r.n for r in tuned.runs(PICKS, sizes=[50, 1000])] == [50, 1000, 1000]
    only = tuned.runs(PICKS, sizes=[1000], methods=["capc-diet-student"])
    assert [r.methods for r in only] == [{"capc-diet-student": (1.0, 2.0)}]
    assert [r.configuration for r in tuned.runs(PICKS, methods=["capc-loop"])] == [OWN_X4["name"]]
    assert tuned.unrunnable(PICKS[-1]) and not tuned.unrunnable(PICKS[5])
    assert not tuned.unrunnable(PICKS[0])
    with pytest.raises(ValueError, match="own_weight must lie in"):
        CapcConfig(own_weight=0)


def test_a_cell_prices_each_method_only_at_its_own_eps() -> None:
    s = split("animal-mnist", 1)
    run = tuned.runs(PICKS)[0]
    cell = Cell(s, 1000, run.config(CapcConfig()), Path("/nonexistent"), print, run.methods)
    assert cell.epsilons("capc-diet-student") == (1.0, 2.0)
    assert cell.epsilons("capc-pate-public") == (10.0,)
    assert cell.epsilons("capc-loop") == ()  # the loop does not run
    grid = Cell(s, 1000, CapcConfig(), Path("/nonexistent"), print)
    assert grid.epsilons("capc-loop") == CapcConfig().epsilons
    with pytest.raises(ValueError, match="unknown capc methods"):
        Cell(s, 1000, CapcConfig(), Path("/nonexistent"), print, {"capc-typo": (1.0,)})


def test_tuned_rows_replace_the_grids_only_where_chosen() -> None:
    run = tuned.runs(PICKS)[0]
    grid = [
        _row(m, 1000, e, 1, 0.5)
        for m in ("capc-diet-student", "capc-pate-public", "capc-loop")
        for e in (1.0, 2.0, 5.0, 10.0)
    ]
    grid += [_row("alone", 1000, None, 1, 0.4)]
    # What the consortium made: the student at eps 1 and 2, PATE at eps 10.
    made = [_row("capc-diet-student", 1000, e, 1, 0.6) for e in (1.0, 2.0)]
    made += [
        _row("capc-pate-public", 1000, 10.0, 1, 0.6),
        _row("capc-pate-public", 1000, 5.0, 1, 0),
    ]
    new = tuned.kept(made, run)
    assert {(r["method"], r["epsilon"]) for r in new} == {
        ("capc-diet-student", 1.0),
        ("capc-diet-student", 2.0),
        ("capc-pate-public", 10.0),
    }
    assert all(r["tuned"] and r["configuration"] == TWO_M0["name"] for r in new)
    rows = tuned.mark(merged(grid, new), PICKS, "animal-mnist")
    assert len(rows) == len(grid)
    by = {(r["method"], r["epsilon"]): r for r in rows}
    # The shipped rule's own picks: the grid's rows stand, marked.
    assert by[("capc-diet-student", 5.0)]["tuned"]
    assert by[("capc-diet-student", 5.0)]["configuration"] == SHIPPED["name"]
    assert by[("capc-diet-student", 1.0)]["configuration"] == TWO_M0["name"]
    # A pick not run here leaves the grid's row, not tuned.
    assert by[("capc-loop", 1.0)]["tuned"] is False
    # No pick: untouched (PATE at eps 1 was not tuned here; baselines never are).
    assert "tuned" not in by[("capc-pate-public", 1.0)] and "tuned" not in by[("alone", None)]
    # Marking twice changes nothing; another dataset's rows are not touched.
    assert tuned.mark(rows, PICKS, "animal-mnist") == rows
    other = [{**r, "dataset": "breast-cancer"} for r in grid]
    assert tuned.mark(other, PICKS, "animal-mnist") == other
    # A row made at a configuration no longer chosen is not the tuned pick.
    moved = [{**p, "chosen": SHIPPED["name"], "chosen_config": SHIPPED} for p in PICKS[:1]]
    stale = tuned.mark(new[:1], moved, "animal-mnist")
    assert stale[0]["tuned"] is False
    assert {key(r) for r in new} <= {key(r) for r in rows}


def test_the_saved_picks_are_the_ones_the_docs_name() -> None:
    picks = tuned.load(ROOT / "experiments/results/side-by-side-capc-tuning.json", "animal-mnist")
    assert tuned.load(ROOT / "experiments/results/side-by-side-capc-tuning.json", "other") == []
    students = {
        (r.n, r.configuration): r.methods["capc-diet-student"]
        for r in tuned.runs(picks, methods=["capc-diet-student"])
    }
    two, twice = "2 m0, gnmax at the share", "m0, gnmax at 2x the share"
    assert students == {
        (1348, two): (1.0, 2.0),
        (1000, two): (1.0, 2.0),
        (200, two): (1.0, 2.0, 10.0),
        (50, two): (10.0,),
        (50, twice): (1.0, 2.0, 5.0),
    }


def test_the_tuned_command_parses() -> None:
    args = build_parser().parse_args(
        [
            "--out",
            "x.json",
            "--datasets",
            "animal-mnist",
            "--methods",
            "capc",
            "--capc-methods",
            "capc-diet-student",
            "--tuned-from",
            "t.json",
            "--add-to",
            "--sizes",
            "all",
            "1000",
        ]
    )
    assert args.tuned_from == Path("t.json") and args.capc_methods == ["capc-diet-student"]


def test_the_tables_say_which_configuration_each_capc_cell_is_at() -> None:
    from experiments.side_by_side import summary

    base = {"hyperparameters": {"sigma": 40.0}, "teachers_per_hospital": 50}
    rows = [{**_row("capc-diet-student", 1000, 5.0, s, 0.7), **base} for s in (1, 2)]
    rows += [{**_row("dp_fedavg", 1000, e, 1, 0.8)} for e in (1.0, 5.0)]
    two = {"hyperparameters": {"sigma": 80.0}, "teachers_per_hospital": 100}
    rows += [
        {**_row("capc-diet-student", 1000, 1.0, 1, 0.6), **two, "configuration": "2 m0"},
        {**_row("capc-diet-student", 1000, 1.0, 2, 0.5), **base},
    ]
    rows = tuned.mark(
        rows, [_pick("capc-diet-student", 1000, 1.0, {**TWO_M0, "name": "2 m0"})], "animal-mnist"
    )
    rows += [{**r, "method": "capc-pate-public"} for r in rows[:2]]
    text = summary.markdown(summary.table(rows))
    assert (
        "- capc: DIET student (no data of its own): eps 1: seed 1: 2 m0 (100 teachers a "
        "hospital, sigma 80, tuned pick); seed 2: shipped rule (50 teachers a hospital, "
        "sigma 40, not the tuned pick); eps 5: shipped rule (50 teachers a hospital, "
        "sigma 40, not tuned)."
    ) in text
    assert (
        "- capc: PATE with public records: eps 5: shipped rule (50 teachers a hospital, sigma 40, not tuned)."
        in text
    )
    assert "DP-FedAvg (Flower + Opacus):" not in text


def test_mark_only_marks_the_saved_rows_and_runs_nothing(tmp_path: Path) -> None:
    import json

    from experiments.side_by_side.__main__ import main

    rows = [_row("capc-diet-student", 1000, e, 1, 0.5) for e in (1.0, 5.0)]
    out = tmp_path / "rows.json"
    out.write_text(json.dumps({"rows": rows, "commands": ["python -m experiments.side_by_side x"]}))
    picks = tmp_path / "tuning.json"
    picks.write_text(json.dumps({"dataset": "animal-mnist", "chosen": PICKS}))
    argv = ["--out", str(out), "--datasets", "animal-mnist", "--methods", "capc", "--add-to"]
    assert main([*argv, "--tuned-from", str(picks), "--mark-only"]) == 0
    saved = json.loads(out.read_text())
    by = {r["epsilon"]: r for r in saved["rows"]}
    assert len(saved["rows"]) == 2 and by[5.0]["tuned"] and by[1.0]["tuned"] is False
    with pytest.raises(SystemExit):
        main([*argv, "--mark-only"])


def test_each_run_maps_its_command_to_its_reproducible_form(tmp_path: Path) -> None:
    import json

    from experiments.side_by_side.__main__ import main, reproducible

    assert reproducible("python -m m --out o.json --work /tmp/w --add-to") == (
        "python -m m --out o.json --add-to"
    )
    assert reproducible("python -m m --work=/tmp/w --sizes 50") == "python -m m --sizes 50"
    out = tmp_path / "rows.json"
    old = "python -m experiments.side_by_side --out /tmp/part.json"
    out.write_text(
        json.dumps({"rows": [], "commands": [old], "documented_as": {old: ["python -m x"]}})
    )
    picks = tmp_path / "tuning.json"
    picks.write_text(json.dumps({"dataset": "animal-mnist", "chosen": PICKS}))
    argv = ["--out", str(out), "--datasets", "animal-mnist", "--methods", "capc", "--add-to"]
    argv += ["--tuned-from", str(picks), "--mark-only", "--work", str(tmp_path / "w")]
    assert main(argv) == 0
    saved = json.loads(out.read_text())
    ran = saved["commands"][-1]
    assert "--work" in ran and saved["documented_as"][old] == ["python -m x"]
    assert saved["documented_as"][ran] == [reproducible(ran)] and "--work" not in reproducible(ran)
