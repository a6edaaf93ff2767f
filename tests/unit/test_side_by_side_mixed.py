"""Mixed models (issue 52, scenario c) and DP-trained teachers on tables (scenario d): who
federates with whom, the closed hospital's votes are onnxruntime's, every row names its
hospital and architecture, and a mixed-models row missing from the docs' tables is
caught."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from experiments.side_by_side import baselines, dp_tables, mixed, summary
from experiments.side_by_side.data import TUNING_SEED, split
from experiments.side_by_side.dp_capc import TeacherConfig
from experiments.side_by_side.scenarios import MIXED_ARCHITECTURES, transform, tuning_split
from experiments.side_by_side.training import Config, inputs, predict
from tests.unit.test_side_by_side_scenarios import _tiny

ROOT = Path(__file__).resolve().parents[2]


def test_federations_share_one_architecture_and_leave_the_closed_model_out() -> None:
    closed = MIXED_ARCHITECTURES.index(mixed.CLOSED)
    members = [i for group in mixed.FEDERATIONS.values() for i in group]
    assert closed not in members
    assert sorted(members) == [i for i, a in enumerate(MIXED_ARCHITECTURES) if a != mixed.CLOSED]
    for arch, group in mixed.FEDERATIONS.items():
        assert len(group) >= 2 and {MIXED_ARCHITECTURES[i] for i in group} == {arch}
        # Each federation is tuned on its own architecture's DP-FedAvg points only.
        assert {c.architecture for c in baselines.grid("animal-mnist", "dp_fedavg", (arch,))} == {
            arch
        }
    # Every hospital's alone grid is at most the baselines' tuning effort.
    assert all(len(g) <= baselines.MAX_GRID for g in mixed.ALONE_GRID.values())


def test_the_closed_model_answers_through_onnxruntime_as_its_torch_model(tmp_path: Path) -> None:
    s = _tiny(1)
    torch.manual_seed(0)
    x = inputs(s, "diet-linear", None)
    head = nn.Linear(x.shape[1], s.classes)
    closed = mixed.ClosedBuilder(s, tmp_path)
    run = closed(head)
    assert list(tmp_path.glob("*.onnx")), "the closed model is an ONNX file"
    idx = np.concatenate([s.test, s.shares[0]])
    # The exported graph (body, public standardisation, head) votes as the head on the
    # features every other diet-linear model reads.
    assert np.array_equal(run(s.x[idx]), predict(head, x[idx]))
    # Another head gives other votes: the check could fail.
    other = nn.Linear(x.shape[1], s.classes)
    assert not np.array_equal(closed(other)(s.x[idx]), run(s.x[idx]))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mixed_models_rows_name_hospitals_and_keep_the_closed_one_out_of_fedavg(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cnn = Config("small-cnn", lr=1e-3, epochs=1, batch=32)
    monkeypatch.setattr(
        mixed,
        "ALONE_GRID",
        {
            "diet-linear": (Config("diet-linear", l2=1e-2),),
            "small-cnn": (cnn, Config("linear", l2=1e-1)),
            "onnx": (Config("diet-linear", l2=1e-2),),
        },
    )
    one = (TeacherConfig(3, 0.5),)
    monkeypatch.setattr(mixed, "TEACHER_GRIDS", {"diet-linear": one, "linear": one})
    fed = {
        "diet-linear": Config("diet-linear", lr=0.05, epochs=1, batch=32, clip=1.0, rounds=1),
        "small-cnn": Config("small-cnn", lr=2e-3, epochs=1, batch=32, clip=1.0, rounds=1),
    }
    monkeypatch.setattr(baselines, "grid", lambda dataset, method, archs: (fed[archs[0]],))
    rows: list[dict[str, Any]] = []
    mixed.run(
        lambda seed: transform(_tiny(seed), "mixed-models", None),
        tuning_split(_tiny(TUNING_SEED), "mixed-models", None),
        [5.0],
        [1],
        None,
        lambda _: None,
        rows.extend,
    )
    got = {(r["method"], r["hospital"]) for r in rows}
    named = [mixed.hospital_name(i) for i in range(5)]
    assert (
        got
        == {
            *(("alone", h) for h in named),
            *(("capc-dp-loop", h) for h in named[:4]),  # the closed hospital cannot retrain
            *(("dp_fedavg", h) for h in named[:4]),  # nor federate
            ("capc-dp-pate-public", None),  # a model any hospital may receive
        }
    )
    for r in rows:
        assert r["scenario"] == "mixed-models" and r["seed"] == 1
        assert r["architecture"] and 0.0 <= r["accuracy"] <= 1.0
        if r["hospital"] is not None:
            assert r["architecture"] == MIXED_ARCHITECTURES[int(r["hospital"].split()[-1])]
    for r in rows:
        if r["method"] == "dp_fedavg":
            members = r["federation"]
            assert r["hospital"] in members
            assert len({MIXED_ARCHITECTURES[int(h.split()[-1])] for h in members}) == 1
            assert r["epsilon_spent"] <= 5.0 * (1 + 1e-6)
        if r["method"] == "capc-dp-loop":
            assert r["querier"] == int(r["hospital"].split()[-1])
            assert 0 <= r["kept"] <= r["labels"] == len(_tiny(1).public)
    closed = next(r for r in rows if r["method"] == "alone" and r["hospital"] == named[4])
    assert closed["scored_through"] == "onnxruntime"


def test_dp_table_teachers_label_every_method_on_a_tiny_breast_cancer_split() -> None:
    s = transform(split("breast-cancer", 1), "iid", 50)
    rows = dp_tables.rows_for(s, 50, 5.0, TeacherConfig(3, 0.5), dp_tables.METHODS, print)
    assert {r["method"] for r in rows} == set(dp_tables.METHODS)
    loop = next(r for r in rows if r["method"] == "capc-dp-loop")
    assert loop["labels"] == len(s.unlabelled(0, 50)) > 0
    assert loop["gain"] == loop["accuracy"] - loop["accuracy_before"]
    pate = next(r for r in rows if r["method"] == "capc-dp-pate-public")
    assert pate["queries"] == len(s.public)
    assert all(r["neighbouring"].startswith("replace-one") for r in rows)
    # n = all: no unlabelled rows, no loop row.
    whole = transform(split("breast-cancer", 1), "iid", None)
    made = dp_tables.rows_for(whole, None, 5.0, TeacherConfig(3, 0.5), dp_tables.METHODS, print)
    assert {r["method"] for r in made} == {"capc-dp-student", "capc-dp-pate-public"}


def missing_from_tables(table: list[dict[str, Any]], text: str) -> list[str]:
    """Every mixed-models summary entry whose accuracy is not in its hospital's table in
    ``text`` (a (hospital, n) table: its heading, then its rows up to a blank line)."""
    missing = []
    blocks = text.split("\n\n")
    for e in table:
        if e["scenario"] != summary.MIXED:
            continue
        arch = e.get("architecture", "") if e["hospital"] is not None else ""
        heading = summary._scenario_heading(
            e["dataset"], e["scenario"], e["hospital"], e["n"], arch
        )
        # The heading names the architecture of the cell's rows (any of them).
        found = [
            b
            for i, b in enumerate(blocks)
            if i and blocks[i - 1].startswith(heading.split(" (")[0])
        ]
        want = f"| {summary.METHODS[e['method']]} |"
        cell = summary._cell(e)
        if not any(
            line.startswith(want) and cell in line for b in found for line in b.splitlines()
        ):
            missing.append(f"{e['hospital']} {e['method']} eps {e['epsilon']}")
    return missing


def test_every_mixed_models_row_is_in_the_docs_table() -> None:
    saved = json.loads((ROOT / "experiments/results/side-by-side.json").read_text())
    table = summary.table(saved["rows"])
    mine = [e for e in table if e["scenario"] == summary.MIXED]
    assert mine, "no mixed-models rows saved"
    hospitals = {e["hospital"] for e in mine}
    assert {f"hospital {i}" for i in range(5)} <= hospitals
    text = (ROOT / "docs/results.md").read_text()
    assert missing_from_tables(table, text) == []
    # The check fails when a row is dropped from the docs.
    e = next(x for x in mine if x["method"] == "capc-dp-loop")
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith(f"| {summary.METHODS[e['method']]} |") and summary._cell(e) in ln
    )
    assert missing_from_tables(table, text.replace(line + "\n", "", 1)) != []


def test_the_headline_offers_the_student_to_a_hospital_that_cannot_retrain() -> None:
    saved = json.loads((ROOT / "experiments/results/side-by-side.json").read_text())
    standing = {
        s["hospital"]: s
        for s in summary.standings(summary.table(saved["rows"]))
        if s["scenario"] == summary.MIXED
    }
    closed = mixed.hospital_name(MIXED_ARCHITECTURES.index(mixed.CLOSED))
    # Its only capc option is the student that names no hospital; the headline still
    # weighs it against the closed hospital's own model.
    assert standing[closed]["capc"]["method"] == "capc-dp-pate-public"
    assert standing[closed]["architecture"] == mixed.CLOSED
    assert set(standing) == {mixed.hospital_name(i) for i in range(5)}
