"""The side-by-side splits: roles disjoint, the test records a consortium's, the tuning
seed apart from the reported ones, and a summary that follows its rows."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experiments.side_by_side import summary
from experiments.side_by_side.__main__ import merged
from experiments.side_by_side.capc_runs import counts, scaled_task, teachers_per_hospital
from experiments.side_by_side.data import DATASETS, LAYOUTS, REFERENCE, split, task
from services import local
from tests.unit.test_side_by_side_plots import scenario_rows


@pytest.mark.parametrize("dataset", DATASETS)
def test_roles_are_disjoint_and_cover_the_data(dataset: str) -> None:
    s = split(dataset, 1)
    parts = [s.test, s.reference, s.tuning, s.public, *s.shares]
    everything = np.concatenate(parts)
    assert len(everything) == len(np.unique(everything)) == len(s.x)
    layout = LAYOUTS[dataset]
    assert (len(s.test), len(s.tuning), len(s.public)) == (
        layout.test,
        layout.tuning,
        layout.public,
    )
    n = s.size(None)
    assert np.array_equal(s.pooled(None), np.concatenate([sh[:n] for sh in s.shares]))
    assert len(np.intersect1d(s.labelled(0, 50), s.unlabelled(0, 50))) == 0
    with pytest.raises(ValueError, match="a hospital holds"):
        s.labelled(0, n + 1)


@pytest.mark.parametrize("dataset", DATASETS)
def test_the_test_records_are_a_consortiums_held_out_ones(dataset: str) -> None:
    """A student trained through the services is scored on the records every other
    method is scored on: services.local draws the same ones (split seed 0)."""
    assert REFERENCE == local.REFERENCE
    s = split(dataset, 2)
    x, y = local.load_dataset(dataset, task=task(dataset))
    order = np.random.default_rng(7).permutation(len(x))
    held = min(LAYOUTS[dataset].test, len(x) // 4)
    assert held == LAYOUTS[dataset].test
    assert np.array_equal(s.test, order[:held])
    assert np.array_equal(s.x, x) and np.array_equal(s.y, y)


def test_only_the_hospital_shares_change_with_the_seed() -> None:
    a, b = split("breast-cancer", 0), split("breast-cancer", 1)
    for role in ("test", "reference", "tuning", "public"):
        assert np.array_equal(getattr(a, role), getattr(b, role))
    assert not np.array_equal(a.shares[0], b.shares[0])


def test_capc_budgets_follow_the_shipped_share_of_the_vote() -> None:
    """sigma is the shipped task's share of the vote; a bigger cap buys more labels."""
    demo = scaled_task("animal-mnist", 250)
    assert demo["mechanism"]["sigma"] == 40.0
    few = scaled_task("animal-mnist", 5 * teachers_per_hospital("animal-mnist", 50))
    assert few["mechanism"]["sigma"] == pytest.approx(4.0)
    assert scaled_task("breast-cancer", 24)["mechanism"]["sigma"] == 23.0
    got = counts(demo, (1.0, 2.0, 5.0, 10.0), 10**9)
    assert got == sorted(got) and got[-1] > 3000
    assert counts(demo, (10.0,), 70) == [70]


def _row(method: str, n: int, eps: float | None, seed: int, acc: float) -> dict[str, object]:
    return {
        "dataset": "d",
        "method": method,
        "n": n,
        "epsilon": eps,
        "seed": seed,
        "accuracy": acc,
        "seconds": 1.0,
        "bytes_sent": None,
    }


def test_summary_follows_the_rows() -> None:
    rows = [_row("alone", 50, None, s, a) for s, a in ((1, 0.60), (2, 0.62), (3, 0.64))] + [
        _row("pooled", 50, None, s, 0.9) for s in (1, 2, 3)
    ]
    rows += [
        {**_row("capc-loop", 50, 10.0, s, a), "accuracy_before": 0.6, "gain": a - 0.6}
        for s, a in ((1, 0.70), (2, 0.71), (3, 0.72))
    ]
    rows += [_row("capc-diet-student", 50, 10.0, s, 0.81) for s in (1, 2, 3)]
    rows += [_row("dp_fedavg", 50, 10.0, s, 0.82) for s in (1, 2, 3)]
    table = summary.table(rows)
    alone = summary.lookup(table, "d", "alone", 50, None)
    assert alone is not None and alone["accuracy"] == pytest.approx(0.62)
    assert alone["accuracy_std"] == pytest.approx(np.std([0.60, 0.62, 0.64]))
    assert alone["scenario"] == "iid" and alone["hospital"] is None
    loop = summary.lookup(table, "d", "capc-loop", 50, 10.0)
    assert loop is not None and loop["gain"] == pytest.approx(0.11)
    assert "| each hospital alone (non-private) |" in summary.markdown(table)
    # Bytes: a table of the methods that send any, capc's beside DP-FedAvg's.
    assert "bytes sent" not in summary.markdown(table)
    sends = {"capc-diet-student": 2.5e7, "dp_fedavg": 5e5}
    sent = [{**r, "bytes_sent": sends.get(str(r["method"]), 0.0)} for r in rows]
    text = summary.markdown(summary.table(sent))
    assert "| capc: DIET student (no data of its own) | 50 | 25 MB |" in text
    assert "| DP-FedAvg (Flower + Opacus) | 50 | 500 kB |" in text
    assert "| each hospital alone (non-private) | 50 |" not in text


