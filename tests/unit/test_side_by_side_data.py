"""The side-by-side splits: roles disjoint, the test records a consortium's, the tuning
seed apart from the reported ones, and a summary that follows its rows."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.side_by_side import summary
from experiments.side_by_side.__main__ import merged
from experiments.side_by_side.capc_runs import counts, scaled_task, teachers_per_hospital
from experiments.side_by_side.data import DATASETS, LAYOUTS, REFERENCE, split, task
from services import local


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


def test_summary_and_goals_follow_the_rows() -> None:
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
    g = summary.goals(table, "d")
    assert g["loop_beats_alone"]["met"]
    assert not g["student_at_least_dp_fedavg"]["met"]  # 0.81 < 0.82
    assert g["student_80_at_eps_10"]["met"]
    # A loop within the seed spread of training alone does not count as a lift.
    close = [r if r["method"] != "capc-loop" else {**r, "accuracy": 0.63} for r in rows]
    assert not summary.goals(summary.table(close), "d")["loop_beats_alone"]["met"]
    assert "| each hospital alone (non-private) |" in summary.markdown(table)
    # Bytes: a table of the methods that send any, capc's beside DP-FedAvg's.
    assert "bytes sent" not in summary.markdown(table)
    sends = {"capc-diet-student": 2.5e7, "dp_fedavg": 5e5}
    sent = [{**r, "bytes_sent": sends.get(str(r["method"]), 0.0)} for r in rows]
    text = summary.markdown(summary.table(sent))
    assert "| capc: DIET student (no data of its own) | 50 | 25 MB |" in text
    assert "| DP-FedAvg (Flower + Opacus) | 50 | 500 kB |" in text
    assert "| each hospital alone (non-private) | 50 |" not in text


def test_a_new_row_replaces_the_old_one_of_its_cell() -> None:
    old = [_row("alone", 50, None, 1, 0.5), _row("alone", 50, None, 2, 0.5)]
    new = [_row("alone", 50, None, 1, 0.7)]
    got = merged(old, new)
    assert sorted(r["accuracy"] for r in got) == [0.5, 0.7] and len(got) == 2


def test_the_saved_results_and_the_docs_follow_the_saved_rows() -> None:
    """docs/results.md's side-by-side tables and goals, and the saved summary, are what
    the saved rows give (recomputed here, not copied)."""
    import json
    from pathlib import Path

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
    begin, end = "<!-- side-by-side: generated -->\n", "<!-- side-by-side: end -->"
    block = text[text.index(begin) + len(begin) : text.index(end)]
    expected = summary.markdown(table) + "\n" + summary.goals_markdown(table) + "\n"
    assert block == expected
    for png in ("accuracy-vs-epsilon", "when-to-join"):
        for dataset in {r["dataset"] for r in saved["rows"]}:
            assert (root / f"docs/img/side-by-side-{dataset}-{png}.png").is_file()


def test_the_docs_side_by_side_commands_parse() -> None:
    """Every ``python -m experiments.side_by_side...`` line in docs/results.md and in the
    modules' docstrings is accepted by that module's own parser."""
    import shlex
    from pathlib import Path

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
