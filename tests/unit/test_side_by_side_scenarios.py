"""Issue 52's consortia and DP-teacher methods: the split transforms deal what they
claim, tuning pools never overlap a reported seed's hospitals, and the new methods
run end to end on a tiny split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from experiments.side_by_side import dp_capc
from experiments.side_by_side.__main__ import key, merged
from experiments.side_by_side.data import TUNING_SEED, Split, split
from experiments.side_by_side.scenarios import ScenarioSplit, transform, tuning_split

SEEDS = range(0, 8)


def _pool(s: Split) -> np.ndarray:
    return np.sort(np.concatenate(s.shares))


@pytest.mark.parametrize("alpha", ["skew-0.1", "skew-0.5"])
def test_dirichlet_skew_is_seeded_and_deals_every_pool_record_once(alpha: str) -> None:
    base = split("animal-mnist", 1)
    a, b = transform(base, alpha, None), transform(split("animal-mnist", 1), alpha, None)
    for p, q in zip(a.shares, b.shares, strict=True):
        assert np.array_equal(p, q)
    other = transform(split("animal-mnist", 2), alpha, None)
    assert any(
        len(p) != len(q) or (p != q).any() for p, q in zip(a.shares, other.shares, strict=True)
    )
    dealt = np.concatenate(a.shares)
    assert len(np.unique(dealt)) == len(dealt)  # no record twice
    assert np.array_equal(np.sort(dealt), _pool(base))  # every record of the pool
    # Every record labelled; rows report the iid n = all.
    assert [len(a.labelled(i, None)) for i in range(5)] == [len(p) for p in a.shares]
    assert a.size(None) == base.size(None)


def test_a_small_alpha_skews_the_labels_and_a_larger_one_less() -> None:
    base = split("animal-mnist", 1)

    def worst(scenario: str) -> float:
        s = transform(base, scenario, None)
        # The largest share of one class in any hospital (iid: about 0.1).
        return float(max(np.bincount(s.y[p], minlength=10).max() / len(p) for p in s.shares))

    iid = max(np.bincount(base.y[p], minlength=10).max() / len(p) for p in base.shares)
    assert iid < 0.2 < worst("skew-0.5") <= 1.0
    assert worst("skew-0.1") > 0.5


@pytest.mark.parametrize("n", [50, 200])
def test_small_querier_labels_exactly_n_of_its_records_and_the_others_all(n: int) -> None:
    base = split("animal-mnist", 3)
    s = transform(base, "small-querier", n)
    assert len(s.labelled(0, n)) == n and s.size(n) == n
    assert np.array_equal(s.labelled(0, n), base.shares[0][:n])
    assert np.array_equal(np.concatenate([s.labelled(0, n), s.unlabelled(0, n)]), base.shares[0])
    for i in range(1, 5):
        assert np.array_equal(s.labelled(i, n), base.shares[i])
        assert len(s.unlabelled(i, n)) == 0
    with pytest.raises(ValueError, match="made for n=50"):
        transform(base, "small-querier", 50).labelled(0, 200)


@pytest.mark.parametrize("scenario", ["iid", "small-querier", "skew-0.1", "mixed-models"])
def test_tuning_pools_never_hold_a_record_of_any_seeds_hospitals(scenario: str) -> None:
    n = None if scenario.startswith("skew") else 50
    t = tuning_split(split("animal-mnist", TUNING_SEED), scenario, n)
    dealt = np.concatenate(t.shares)
    assert len(t.test) == 0  # nothing tuned can read the test records
    assert not np.intersect1d(dealt, t.tuning).size  # scored on records it never trains on
    scored = split("animal-mnist", 1)
    assert np.array_equal(t.tuning, scored.public)
    assert not np.intersect1d(t.tuning, scored.test).size
    for seed in SEEDS:  # the attack: any seed's hospital pool, the tuning seed's included
        assert not np.intersect1d(dealt, _pool(split("animal-mnist", seed))).size
    # The same pseudo-consortium whichever split it is made from (roles are fixed).
    again = tuning_split(split("animal-mnist", 5), scenario, n)
    for p, q in zip(t.shares, again.shares, strict=True):
        assert np.array_equal(p, q)
    if scenario == "small-querier":
        assert len(t.labelled(0, t.grid_n)) == 50 < len(t.shares[0])


def test_the_row_key_tells_scenarios_and_hospitals_apart() -> None:
    row: dict[str, Any] = {"dataset": "d", "method": "alone", "n": 50, "epsilon": None, "seed": 1}
    skew = {**row, "scenario": "skew-0.1"}
    assert key(row) == key({**row, "scenario": "iid"}) != key(skew)
    assert len(merged([row], [skew])) == 2
    assert len(merged([{**row, "hospital": 0}], [{**row, "hospital": 1}])) == 2
    assert merged([row], [{**row, "accuracy": 1.0}]) == [{**row, "accuracy": 1.0}]


def test_the_plurality_breaks_ties_to_the_lower_class() -> None:
    class Fixed(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.c = c
            self.unused = nn.Parameter(torch.zeros(1))  # a model has a device

        def forward(self, x: Any) -> Any:
            out = torch.zeros(len(x), 3)
            out[:, self.c] = 1.0
            return out

    x = np.zeros((4, 2), dtype=np.float32)
    assert dp_capc.plurality([Fixed(2), Fixed(1)], x, 3).tolist() == [1] * 4
    assert dp_capc.plurality([Fixed(2), Fixed(1), Fixed(2)], x, 3).tolist() == [2] * 4


def _tiny(seed: int) -> Split:
    """A few hundred animal-mnist records in the same roles (fast body features)."""
    s = split("animal-mnist", seed)
    parts = [s.test[:60], s.reference[:64], s.tuning[:100], s.public[:100]]
    parts += [p[:40] for p in s.shares]
    keep = np.concatenate(parts)
    cuts = np.cumsum([len(p) for p in parts])[:-1]
    idx = np.split(np.arange(len(keep), dtype=np.int64), cuts)
    return Split(
        s.dataset,
        seed,
        s.x[keep],
        s.y[keep],
        s.classes,
        idx[0],
        idx[1],
        idx[2],
        idx[3],
        tuple(idx[4:]),
    )


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_dp_teacher_methods_run_on_a_tiny_split_and_say_how(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dp_capc, "QUERIES", 256)
    monkeypatch.setattr(dp_capc, "TEACHER_GRID", (dp_capc.TeacherConfig(5, 0.5),))
    rows = []
    for scenario, n in (("small-querier", 10), ("iid", 10)):

        def by_seed(seed: int, scenario: str = scenario, n: int | None = n) -> ScenarioSplit:
            return transform(_tiny(seed), scenario, n)

        tuning = tuning_split(_tiny(TUNING_SEED), scenario, n)
        rows += dp_capc.cell(by_seed, tuning, n, 5.0, [1], None, lambda _: None)
    assert {(r["scenario"], r["method"]) for r in rows} == {
        ("small-querier", "capc-dp-student"),
        ("small-querier", "capc-dp-loop"),
        ("iid", "capc-dp-student"),
        ("iid", "capc-dp-loop"),
    }
    for r in rows:
        assert r["accuracy"] is None or 0.0 <= r["accuracy"] <= 1.0
        assert r["tuned_on"].startswith("split.tuning") and len(r["tuning_grid"]) <= 8
        assert r["neighbouring"].startswith("replace-one")
        assert r["hyperparameters"]["teacher"]["steps"] == 5
    loop = next(
        r for r in rows if r["method"] == "capc-dp-loop" and r["scenario"] == "small-querier"
    )
    assert loop["labels"] == 30 and loop["gain"] == loop["accuracy"] - loop["accuracy_before"]
    student = next(r for r in rows if r["method"] == "capc-dp-student")
    assert student["queries"] == 256


def test_a_merged_part_keeps_the_command_that_made_its_rows(tmp_path: Path) -> None:
    from experiments.side_by_side.__main__ import main

    part_command = "python -m experiments.side_by_side --out part.json --scenario skew-0.1"
    row = {"dataset": "animal-mnist", "method": "alone", "n": 1348, "epsilon": None, "seed": 1}
    part = tmp_path / "part.json"
    part.write_text(
        json.dumps(
            {
                "rows": [{**row, "scenario": "skew-0.1", "accuracy": 0.5}],
                "commands": [part_command],
                "documented_as": {part_command: [part_command]},
            }
        )
    )
    out = tmp_path / "rows.json"
    out.write_text(json.dumps({"rows": [{**row, "accuracy": 0.7}], "commands": []}))
    assert main(["--out", str(out), "--add-to", "--rows-from", str(part)]) == 0
    saved = json.loads(out.read_text())
    assert saved["documented_as"][part_command] == [part_command]
    assert part_command in saved["commands"]
    # The iid row and the skew row of the same cell both stay.
    assert sorted(r["accuracy"] for r in saved["rows"]) == [0.5, 0.7]
