"""The multi-label mechanism advisor: what it proposes, and that its noise fits the plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from capc.data.multilabel import ATTRIBUTE_TABLE
from capc.planning.advisor import LabelStatistics, recommend
from capc.privacy import planning, rdp
from capc.privacy.conversion import DEFAULT_ORDERS


def test_few_subsets_and_small_k_favour_powerset() -> None:
    stats = LabelStatistics.from_labels(ATTRIBUTE_TABLE)
    assert stats.num_labels == 5 and stats.distinct_subsets == 7
    assert stats.mean_l2 == pytest.approx(1.39993, rel=1e-4)
    rec = recommend(stats, num_teachers=50, queries=1000, epsilon=10.0, delta=1e-5)
    assert rec.best.mechanism == "powerset"
    assert {o.mechanism for o in rec.options} == {"binary", "tau", "powerset"}


def test_sparse_labels_over_many_classes_favour_tau_slightly_above_the_mean_norm() -> None:
    stats = LabelStatistics(num_labels=20, mean_l2=1.3, distinct_subsets=5000)
    rec = recommend(stats, num_teachers=100, queries=1000, epsilon=8.0, delta=1e-5)
    assert rec.best.mechanism == "tau" and "Powerset not considered" in rec.reason
    assert rec.best.tau == pytest.approx(1.43)
    binary = next(o for o in rec.options if o.mechanism == "binary")
    assert rec.best.sigma < binary.sigma


def test_tau_is_not_proposed_where_no_task_could_run_it() -> None:
    """Over 30 sparse labels tau would win, but a task of it has no vote statement and is
    refused (issue 41): the advisor says so and proposes what can run."""
    stats = LabelStatistics(num_labels=30, mean_l2=1.3, distinct_subsets=5000)
    rec = recommend(stats, num_teachers=100, queries=1000, epsilon=8.0, delta=1e-5)
    assert {o.mechanism for o in rec.options} == {"binary"}
    assert "tau not considered (over 30 labels at tau 1.43" in rec.reason
    # At 26 labels, tau 1.43 < 2 still has its statement.
    near = LabelStatistics(num_labels=26, mean_l2=1.3, distinct_subsets=5000)
    assert recommend(near, 100, 1000, 8.0, 1e-5).best.mechanism == "tau"


def test_dense_labels_favour_binary_when_tau_cannot_clip() -> None:
    stats = LabelStatistics(num_labels=4, mean_l2=2.0, distinct_subsets=16)
    rec = recommend(stats, num_teachers=30, queries=100, epsilon=4.0, delta=1e-5)
    # Every subset occurs, so Powerset is not considered; tau cannot clip below sqrt(k), so the
    # tie goes to Binary, which needs no fixed point.
    assert rec.best.mechanism == "binary" and "Powerset not considered" in rec.reason
    # With tau at sqrt(k) the two charges coincide: no reason to clip.
    tau = next(o for o in rec.options if o.mechanism == "tau")
    assert tau.tau == pytest.approx(2.0) and tau.sigma == pytest.approx(
        next(o for o in rec.options if o.mechanism == "binary").sigma
    )


@pytest.mark.parametrize("mechanism", ["binary", "tau", "powerset"])
def test_advised_noise_spends_exactly_the_budget(mechanism: str) -> None:
    stats = LabelStatistics(5, 1.4, 7)
    rec = recommend(stats, 50, 600, 6.0, 1e-5)
    opt = next(o for o in rec.options if o.mechanism == mechanism)

    def unit(s: float) -> np.ndarray:
        if mechanism == "binary":
            return rdp.multilabel_binary(5, s, DEFAULT_ORDERS)
        if mechanism == "tau":
            return rdp.multilabel_tau(5, float(opt.tau or 0), s, DEFAULT_ORDERS)
        return rdp.multilabel_powerset(s, DEFAULT_ORDERS)

    spent = planning.epsilon_after(unit(opt.sigma), DEFAULT_ORDERS, 600, 1e-5).epsilon
    assert spent == pytest.approx(6.0, rel=1e-6)
    assert planning.epsilon_after(unit(0.99 * opt.sigma), DEFAULT_ORDERS, 600, 1e-5).epsilon > 6.0


def test_bad_statistics_are_refused() -> None:
    with pytest.raises(ValueError, match="mean_l2"):
        LabelStatistics(3, 2.0, 4)
    with pytest.raises(ValueError, match="distinct_subsets"):
        LabelStatistics(3, 1.0, 9)
    with pytest.raises(ValueError, match="0/1"):
        LabelStatistics.from_labels(np.array([[0, 2]]))


def test_cli_reads_a_label_file(tmp_path: Path) -> None:
    np.save(tmp_path / "labels.npy", ATTRIBUTE_TABLE)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.commands.cli",
            "privacy",
            "advise",
            "--labels-file",
            str(tmp_path / "labels.npy"),
            "--teachers",
            "50",
            "--queries",
            "1000",
            "--epsilon",
            "10",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["mechanism"] == "powerset" and set(result["options"]) == {
        "binary",
        "tau",
        "powerset",
    }
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.commands.cli",
            "privacy",
            "advise",
            "--labels",
            "5",
            "--teachers",
            "5",
            "--queries",
            "10",
            "--epsilon",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "--mean-l2" in bad.stderr
