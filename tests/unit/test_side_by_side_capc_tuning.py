"""capc's tuning run: as much tuning as the baselines, priced as the services price,
scored on the tuning records and never on the test records."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any

import numpy as np
import pytest
import torch
from numpy.typing import NDArray

from capc.data.offline import animal_mnist
from capc.learning.semi_supervised import fit_student_head
from capc.learning.supervised import accuracy
from capc.mechanisms import from_config
from capc.models import load_teacher
from capc.models.inference import features, logits, reference_statistics
from experiments.side_by_side import capc_tuning as tuning
from experiments.side_by_side import tuner as tuner_core
from experiments.side_by_side.baselines import MAX_GRID
from experiments.side_by_side.capc_runs import CapcConfig, scaled_task, teachers_per_hospital
from experiments.side_by_side.data import LAYOUTS, TUNING_SEED, Split, split
from experiments.side_by_side.table_tuning import TableTuner
from services.commands.demo import SHIPPED_BODY
from services.commands.up import queries_fit
from services.student.training import OWN_BATCH, STUDENT_L2


def test_the_grids_are_as_small_as_the_baselines_and_start_with_the_shipped_rule() -> None:
    assert tuning.MAX_GRID == MAX_GRID
    hospitals = LAYOUTS["animal-mnist"].hospitals
    for n in (50, 200, 1000, 1348):
        m0 = teachers_per_hospital("animal-mnist", n)
        for grid in (tuning.student_grid(n, hospitals), tuning.loop_grid(n, hospitals)):
            assert 1 <= len(grid) <= MAX_GRID
            assert len({c.name for c in grid}) == len(grid)
            shipped = grid[0]
            assert shipped.name.startswith("shipped")
            assert shipped.teachers == m0
            assert shipped.mechanism == scaled_task("animal-mnist", hospitals * m0)["mechanism"]
            for c in grid:
                c.build()  # every config is a valid mechanism
                # Distributed rounds take offset-robust mechanisms only.
                assert c.build().offset_robust


@pytest.mark.parametrize("epsilon", CapcConfig().epsilons)
def test_gnmax_rounds_buy_what_capc_runs_prices_a_row_at(epsilon: float) -> None:
    c = tuning.student_grid(1348, 5)[0]
    mech = c.build()
    want = queries_fit(c.task(), epsilon)
    assert tuner_core.admitted(np.ones(want + 1000, dtype=bool), mech, epsilon) == want


def test_a_confident_filter_buys_more_where_fewer_are_answered() -> None:
    mech = from_config(tuning.robust(250, 0.5, 0.2), 10)
    task = {**scaled_task("animal-mnist", 250), "mechanism": mech.to_config()}
    worst = queries_fit(task, 10.0)
    pool = 20 * worst
    every = tuner_core.admitted(np.ones(pool, dtype=bool), mech, 10.0)
    assert every == worst
    rng = np.random.default_rng(0)
    some = tuner_core.admitted(rng.random(pool) < 0.2, mech, 10.0)
    none = tuner_core.admitted(np.zeros(pool, dtype=bool), mech, 10.0)
    assert worst < some < none < pool
    # A declined query costs its test alone (mu**2 = 2 / 50**2), an answered one the
    # answer too (2 / 40**2): tests alone buy 1 + (50 / 40)**2 times as many.
    assert none == pytest.approx(worst * (1 + (50 / 40) ** 2), rel=0.01)


def _poisoned(s: Split) -> Split:
    """``s`` with its test records replaced by noise and their classes shifted."""
    x, y = s.x.copy(), s.y.copy()
    x[s.test] = np.random.default_rng(1).random(x[s.test].shape, dtype=np.float32)
    y[s.test] = (y[s.test] + 1) % s.classes
    return dataclasses.replace(s, x=x, y=y)


def _tiny(n: int, hospitals: int) -> list[tuner_core.Candidate]:
    return [tuner_core.Candidate("shipped: tiny", 1, tuning.gnmax(hospitals, 8.0))]


@pytest.mark.slow
# Four tuning runs: about 3 minutes of CPU, past pytest-timeout's 600 s on a busy
# enough machine; a loaded machine must not fail it.
@pytest.mark.timeout(2400)
def test_tuning_never_reads_the_test_records() -> None:
    s = split("animal-mnist", TUNING_SEED)
    bad = _poisoned(s)
    # n = 1340 leaves hospital 0 eight unlabelled records: a loop in seconds.
    kw: dict[str, Any] = {
        "sizes": [50],
        "pool": 256,
        "log": lambda _: None,
        "grid": _tiny,
        "loops": _tiny,
    }
    rows = tuning.run(s, loop_sizes=[1340], **kw)
    assert rows == tuning.run(bad, loop_sizes=[1340], **kw)
    methods = {r["method"] for r in rows}
    assert methods == {"capc-diet-student", "capc-loop", "alone (hospital 0)"}
    assert any(r["tuning_accuracy"] is not None for r in rows if r["method"] == "capc-loop")
    # The poisoning does reach whatever reads the test records.
    good = tuning.run(s, loop_sizes=[], score_on=s.test, **kw)
    worse = tuning.run(bad, loop_sizes=[], score_on=bad.test, **kw)
    assert [r["tuning_accuracy"] for r in good] != [r["tuning_accuracy"] for r in worse]


@pytest.mark.slow  # 21 s: its tuning run labels every public record; in `make test`
def test_pate_public_buys_labels_for_the_public_records_at_most_all_of_them() -> None:
    s = split("animal-mnist", TUNING_SEED)
    tuner = tuner_core.Tuner(s, 256, lambda _: None)
    c = _tiny(50, s.hospitals)[0]
    rows = tuner.pate_public(50, c)
    assert [r["epsilon"] for r in rows] == list(tuner_core.EPSILONS)
    for r in rows:
        assert r["method"] == "capc-pate-public" and r["config"]["name"] == c.name
        # GNMax answers every query: the count the services' rows are priced at.
        assert (
            r["queries"] == r["labels"] == min(len(s.public), queries_fit(c.task(), r["epsilon"]))
        )
    assert rows[-1]["pool_exhausted"] == (rows[-1]["queries"] == len(s.public))
    assert {p["method"] for p in tuning.chosen(rows)} == {"capc-pate-public"}


def test_breast_cancers_grid_is_the_same_grid_at_its_own_shipped_share() -> None:
    hospitals = LAYOUTS["breast-cancer"].hospitals
    for n in (50, 100):
        grid = tuning.student_grid(n, hospitals, "breast-cancer")
        assert 1 <= len(grid) <= MAX_GRID
        assert [c.name for c in grid] == [c.name for c in tuning.student_grid(n, 5)]
        m0 = teachers_per_hospital("breast-cancer", n)
        shipped = scaled_task("breast-cancer", hospitals * m0)["mechanism"]
        assert (grid[0].teachers, grid[0].mechanism) == (m0, shipped)
        for c in grid:
            assert c.build(2).offset_robust
    # sigma 23 for 3 x 8 teachers, as the shipped task
    assert tuning.student_grid(100, hospitals, "breast-cancer")[0].mechanism["sigma"] == 23.0


def _tiny_table(n: int, hospitals: int) -> list[tuner_core.Candidate]:
    share = tuning.SIGMA_SHARES["breast-cancer"]
    return [tuner_core.Candidate("shipped: tiny", 2, tuning.gnmax(hospitals * 2, 1.0, share))]


#: Fewer epochs than the shipped 100 for the table teachers and the loop's MLPs: the
#: same code paths, a fifth of the training.
_TABLE_EPOCHS = CapcConfig(table_teacher_epochs=20, table_loop_epochs=20)


def _run_table(
    s: Split, score_on: NDArray[np.int64] | None = None, **kw: Any
) -> list[dict[str, Any]]:
    """``tuning.run`` on a table split with a tuner of :data:`_TABLE_EPOCHS`."""
    tuner = TableTuner(s, kw["pool"], kw["log"], score_on, config=_TABLE_EPOCHS)
    return tuning.run(s, score_on=score_on, tuner=tuner, **kw)


def test_breast_cancer_tuning_never_reads_the_test_records() -> None:
    s = split("breast-cancer", TUNING_SEED)
    bad = _poisoned(s)
    kw: dict[str, Any] = {
        "sizes": [50],
        "pate_sizes": [50],
        "pool": 512,
        "log": lambda _: None,
        "grid": _tiny_table,
    }
    rows = _run_table(s, loop_sizes=[], **kw)
    assert rows == _run_table(bad, loop_sizes=[], **kw)
    assert {r["method"] for r in rows} == {"capc-diet-student", "capc-pate-public"}
    assert {r["dataset"] for r in rows} == {"breast-cancer"}
    for r in rows:
        assert r["tuning_accuracy"] is not None
        task = {**scaled_task("breast-cancer", 6), "mechanism": r["config"]["mechanism"]}
        most = len(s.public) if r["method"] == "capc-pate-public" else 512
        assert r["queries"] == r["labels"] == min(most, queries_fit(task, r["epsilon"]))
    good = _run_table(s, loop_sizes=[], score_on=s.test, **kw)
    worse = _run_table(bad, loop_sizes=[], score_on=bad.test, **kw)
    assert [r["tuning_accuracy"] for r in good] != [r["tuning_accuracy"] for r in worse]
    # The loop (hospital 0's MLP on its rows and the bought labels) reads no test row
    # either, and is scored on whatever it is told to be scored on.
    loop_kw = {**kw, "sizes": [], "pate_sizes": [], "loops": _tiny_table}
    loop = _run_table(s, loop_sizes=[50], **loop_kw)
    assert loop == _run_table(bad, loop_sizes=[50], **loop_kw)
    assert [r["method"] for r in loop] == ["alone (hospital 0)"] + ["capc-loop"] * 4
    own = s.labelled(0, 50)
    for r in loop[1:]:
        task = {**scaled_task("breast-cancer", 6), "mechanism": r["config"]["mechanism"]}
        assert r["queries"] == r["labels"] == min(50, queries_fit(task, r["epsilon"]))
        assert r["accuracy_alone"] == loop[0]["tuning_accuracy"] and len(own) == 50
    on_test = _run_table(s, loop_sizes=[50], score_on=s.test, **loop_kw)
    on_bad = _run_table(bad, loop_sizes=[50], score_on=bad.test, **loop_kw)
    assert [r["tuning_accuracy"] for r in on_test] != [r["tuning_accuracy"] for r in on_bad]
    # Its grid is the images' at the table's share of the vote: 4 teachers a hospital at
    # n = 50, sigma 11.5 for 3 x 4 voters, as the consortium's task sets it.
    grid = tuning.loop_grid(50, 3, "breast-cancer")
    assert [c.name for c in grid] == [c.name for c in tuning.loop_grid(50, 3)]
    assert {c.teachers for c in grid} == {4}
    assert grid[0].mechanism == scaled_task("breast-cancer", 12)["mechanism"]


def test_picks_are_per_dataset_and_ties_go_to_what_the_services_run() -> None:
    def row(dataset: str, name: str, acc: float, labels: str = "retrain") -> dict[str, Any]:
        config = {"name": name, "teachers": 4, "mechanism": {}, "labels": labels}
        return {
            "dataset": dataset,
            "method": "capc-loop",
            "n": 50,
            "epsilon": 1.0,
            "config": config,
            "tuning_accuracy": acc,
        }

    rows = [row("a", "shipped", 0.5), row("a", "other", 0.6)]
    rows += [row("b", "shipped", 0.7), row("b", "other", 0.6)]
    picks = {p["dataset"]: p["chosen"] for p in tuning.chosen(rows)}
    assert picks == {"a": "other", "b": "shipped"}
    # A row of another dataset at the same (method, n, eps, name) is not replaced.
    assert len(tuning._merged(rows[:2], rows[2:])) == 4
    # Tied: the first configuration the services can run, not the first in the grid.
    loop = [
        row("a", "shipped loop", 0.5),
        row("a", "agree", 0.7, "agree"),
        row("a", "own x4", 0.7, "own-x4"),
    ]
    assert [p["chosen"] for p in tuning.chosen(loop)] == ["own x4"]
    alone = [row("a", "shipped loop", 0.5), row("a", "agree", 0.7, "agree")]
    assert [p["chosen"] for p in tuning.chosen(alone)] == ["agree"]


def test_a_scorer_scores_a_head_as_accuracy_scores_the_whole_student() -> None:
    """The Scorer's shortcut (body statistics and features once, then a head) against
    the student service's path: the head put on a copy of the body, ``reference_statistics``
    over the whole model, ``accuracy`` of it. Equal bit for bit, predictions included."""
    body = load_teacher(SHIPPED_BODY).model.eval()
    before = {k: v.clone() for k, v in body.state_dict().items()}
    x, y = animal_mnist()
    order = np.random.default_rng(0).permutation(len(x))
    fit_on, reference, scored, other = np.split(order[:392], [96, 128, 328])
    # The same batches: the Scorer reads records in those ``accuracy`` reads them in
    # (a few hundred records here, one batch, keep the test fast).
    assert inspect.signature(accuracy).parameters["batch"].default == tuner_core.SCORE_BATCH
    # The fit's features as the trainer's queries give them: current statistics.
    feats = features(body, x[fit_on], current_statistics=True, batch=OWN_BATCH)
    labels = y[fit_on]
    scorer = tuner_core.Scorer(body, x[reference], (x[scored], y[scored]))
    head = scorer.head(feats, labels)

    # What ModelTrainer._fit_pretrained does with a head fitted to those features.
    model = copy.deepcopy(body)
    model.head = fit_student_head(  # type: ignore[assignment]
        "none",
        model,
        feats,
        labels,
        x[fit_on],
        body.head.out_features,
        batch=OWN_BATCH,
        l2=STUDENT_L2,
    )
    reference_statistics(model, x[reference])

    assert scorer.accuracy(head) == accuracy(model, x[scored], y[scored])
    # The same passes: the features the whole model's head reads in ``accuracy``'s
    # batches, bit for bit (a pass in other batches can differ in the last bits).
    assert torch.equal(scorer.features, features(model, x[scored], batch=tuner_core.SCORE_BATCH))
    want = logits(model, x[scored]).argmax(1).numpy()
    np.testing.assert_array_equal(scorer.predict(head), want)
    # Records other than the scored ones (the loop's own view of its unlabelled records).
    np.testing.assert_array_equal(
        scorer.predict(head, x[other]), logits(model, x[other]).argmax(1).numpy()
    )
    # Not a vacuous equality: the head learnt something, and not one class everywhere.
    assert scorer.accuracy(head) > 0.3 and len(np.unique(want)) > 2
    # The body the Scorer was given is left as it was.
    after = body.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())
