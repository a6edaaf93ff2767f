"""The side-by-side baselines: accounting checked by an independent accountant, tuning
blind to the test records, a real Flower DP-FedAvg run, and the rows' schema."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from experiments.side_by_side import baselines, fedavg, training
from experiments.side_by_side.data import LAYOUTS, TUNING_SEED, Split, split
from experiments.side_by_side.training import (
    ARCHITECTURES,
    Config,
    PrivateTrainer,
    build_model,
    inputs,
    noise_multiplier,
    steps_per_epoch,
)

DELTA = baselines.DELTA
LINEAR = Config("linear", lr=0.05, epochs=2, batch=25, clip=1.0, rounds=2)
#: Tiny grids (two configurations each) so a tuning run takes a second.
TINY: dict[str, tuple[Config, ...]] = {
    "non-private": (Config("linear", l2=1e-2), Config("mlp", lr=3e-3, epochs=5, batch=32)),
    "dp-sgd": (
        Config("linear", lr=0.05, epochs=3, batch=32, clip=1.0),
        Config("mlp", lr=3e-3, epochs=3, batch=64, clip=1.0),
    ),
}


@pytest.fixture
def tiny_grids(monkeypatch: pytest.MonkeyPatch) -> None:
    for family, configs in TINY.items():
        monkeypatch.setitem(baselines.GRIDS, ("breast-cancer", family), configs)


def pld_epsilon(history: list[tuple[float, float, int]]) -> float:
    """Epsilon at DELTA of Poisson-sampled Gaussian steps, by dp_accounting's PLD."""
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(
        dp_accounting.ComposedDpEvent(
            [
                dp_accounting.SelfComposedDpEvent(
                    dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), t
                )
                for z, q, t in history
            ]
        )
    )
    return float(acc.get_epsilon(DELTA))


def rdp_epsilon(sigma: float, q: float, steps: int) -> float:
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
        )
    )
    return float(acc.get_epsilon(DELTA))


def planned(config: Config, records: int) -> tuple[float, int]:
    """(sample rate, steps) of one party's whole DP training under ``config``."""
    k = steps_per_epoch(records, int(config.batch or 0))
    return 1 / k, k * int(config.epochs or 0) * int(config.rounds or 1)


def private_schedules() -> list[tuple[str, str, Config, int]]:
    """The extreme DP schedules of the real grids: per dataset and family, the one with
    the most steps and the one with the largest sample rate, over the grid's sizes
    (records per training party: pooled, all hospitals'; FedAvg, one hospital's)."""
    out = []
    for dataset, layout in LAYOUTS.items():
        share = min(len(s) for s in split(dataset, TUNING_SEED).shares)
        sizes = [share if n is None else n for n in layout.sizes]
        for family, parties in (("dp-sgd", layout.hospitals), ("dp-fedavg", 1)):
            runs = [(c, n * parties) for c in baselines.GRIDS[dataset, family] for n in sizes]
            most = max(runs, key=lambda r: planned(*r)[1])
            widest = max(runs, key=lambda r: planned(*r)[0])
            out += [(dataset, family, c, records) for c, records in {most, widest}]
    return out


@pytest.mark.parametrize("epsilon", [1.0, 10.0])
def test_grid_schedules_meet_their_target_under_an_independent_accountant(
    epsilon: float,
) -> None:
    for dataset, family, config, records in private_schedules():
        q, steps = planned(config, records)
        sigma = noise_multiplier(epsilon, DELTA, q, steps)
        where = (dataset, family, config, records, sigma)
        # The tight accountant: the guarantee itself.
        assert pld_epsilon([(sigma, q, steps)]) <= epsilon, where
        # dp_accounting's RDP bound agrees with Opacus's to 1% (their orders differ) ...
        assert rdp_epsilon(sigma, q, steps) <= 1.01 * epsilon, where
        # ... and the noise is not wasteful: 5% less of it overshoots the target.
        assert rdp_epsilon(0.95 * sigma, q, steps) > epsilon, where


def test_dp_sgd_spends_what_was_planned_and_stays_within_target() -> None:
    s = split("breast-cancer", 1)
    x = inputs(s, "linear", None)
    idx = s.pooled(50)
    config = Config("linear", lr=0.05, epochs=3, batch=32, clip=1.0)
    trainer = PrivateTrainer(
        config, x[idx], s.y[idx], s.classes, seed=1, epsilon=2.0, delta=DELTA, total_epochs=3
    )
    trainer.epochs(3)
    history = trainer.history()
    q, steps = planned(config, len(idx))
    assert sum(t for _, _, t in history) == steps == 3 * math.ceil(150 / 32)
    assert all(z == trainer.sigma and qq == pytest.approx(q) for z, qq, _ in history)
    assert trainer.spent() <= 2.0
    assert pld_epsilon(history) <= 2.0


