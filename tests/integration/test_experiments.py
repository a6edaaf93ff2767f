"""The experiment scripts run on small settings and write the JSON they promise."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from capc.mechanisms import from_config
from capc.privacy.randomness import SecureRandom
from experiments import diet_services

ROOT = Path(__file__).resolve().parents[2]


def run(module: str, out: Path, *args: str) -> dict[str, object]:
    subprocess.run(
        [sys.executable, "-m", module, "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out.read_text())
    assert isinstance(result, dict)
    return result


def test_multilabel_voting_experiment(tmp_path: Path) -> None:
    result = run(
        "experiments.multilabel_voting",
        tmp_path / "ml.json",
        "--teachers",
        "6",
        "--epochs",
        "1",
        "--seeds",
        "1",
        # Each query draws 42 exact noise values (5 + 5 + 32 for Powerset): 400 of them
        # keep the run short and every comparison below meaningful.
        "--held-out",
        "400",
    )
    rows = result["results"]
    assert isinstance(rows, dict) and set(rows) == {"eps=2", "eps=5", "eps=10"}
    assert result["held_out_queries"] == 400
    for row in rows.values():
        # Same epsilon, same planned queries: Powerset's smaller sensitivity needs less noise.
        assert row["powerset"]["sigma_for_queries"] < row["binary"]["sigma_for_queries"]
        assert row["powerset"]["labels_at_equal_sigma"] > row["binary"]["labels_at_equal_sigma"]
        assert 0 <= row["tau"]["quality"]["mAP"] <= 1


def test_personalized_budgets_experiment(tmp_path: Path) -> None:
    result = run(
        "experiments.personalized_budgets",
        tmp_path / "p.json",
        "--teachers",
        "6",
        "--epochs",
        "1",
        "--stream",
        "3000",
        "--sigma",
        "20",
    )
    rows = result["results"]
    assert isinstance(rows, dict)
    assert str(result["stopping"]).startswith("data-independent")
    for row in rows.values():
        # Personalized runs never produce fewer labels than everyone at the smallest budget.
        assert row["weighting_over_baseline"] >= 1.0 and row["vanishing_over_baseline"] >= 1.0
        for run_ in ("baseline_all_at_log2", "weighting", "vanishing"):
            side = row[run_]["side_figure_not_a_release_rule"]
            assert set(side) == {"data_dependent_epsilon_unsanitised_by_cap"}


def test_personalized_budget_streams_stop_whatever_the_votes() -> None:
    """Neighbouring vote sets (one teacher's votes differ) release the same number of
    labels: the stop never reads a data-dependent epsilon."""
    from experiments.personalized_budgets import run_stream

    gnmax = from_config({"name": "gnmax", "sigma": 20.0}, 10)
    q, n = 400, 100
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 10, q)
    agree = np.repeat(truth[:, None], n, axis=1)
    noisy = np.where(rng.random((q, n)) < 0.5, rng.integers(0, 10, (q, n)), agree)
    caps = np.where(np.arange(n) < n // 2, math.log(2), math.log(8))
    weights = np.where(np.arange(n) < n // 2, 0.5, 1.5)
    voting = rng.random((q, n)) < np.where(np.arange(n) < n // 2, 0.4, 1.0)
    runs = []
    for preds in (agree, noisy):
        neighbour = preds.copy()
        neighbour[:, 0] = (preds[:, 0] + 1) % 10
        for votes in (preds, neighbour):
            for w, v in ((weights, np.ones((q, n), dtype=bool)), (np.ones(n), voting)):
                out = run_stream(votes, truth, caps, w, v, gnmax, SecureRandom.from_seed(1))
                runs.append(out)
    # unanimous or split, a teacher moved or not: the same stop per rule
    assert {r["labels"] for r in runs[0::2]} == {runs[0]["labels"]}
    assert {r["labels"] for r in runs[1::2]} == {runs[1]["labels"]}
    assert 0 < runs[0]["labels"] < q and 0 < runs[1]["labels"] < q
    sides = [
        r["side_figure_not_a_release_rule"]["data_dependent_epsilon_unsanitised_by_cap"]
        for r in runs
    ]
    # while the data-dependent side figure does tell the vote sets apart
    assert sides[0] != sides[4]


def test_personalized_budget_reports_nothing_past_the_stop() -> None:
    """The guardian's noise covers the whole stream, but votes and truths past the stop
    feed no reported number (labels, accuracy, side figure)."""
    from experiments.personalized_budgets import run_stream

    gnmax = from_config({"name": "gnmax", "sigma": 20.0}, 10)
    q, n = 400, 20
    rng = np.random.default_rng(2)
    truth = rng.integers(0, 10, q)
    preds = np.where(rng.random((q, n)) < 0.7, truth[:, None], rng.integers(0, 10, (q, n)))
    caps = np.where(np.arange(n) < n // 2, math.log(2), math.log(4))
    voting = rng.random((q, n)) < 0.6
    out = run_stream(preds, truth, caps, np.ones(n), voting, gnmax, SecureRandom.from_seed(3))
    stop = out["labels"]
    assert 0 < stop < q
    tail_preds, tail_truth = preds.copy(), truth.copy()
    tail_preds[stop:] = (preds[stop:] + 3) % 10
    tail_truth[stop:] = (truth[stop:] + 5) % 10
    again = run_stream(
        tail_preds, tail_truth, caps, np.ones(n), voting, gnmax, SecureRandom.from_seed(3)
    )
    assert again == out


def test_diet_label_noise_experiment_draw_zero_is_the_diet_run(tmp_path: Path) -> None:
    cache, common = tmp_path / "cache", ["--quick", "--seeds", "1", "--first-seed", "2"]
    result = run(
        "experiments.diet_label_noise",
        tmp_path / "noise.json",
        *common,
        "--query-draws",
        "2",
        "--noise-draws",
        "2",
        # five quick teachers get little noise: a large budget answers every query
        "--epsilon",
        "1000",
        "--cache",
        str(cache),
    )
    seeds = result["seeds"]
    assert isinstance(seeds, list) and len(seeds) == 1
    seed: dict[str, Any] = seeds[0]
    assert seed["seed"] == 2
    assert len(seed["noisy"]) == 2 and all(len(r) == 2 for r in seed["noisy"])
    assert len(seed["noiseless"]) == 2 and len(seed["answered"]) == 2
    for acc in [*seed["noiseless"], *(a for r in seed["noisy"] for a in r)]:
        assert 0.0 <= acc <= 1.0
    # the noisy students did see noise: some released labels differ from the majority
    assert seed["label_agreement_with_majority"] < 1.0
    # The first query set and noise draw are what the experiment of the table makes, so
    # the one-off diagnosis and the reported student can be compared seed by seed.
    cmd = [sys.executable, "-m", "capc.learning", "diet", "run", *common, "--no-baseline"]
    cmd += ["--generators", "gaussian", "--statistics", "current", "--threshold", "none"]
    cmd += ["--sigma1", "1", "--sigma2", "16", "--accountants", "gdp", "--epsilons", "1000"]
    cmd += ["--student-l2", "0.01", "--cache", str(cache), "--out", str(tmp_path / "diet.json")]
    subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    diet = json.loads((tmp_path / "diet.json").read_text())
    (row,) = diet["rows"]
    assert row["answered"] == seed["answered"][0]
    assert row["student_accuracy"] == seed["noisy"][0][0]


@pytest.mark.slow
def test_diet_services_experiment_runs_the_networked_consortium(tmp_path: Path) -> None:
    out = tmp_path / "services.json"
    # Two jobs of 512 queries (eps 1000, then 1400): a third of eps 2000 and 4000's 3,072
    # queries; the consortium's start-up is most of what is left.
    args = ["--hospitals", "3", "--teachers", "2", "--budgets", "1000,1400", "--seeds", "1"]
    cmd = [sys.executable, "-m", "experiments.diet_services", "--out", str(out), "--quick"]
    subprocess.run(
        [*cmd, *args, "--test", "200"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
        check=True,
    )
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["epsilon"] for r in rows] == [1000.0, 1400.0]
    # The second budget adds queries to the first's: a prefix, as in central mode.
    assert 0 < rows[0]["queries"] < rows[1]["queries"]
    for r in rows:
        assert r["teachers"] == 6 and r["answered"] == r["queries"]
        assert all(0 < eps <= r["epsilon"] for eps in r["epsilon_spent"].values())
        assert 0.0 <= r["student_accuracy"] <= 1.0 and r["test_examples"] == 200
    assert result["summary"] == diet_services.summarise(rows)


def test_labeldp_table_quick(tmp_path: Path) -> None:
    from experiments.labeldp_table import claims, summarise

    result: dict[str, Any] = run(
        "experiments.labeldp_table",
        tmp_path / "labeldp.json",
        "--quick",
        "--epsilons",
        "1,4",
        "--cache",
        str(tmp_path / "cache"),
    )
    rows = result["rows"]
    assert {(r["method"], r["budget"]) for r in rows} == {
        (m, e) for m in ("alibi", "rr", "pate-fm") for e in (1.0, 4.0)
    }
    assert result["table"] == summarise(rows) and result["claims"] == claims(rows)
    assert result["claims"]["no_audit_refutes_a_claim"]
    for r in rows:
        assert r["audit"]["canaries"] == 20 and r["epsilon"] <= r["budget"] + 1e-12


@pytest.mark.slow
def test_a_side_by_side_capc_cell_counts_its_bytes_through_the_services(tmp_path: Path) -> None:
    """A tiny breast-cancer cell of the side-by-side grid through the networked
    services: the relay in front of the guardian counts every row's bytes, job by job,
    and more queries cost more bytes."""
    from experiments.side_by_side.capc_runs import CapcConfig, Cell, run_cell
    from experiments.side_by_side.data import split
    from experiments.side_by_side.wire import MEASURED

    # 2 teachers a hospital: eps 2 buys 4 queries, eps 5 buys 20 (a second job of 16).
    config = CapcConfig(
        epsilons=(2.0, 5.0),
        teachers=2,
        table_epochs=1,
        table_teacher_epochs=5,
        table_loop_epochs=5,
    )
    rows = run_cell(Cell(split("breast-cancer", 1), 24, config, tmp_path, lambda _: None))
    # The CaPC loop runs on a table too: hospital 0's MLP, no pretrained body.
    assert {r["method"] for r in rows} == {"capc-diet-student", "capc-pate-public", "capc-loop"}
    loop = [r for r in rows if r["method"] == "capc-loop"]
    assert {r["unlabelled"] for r in loop} == {76} and loop[0]["querier_setup_bytes"] > 0
    assert all(0.0 <= r["accuracy_before"] <= 1.0 for r in loop)
    setup = {r["consortium_setup_bytes"] for r in rows}
    assert len(setup) == 1 and setup.pop() > 0
    for method in ("capc-diet-student", "capc-pate-public", "capc-loop"):
        low, high = sorted((r for r in rows if r["method"] == method), key=lambda r: r["epsilon"])
        assert (low["queries"], high["queries"]) == (4, 20)
        assert low["bytes_measured"] == high["bytes_measured"] == MEASURED
        assert len(low["job_bytes"]) == 1 and len(high["job_bytes"]) == 2
        assert high["job_bytes"][0] == low["job_bytes"][0] == low["bytes_sent"] > 0
        assert high["bytes_sent"] == sum(high["job_bytes"])
        # 16 queries cost more than 4, and each query at least its shares' 2PC (kBs).
        assert high["job_bytes"][1] > low["job_bytes"][0]
        assert high["job_bytes"][1] > 16 * 1000