def test_the_summary_keeps_scenarios_and_hospitals_apart() -> None:
    """The same (method, n, eps) in two scenarios, or for two hospitals, are two
    cells, each with its own mean and spread over seeds."""
    rows = scenario_rows()
    table = summary.table(rows)
    iid = summary.lookup(table, "animal-mnist", "alone", 50, None)
    small = summary.lookup(table, "animal-mnist", "alone", 50, None, "small-querier")
    assert iid is not None and small is not None
    assert (iid["accuracy"], small["accuracy"]) == (pytest.approx(0.68), pytest.approx(0.60))
    assert small["accuracy_std"] == pytest.approx(np.std([0.59, 0.60, 0.61]))
    mm = "mixed-models"
    h0 = summary.lookup(table, "animal-mnist", "alone", 1348, None, mm, "hospital-0")
    h1 = summary.lookup(table, "animal-mnist", "alone", 1348, None, mm, "hospital-1")
    assert h0 is not None and h1 is not None and h0["architecture"] == "cnn"
    assert (h0["accuracy"], h1["accuracy"]) == (pytest.approx(0.80), pytest.approx(0.78))
    assert summary.lookup(table, "animal-mnist", "alone", 1348, None, mm) is None
    # Outside mixed models a row's hospital does not split its cell.
    named = [
        {**r, "hospital": "hospital-0"} if r.get("scenario") == "small-querier" else r for r in rows
    ]
    assert summary.table(named) == table
    assert summary.scenarios(table, "animal-mnist") == list(summary.SCENARIOS)
    text = summary.markdown(table)
    assert "**animal-mnist, mixed models, hospital-1 (linear), n = 1348 labelled records**" in text
    assert "**animal-mnist, small querier, n = 50 labelled records**" in text
    assert "| capc: CaPC loop, DP-trained teachers | 0.760 ± 0.008 | 0.740 ± 0.008 | n/a |" in text