def test_dp_fedavg_runs_through_flower_and_counts_every_local_step_and_byte() -> None:
    s = split("breast-cancer", 1)
    row = baselines.dp_fedavg(s, 50, LINEAR, epsilon=4.0, score_on=s.test, cache=None)
    check_row(row, "dp_fedavg", 4.0)
    # 2 rounds x 2 local epochs x 2 Poisson steps per epoch, all in every client's accountant.
    q, steps = planned(LINEAR, 50)
    assert (q, steps) == (0.5, 8)
    assert len(row["accountant_histories"]) == s.hospitals
    for history in row["accountant_histories"]:
        assert sum(t for _, _, t in history) == steps
        assert all(z == row["noise_multiplier"] and qq == q for z, qq, _ in history)
        assert pld_epsilon(history) <= 4.0
    # Down and up, every round and client: the serialised arrays of a 30 -> 2 linear model.
    model = build_model("linear", (30,), 2, seed=0, private=True)
    one_model = fedavg.model_bytes(model)
    assert one_model > 62 * 4
    assert row["bytes_sent"] == 2 * 2 * s.hospitals * one_model
    # The global model learned something (half the test records are the majority class).
    assert row["accuracy"] > 0.7


def scrambled(s: Split) -> Split:
    """``s`` with every test record's input replaced by noise and its label flipped."""
    x, y = s.x.copy(), s.y.copy()
    x[s.test] = np.random.default_rng(0).random(x[s.test].shape, dtype=np.float32)
    y[s.test] = 1 - y[s.test]
    return dataclasses.replace(s, x=x, y=y)


@pytest.mark.usefixtures("tiny_grids")
@pytest.mark.parametrize(("method", "epsilon"), [("pooled", None), ("dp_sgd_pooled", 1.0)])
def test_tuning_never_reads_the_test_records(method: str, epsilon: float | None) -> None:
    s = split("breast-cancer", TUNING_SEED)
    bad = scrambled(s)
    chosen, tuned, scores = baselines.tune(method, s, 50, epsilon, None)
    assert baselines.tune(method, bad, 50, epsilon, None) == (chosen, tuned, scores)
    assert len(scores) == len(TINY[baselines.FAMILY[method]])
    # The scrambling does reach whatever reads the test records.
    kw: dict[str, Any] = {} if epsilon is None else {"epsilon": epsilon}
    good = baselines.METHODS[method](s, 50, chosen, score_on=s.test, cache=None, **kw)
    worse = baselines.METHODS[method](bad, 50, chosen, score_on=bad.test, cache=None, **kw)
    assert good["accuracy"] != worse["accuracy"]


ROW_TYPES: dict[str, type | tuple[type, ...]] = {
    "dataset": str,
    "method": str,
    "n": int,
    "epsilon": (float, type(None)),
    "delta": float,
    "seed": int,
    "accuracy": float,
    "seconds": float,
    "bytes_sent": int,
    "hyperparameters": dict,
    "accountant": str,
}


def check_row(row: dict[str, Any], method: str, epsilon: float | None) -> None:
    for key, kind in ROW_TYPES.items():
        assert isinstance(row[key], kind), (key, row[key])
    assert (row["dataset"], row["method"], row["n"], row["seed"]) == (
        "breast-cancer",
        method,
        50,
        1,
    )
    assert row["epsilon"] == epsilon and row["delta"] == DELTA
    assert 0.0 <= row["accuracy"] <= 1.0 and row["seconds"] >= 0.0
    assert (row["accountant"] == "none") == (epsilon is None)
    assert (row["bytes_sent"] > 0) == (method == "dp_fedavg")
    if epsilon is not None:
        assert row["epsilon_spent"] <= epsilon
    json.dumps(row)


def test_every_method_returns_a_row_of_the_schema() -> None:
    s = split("breast-cancer", 1)
    nonprivate = Config("mlp", lr=3e-3, epochs=3, batch=32)
    for method, config, eps in [
        ("alone", nonprivate, None),
        ("pooled", Config("linear", l2=1e-2), None),
        ("dp_sgd_pooled", dataclasses.replace(LINEAR, rounds=None), 5.0),
    ]:
        kw: dict[str, Any] = {} if eps is None else {"epsilon": eps}
        row = baselines.METHODS[method](s, 50, config, score_on=s.test, cache=None, **kw)
        check_row(row, method, eps)
        assert row["hyperparameters"] == config.as_dict()
    row = baselines.alone(s, None, nonprivate, score_on=s.test, cache=None)
    assert row["n"] == 100 and len(row["accuracy_per_hospital"]) == 3
    assert row["accuracy"] == row["accuracy_per_hospital"][0]