def _goal(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return next(g for g in summary.goals(summary.table(rows)) if g["key"] == key)


def test_the_goals_are_judged_on_their_cells() -> None:
    rows = scenario_rows()
    g = {x["key"]: x for x in summary.goals(summary.table(rows))}
    assert [g[k]["status"] for k in ("iid", "small-querier", "skew-0.1", "mixed-models")] == [
        "met",
        "not met",
        "met",
        "not met",
    ]
    # Small querier: the better loop lifts alone by 0.16 at eps 5 and 10, but is
    # 0.02 below joining DP-FedAvg at eps 10.
    assert g["small-querier"]["deficit"] == pytest.approx(0.02)
    assert g["small-querier"]["worst"]["where"] == "eps 10 vs DP-FedAvg"
    # Mixed: hospital-0 gets 0.85 from capc, 0.86 from DP-FedAvg over its architecture;
    # hospital-1 has no DP-FedAvg, so alone is its bar.
    assert g["mixed-models"]["deficit"] == pytest.approx(0.01)
    bars = {c["where"]: c["needed"] for c in g["mixed-models"]["checks"]}
    assert bars["hospital-1, n 1348 vs each hospital alone"] == pytest.approx(0.78)
    # A student any hospital may receive counts for each: 0.87 lifts hospital-0.
    student = [
        {**r, "accuracy": r["accuracy"] + 0.02, "method": "capc-diet-student"}
        for r in rows
        if (r.get("scenario"), r.get("hospital"), r["method"])
        == ("mixed-models", "hospital-0", "capc-loop")
    ]
    for r in student:
        del r["hospital"]
    assert _goal(rows + student, "mixed-models")["status"] == "met"
    # IID: the bar is DP-FedAvg - 0.02 at every eps and 0.89 at eps 10; lower the DP
    # student's eps 10 mean to 0.885 and the floor fails by 0.005.
    low = [
        {**r, "accuracy": r["accuracy"] - 0.01}
        if (r["method"], r["n"], r["epsilon"]) == ("capc-dp-student", 1348, 10.0)
        else r
        for r in rows
    ]
    iid = _goal(low, "iid")
    assert iid["status"] == "not met" and iid["deficit"] == pytest.approx(0.005)
    # A student 0.05 lower fails at every eps; furthest below the floor at eps 10.
    far = [
        {**r, "accuracy": r["accuracy"] - 0.05} if r["method"] == "capc-dp-student" else r
        for r in rows
    ]
    assert _goal(far, "iid")["worst"]["where"] == "n 1348, eps 10 vs 0.89"
    assert _goal(far, "iid")["deficit"] == pytest.approx(0.045)
    # Skew: capc below DP-FedAvg at eps 10 by 0.03 fails.
    skew = [
        {**r, "accuracy": r["accuracy"] + 0.05}
        if (r.get("scenario"), r["method"], r["epsilon"]) == ("skew-0.1", "dp_fedavg", 10.0)
        else r
        for r in rows
    ]
    assert _goal(skew, "skew-0.1")["deficit"] == pytest.approx(0.03)


def test_a_goal_without_rows_is_not_measured() -> None:
    iid_only = [r for r in scenario_rows() if "scenario" not in r]
    g = {x["key"]: x for x in summary.goals(summary.table(iid_only))}
    assert g["iid"]["status"] == "met"
    for key in ("small-querier", "skew-0.1", "mixed-models"):
        assert g[key]["status"] == "not measured" and g[key]["deficit"] is None
    # A goal with some of its cells missing is not met where measured cells fail,
    # else not measured (never met on part of its cells).
    no_fed = [
        r
        for r in scenario_rows()
        if (r.get("scenario"), r["method"]) != ("small-querier", "dp_fedavg")
    ]
    assert _goal(no_fed, "small-querier")["status"] == "not measured"
    table = summary.table(iid_only)
    text = summary.goals_markdown(table)
    assert (
        "| class skew alpha 0.1: capc's best >= DP-FedAvg at eps 10 | not measured | n/a | no rows yet |"
        in text
    )
    assert summary.goals(summary.table([]))[0]["status"] == "not measured"


def test_the_headline_says_where_capc_wins_and_where_not() -> None:
    table = summary.table(scenario_rows())
    st = {(s["scenario"], s["hospital"], s["n"]): s for s in summary.standings(table)}
    assert st[("small-querier", None, 50)]["verdict"] == "behind"
    assert st[("small-querier", None, 50)]["difference"] == pytest.approx(-0.02)
    assert st[("skew-0.1", None, 1348)]["verdict"] == "ahead"
    # Pooled DP-SGD and the pooled ceiling are not a hospital's alternative.
    assert st[("iid", None, 50)]["alternative"]["method"] == "alone"
    text = summary.headline(table)
    assert "capc's best method is ahead in 4 (" in text and "of 8 settings" in text
    assert "behind in 4, by 0.010 to 0.130" in text
    assert "Issue 52's goals: 2 met, 2 not met, 0 not measured yet." in text
    # Within the larger seed spread is a tie, not a win.
    close = [
        {**r, "accuracy": r["accuracy"] - 0.015}
        if (r.get("scenario"), r["method"]) == ("skew-0.1", "capc-diet-student")
        else r
        for r in scenario_rows()
    ]
    tied = {(s["scenario"], s["n"]): s for s in summary.standings(summary.table(close))}
    assert tied[("skew-0.1", 1348)]["verdict"] == "tied"


def test_the_test_sets_named_are_the_layouts() -> None:
    for dataset, layout in LAYOUTS.items():
        noun = "images" if dataset == "animal-mnist" else "patients"
        assert summary.test_set(dataset) == f"the {layout.test:,} held-out test {noun}"


def test_regenerating_the_docs_is_idempotent(tmp_path: Path) -> None:
    """``--write`` saves the summary and rewrites every generated block; run again it
    changes nothing, and it refuses a page without a block."""
    result = tmp_path / "side-by-side.json"
    result.write_text(json.dumps({"rows": scenario_rows(), "commands": []}, indent=1) + "\n")
    names = ("side-by-side headline", "side-by-side goals", "side-by-side")
    page = tmp_path / "results.md"
    page.write_text(
        "# R\n"
        + "".join(f"{summary.begin_marker(n)}old\n{summary.end_marker(n)}\ntext\n" for n in names)
    )
    readme = tmp_path / "README.md"
    readme.write_text(
        f"top\n{summary.begin_marker(names[0])}{summary.end_marker(names[0])}\nbottom\n"
    )
    assert summary.main([str(result), "--write", str(readme), str(page)]) == 0
    first = {p: p.read_text() for p in (result, page, readme)}
    assert "old" not in first[page] and first[readme].startswith("top\n")
    made = summary.blocks(summary.table(scenario_rows()))
    for name in names:
        assert summary.block(first[page], name) == made[name]
    assert summary.block(first[readme], names[0]) == made[names[0]]
    assert json.loads(first[result])["summary"] == json.loads(
        json.dumps(summary.table(scenario_rows()))
    )
    assert summary.write(result, [readme, page]) == []
    assert {p: p.read_text() for p in first} == first
    bare = tmp_path / "bare.md"
    bare.write_text("no blocks\n")
    with pytest.raises(ValueError, match="no generated side-by-side block"):
        summary.write(result, [bare])


def test_a_new_row_replaces_the_old_one_of_its_cell() -> None:
    old = [_row("alone", 50, None, 1, 0.5), _row("alone", 50, None, 2, 0.5)]
    new = [_row("alone", 50, None, 1, 0.7)]
    got = merged(old, new)
    assert sorted(r["accuracy"] for r in got) == [0.5, 0.7] and len(got) == 2


def test_the_saved_results_and_the_docs_follow_the_saved_rows() -> None:
    """docs/results.md's and README.md's generated side-by-side blocks (headline,
    goals, tables) and the saved summary are what the saved rows give (recomputed here,
    not copied); rerun the summary's ``--write`` when the rows change."""
    root = Path(__file__).resolve().parents[2]
    saved = json.loads((root / "experiments/results/side-by-side.json").read_text())
    table = summary.table(saved["rows"])
    assert json.loads(json.dumps(table)) == saved["summary"]
    assert all(r["seed"] != 0 for r in saved["rows"]), "seed 0 is for tuning only"
    assert saved["commands"] and all(
        c.startswith("python -m experiments.side_by_side") for c in saved["commands"]
    )
    text = (root / "docs/results.md").read_text()
    # Provenance: every command as it ran is kept, and each is mapped to the documented
    # command that makes its rows without the scratch files it may name.
    lines = set(text.splitlines())
    for command in saved["commands"]:
        documented = saved["documented_as"].get(command)
        assert documented, f"{command!r}: no docs/results.md command in documented_as"
        for line in documented:  # a merge of parts maps to each part's command
            assert line in lines and "/tmp" not in line, (command, line)
    made = summary.blocks(table)
    readme = (root / "README.md").read_text()
    for name, body in made.items():
        assert summary.block(text, name) == body, f"docs/results.md: {name} is stale"
    assert summary.block(readme, "side-by-side headline") == made["side-by-side headline"]
    # The README keeps its first lines: the two commands a newcomer runs.
    assert readme.splitlines()[3:5] == [
        "make demo    # creates .venv, installs the pinned dependencies, runs the demo in demo/",
        "make test    # installs, then lint (ruff), types (mypy) and the whole pytest suite",
    ]
    # The figures the docs show exist (their content: test_side_by_side_plots).
    for page in (text, readme):
        for image in re.findall(r"\]\((?:docs/)?(img/side-by-side-[^)]+\.png)\)", page):
            assert (root / "docs" / image).is_file(), image
    assert "img/side-by-side-animal-mnist-iid.png" in readme
    assert "(docs/results.md#side-by-side-when-joining-pays)" in readme


def test_the_docs_side_by_side_commands_parse() -> None:
    """Every ``python -m experiments.side_by_side...`` line in docs/results.md and in the
    modules' docstrings is accepted by that module's own parser."""
    import shlex

    from experiments.side_by_side import __main__ as grid
    from experiments.side_by_side import baselines, capc_bytes, capc_tuning, plots

    parsers = {
        "experiments.side_by_side": grid.build_parser(),
        "experiments.side_by_side.summary": summary.build_parser(),
        "experiments.side_by_side.plots": plots.build_parser(),
        "experiments.side_by_side.capc_tuning": capc_tuning.build_parser(),
        "experiments.side_by_side.capc_bytes": capc_bytes.build_parser(),
        "experiments.side_by_side.baselines": baselines._parser(),
    }
    root = Path(__file__).resolve().parents[2]
    texts = [(root / "docs/results.md").read_text(), grid.__doc__ or "", plots.__doc__ or ""]
    texts += [summary.__doc__ or "", (root / "README.md").read_text()]
    texts += [baselines.__doc__ or "", capc_tuning.__doc__ or "", capc_bytes.__doc__ or ""]
    seen = 0
    for text in texts:
        joined = text.replace("\\\n", " ")
        for line in joined.splitlines():
            words = (
                shlex.split(line.split("#")[0])
                if "python -m experiments.side_by_side" in line
                else []
            )
            if len(words) < 3 or words[0] != "python" or words[2] not in parsers:
                continue
            parsers[words[2]].parse_args(words[3:])
            seen += 1
    assert seen >= 5