def test_grids_are_small_and_fit_their_dataset() -> None:
    for (dataset, family), configs in baselines.GRIDS.items():
        assert 1 <= len(configs) <= baselines.MAX_GRID, (dataset, family)
        assert {c.architecture for c in configs} <= set(ARCHITECTURES[dataset])
        # Architecture is tuned: every grid offers each of the dataset's choices.
        assert {c.architecture for c in configs} == set(ARCHITECTURES[dataset])
        assert all(c.private == (family != "non-private") for c in configs)
        assert all((c.rounds is not None) == (family == "dp-fedavg") for c in configs)


def test_a_configuration_says_what_it_lacks() -> None:
    with pytest.raises(ValueError, match="either l2, or lr, epochs and batch"):
        Config("linear", lr=0.1)
    with pytest.raises(ValueError, match="mlp is not one"):
        Config("mlp", l2=1e-2)


def test_a_cell_refuses_the_tuning_seed_and_a_mismatched_epsilon() -> None:
    with pytest.raises(ValueError, match="tuning seed"):
        baselines.cell("pooled", "breast-cancer", 50, None, [TUNING_SEED, 1], None)
    with pytest.raises(ValueError, match="need one"):
        baselines.cell("dp_fedavg", "breast-cancer", 50, None, [1], None)


def test_table_inputs_are_standardised_by_the_public_records_only() -> None:
    s = split("breast-cancer", 1)
    x = inputs(s, "linear", None)
    assert np.allclose(x[s.public].mean(0), 0, atol=1e-5)
    assert np.allclose(x[s.public].std(0), 1, atol=1e-4)
    other = s.x.copy()
    rest = np.setdiff1d(np.arange(len(other)), s.public)
    other[rest] += 5.0
    moved = inputs(dataclasses.replace(s, x=other), "linear", None)
    assert np.array_equal(moved[s.public], x[s.public])


@pytest.mark.usefixtures("tiny_grids")
def test_the_command_writes_rows_and_the_command(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    argv = ["--dataset", "breast-cancer", "--sizes", "50", "--methods", "pooled"]
    argv += ["--seeds", "1", "2", "--out", str(out)]
    assert baselines.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["command"][-len(argv) :] == argv
    assert doc["versions"]["flwr"] == "1.42.0"
    assert [(r["method"], r["seed"]) for r in doc["rows"]] == [("pooled", 1), ("pooled", 2)]
    check_row(doc["rows"][0], "pooled", None)
    for r in doc["rows"]:
        assert r["tuning_accuracy"] == max(r["tuning_grid_accuracy"])
        assert r["tuning_grid"] == [c.as_dict() for c in TINY["non-private"]]
        assert r["hyperparameters"] in r["tuning_grid"]


def small_image_split() -> Split:
    """animal-mnist's first 160 records, 64 of them public: enough to run the body."""
    s = split("animal-mnist", 1)
    n = np.arange(160, dtype=np.int64)
    return dataclasses.replace(
        s, x=s.x[:160].copy(), y=s.y[:160].copy(), test=n[:32], tuning=n[32:64], public=n[64:128]
    )


def test_body_features_depend_on_the_public_records_only_and_are_kept(tmp_path: Path) -> None:
    s = small_image_split()
    feats = inputs(s, "diet-linear", tmp_path)
    assert feats.shape == (160, 256)
    assert np.allclose(feats[s.public].mean(0), 0, atol=1e-4)
    assert inputs(s, "diet-linear", tmp_path) is feats  # computed once per process
    # Another process reads them from the npz.
    training._FEATURES.clear()
    assert list(tmp_path.glob("diet-features-animal-mnist-*.npz"))
    assert np.array_equal(inputs(s, "diet-linear", tmp_path), feats)
    # A private record's change moves its own features and nobody else's.
    x = s.x.copy()
    x[0] = 1.0 - x[0]
    moved = inputs(dataclasses.replace(s, x=x), "diet-linear", None)
    assert not np.allclose(moved[0], feats[0])
    assert np.allclose(moved[1:], feats[1:], atol=1e-5)


def test_a_run_may_tune_on_some_architectures_only_and_says_so() -> None:
    kept = baselines.grid("animal-mnist", "dp_sgd_pooled", ["diet-linear"])
    assert kept and {c.architecture for c in kept} == {"diet-linear"}
    assert set(kept) < set(baselines.GRIDS["animal-mnist", "dp-sgd"])
    with pytest.raises(ValueError, match="no pooled configuration uses"):
        baselines.grid("breast-cancer", "pooled", ["small-cnn"])
