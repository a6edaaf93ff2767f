"""The four baselines of issue 43 ("show that joining pays"), on capc's side-by-side splits.

- ``alone``: each hospital trains on its own ``n`` labelled records, non-private;
- ``pooled``: non-private training on every hospital's labelled records (the ceiling);
- ``dp_sgd_pooled``: Opacus DP-SGD on the pooled records, record-level (eps, 1e-5);
- ``dp_fedavg``: Flower FedAvg, each hospital running Opacus DP-SGD on its own records,
  record-level (eps, 1e-5) per hospital over all rounds (:mod:`.fedavg`).

Fairness: every method gets the same tuning effort, a fixed grid of at most
:data:`MAX_GRID` configurations (:data:`GRIDS`, architecture included), each trained on
the tuning seed's shares and scored on ``split.tuning``; the best (first on a tie) is
chosen per (dataset, n, epsilon) cell, and only then are the reported seeds trained with
it and scored once on ``split.test``. ``alone`` is tuned on the mean tuning accuracy of
all hospitals (one configuration for all) and reports hospital 0's test accuracy.

Run on its own::

    python -m experiments.side_by_side.baselines --dataset breast-cancer --seeds 1 2 3 --out baselines.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from experiments.side_by_side import fedavg
from experiments.side_by_side.data import DATASETS, LAYOUTS, TUNING_SEED, Split, split
from experiments.side_by_side.training import (
    ACCOUNTANT,
    Config,
    PrivateTrainer,
    accuracy,
    fit_nonprivate,
    inputs,
)

DELTA = 1e-5
EPSILONS = (1.0, 2.0, 5.0, 10.0)
MAX_GRID = 8
#: The methods that spend privacy, by name.
PRIVATE = ("dp_sgd_pooled", "dp_fedavg")

Log = Callable[[str], None]
Row = dict[str, Any]

#: Every tuning grid: (dataset, family) -> configurations. Non-private grids mix a
#: closed-form linear head (penalty l2) with a network trained by Adam; DP grids favour
#: larger batches and fewer epochs (each step costs privacy), with per-record clipping.
GRIDS: dict[tuple[str, str], tuple[Config, ...]] = {
    ("animal-mnist", "non-private"): (
        *(Config("diet-linear", l2=l2) for l2 in (1e-4, 1e-3, 1e-2, 1e-1)),
        Config("small-cnn", lr=1e-3, epochs=15, batch=32),
        Config("small-cnn", lr=1e-3, epochs=40, batch=32),
        Config("small-cnn", lr=3e-3, epochs=15, batch=64),
        Config("small-cnn", lr=3e-3, epochs=40, batch=64),
    ),
    ("animal-mnist", "dp-sgd"): (
        Config("diet-linear", lr=0.01, epochs=10, batch=128, clip=1.0),
        Config("diet-linear", lr=0.01, epochs=30, batch=512, clip=1.0),
        Config("diet-linear", lr=0.05, epochs=10, batch=512, clip=1.0),
        Config("diet-linear", lr=0.05, epochs=40, batch=1024, clip=1.0),
        Config("small-cnn", lr=2e-3, epochs=5, batch=256, clip=1.0),
        Config("small-cnn", lr=2e-3, epochs=15, batch=512, clip=1.0),
        Config("small-cnn", lr=5e-3, epochs=10, batch=512, clip=1.0),
        Config("small-cnn", lr=1e-3, epochs=15, batch=256, clip=0.5),
    ),
    ("animal-mnist", "dp-fedavg"): (
        Config("diet-linear", lr=0.02, epochs=1, batch=32, clip=1.0, rounds=10),
        Config("diet-linear", lr=0.01, epochs=2, batch=64, clip=1.0, rounds=20),
        Config("diet-linear", lr=0.05, epochs=5, batch=128, clip=1.0, rounds=5),
        Config("diet-linear", lr=0.05, epochs=1, batch=128, clip=1.0, rounds=30),
        Config("small-cnn", lr=2e-3, epochs=1, batch=64, clip=1.0, rounds=5),
        Config("small-cnn", lr=2e-3, epochs=2, batch=128, clip=1.0, rounds=10),
        Config("small-cnn", lr=5e-3, epochs=1, batch=256, clip=1.0, rounds=15),
        Config("small-cnn", lr=2e-3, epochs=3, batch=256, clip=1.0, rounds=5),
    ),
    ("breast-cancer", "non-private"): (
        *(Config("linear", l2=l2) for l2 in (1e-4, 1e-3, 1e-2, 1e-1)),
        Config("mlp", lr=1e-3, epochs=30, batch=32),
        Config("mlp", lr=1e-3, epochs=100, batch=32),
        Config("mlp", lr=3e-3, epochs=30, batch=16),
        Config("mlp", lr=1e-2, epochs=100, batch=64),
    ),
    ("breast-cancer", "dp-sgd"): (
        Config("linear", lr=0.01, epochs=20, batch=32, clip=1.0),
        Config("linear", lr=0.05, epochs=50, batch=64, clip=1.0),
        Config("linear", lr=0.1, epochs=100, batch=128, clip=1.0),
        Config("linear", lr=0.02, epochs=50, batch=300, clip=0.5),
        Config("mlp", lr=1e-3, epochs=20, batch=32, clip=1.0),
        Config("mlp", lr=3e-3, epochs=50, batch=64, clip=1.0),
        Config("mlp", lr=1e-2, epochs=100, batch=128, clip=1.0),
        Config("mlp", lr=3e-3, epochs=30, batch=300, clip=1.0),
    ),
    ("breast-cancer", "dp-fedavg"): (
        Config("linear", lr=0.05, epochs=1, batch=16, clip=1.0, rounds=10),
        Config("linear", lr=0.02, epochs=2, batch=32, clip=1.0, rounds=20),
        Config("linear", lr=0.1, epochs=1, batch=64, clip=1.0, rounds=30),
        Config("linear", lr=0.1, epochs=5, batch=100, clip=1.0, rounds=10),
        Config("mlp", lr=3e-3, epochs=1, batch=16, clip=1.0, rounds=10),
        Config("mlp", lr=3e-3, epochs=2, batch=32, clip=1.0, rounds=20),
        Config("mlp", lr=1e-2, epochs=1, batch=64, clip=1.0, rounds=30),
        Config("mlp", lr=1e-2, epochs=5, batch=100, clip=1.0, rounds=10),
    ),
}
#: Which grid each method is tuned on.
FAMILY = {
    "alone": "non-private",
    "pooled": "non-private",
    "dp_sgd_pooled": "dp-sgd",
    "dp_fedavg": "dp-fedavg",
}


def _row(split: Split, method: str, n: int | None, config: Config, epsilon: float | None) -> Row:
    return {
        "dataset": split.dataset,
        "method": method,
        "n": split.size(n),
        "epsilon": epsilon,
        "delta": DELTA,
        "seed": split.seed,
        "hyperparameters": config.as_dict(),
        "accountant": f"opacus-{ACCOUNTANT}" if epsilon is not None else "none",
        "bytes_sent": 0,
    }


def _labelled(
    split: Split, x: NDArray[np.float32], idx: NDArray[np.int64]
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    return x[idx], split.y[idx]


def alone(
    split: Split, n: int | None, config: Config, *, score_on: NDArray[np.int64], cache: Path | None
) -> Row:
    """Each hospital on its own ``n`` records, non-private; ``accuracy`` is hospital 0's."""
    t0 = time.perf_counter()
    x = inputs(split, config.architecture, cache)
    scores = [
        accuracy(
            fit_nonprivate(
                config, *_labelled(split, x, split.labelled(i, n)), split.classes, split.seed
            ),
            x[score_on],
            split.y[score_on],
        )
        for i in range(split.hospitals)
    ]
    row = _row(split, "alone", n, config, None)
    row |= {
        "accuracy": scores[0],
        "accuracy_per_hospital": scores,
        "mean_accuracy": float(np.mean(scores)),
    }
    return row | {"seconds": time.perf_counter() - t0}


def pooled(
    split: Split, n: int | None, config: Config, *, score_on: NDArray[np.int64], cache: Path | None
) -> Row:
    """Non-private training on every hospital's ``n`` labelled records (the ceiling)."""
    t0 = time.perf_counter()
    x = inputs(split, config.architecture, cache)
    model = fit_nonprivate(config, *_labelled(split, x, split.pooled(n)), split.classes, split.seed)
    row = _row(split, "pooled", n, config, None)
    row["accuracy"] = accuracy(model, x[score_on], split.y[score_on])
    return row | {"seconds": time.perf_counter() - t0}


def dp_sgd_pooled(
    split: Split,
    n: int | None,
    config: Config,
    *,
    epsilon: float,
    score_on: NDArray[np.int64],
    cache: Path | None,
) -> Row:
    """Opacus DP-SGD on the pooled records at record-level (``epsilon``, :data:`DELTA`)."""
    t0 = time.perf_counter()
    x = inputs(split, config.architecture, cache)
    epochs = int(config.epochs or 0)
    trainer = PrivateTrainer(
        config,
        *_labelled(split, x, split.pooled(n)),
        split.classes,
        seed=split.seed,
        epsilon=epsilon,
        delta=DELTA,
        total_epochs=epochs,
    )
    trainer.epochs(epochs)
    row = _row(split, "dp_sgd_pooled", n, config, epsilon)
    row |= {
        "accuracy": accuracy(trainer.module, x[score_on], split.y[score_on]),
        "epsilon_spent": _within(trainer.spent(), epsilon),
        "noise_multiplier": trainer.sigma,
        # (noise multiplier, sample rate, steps) as the accountant composed them.
        "accountant_history": trainer.history(),
    }
    return row | {"seconds": time.perf_counter() - t0}


def dp_fedavg(
    split: Split,
    n: int | None,
    config: Config,
    *,
    epsilon: float,
    score_on: NDArray[np.int64],
    cache: Path | None,
) -> Row:
    """Flower FedAvg of per-hospital Opacus DP-SGD, (``epsilon``, :data:`DELTA`) per hospital."""
    x = inputs(split, config.architecture, cache)
    parts = [_labelled(split, x, split.labelled(i, n)) for i in range(split.hospitals)]
    run = fedavg.run(config, parts, split.classes, seed=split.seed, epsilon=epsilon, delta=DELTA)
    row = _row(split, "dp_fedavg", n, config, epsilon)
    row |= {
        "accuracy": accuracy(run.model, x[score_on], split.y[score_on]),
        "epsilon_spent": _within(max(run.spent), epsilon),
        "noise_multiplier": run.noise_multiplier,
        "accountant_histories": run.histories,
        "bytes_sent": run.bytes_sent,
        "bytes_measured": "serialised parameter arrays down and up, every client and round",
    }
    return row | {"seconds": run.seconds}


def _within(spent: float, epsilon: float) -> float:
    """``spent``, after checking the accountant kept to the target (a bug otherwise)."""
    if spent > epsilon * (1 + 1e-6):
        raise RuntimeError(f"the accountant reports epsilon {spent:.4f} > target {epsilon}")
    return spent


Method = Callable[..., Row]
METHODS: dict[str, Method] = {
    "alone": alone,
    "pooled": pooled,
    "dp_sgd_pooled": dp_sgd_pooled,
    "dp_fedavg": dp_fedavg,
}


def grid(
    dataset: str, method: str, architectures: Sequence[str] | None = None
) -> tuple[Config, ...]:
    """``method``'s tuning grid on ``dataset``; with ``architectures``, only their points
    (to bound a run's cost: such a run is tuned on less than the full grid)."""
    if method not in FAMILY:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    full = GRIDS[dataset, FAMILY[method]]
    kept = tuple(c for c in full if architectures is None or c.architecture in architectures)
    if not kept:
        offered = sorted({c.architecture for c in full})
        raise ValueError(f"{dataset}: no {method} configuration uses {architectures}; {offered} do")
    return kept


def _call(
    method: str,
    s: Split,
    n: int | None,
    config: Config,
    epsilon: float | None,
    score_on: NDArray[np.int64],
    cache: Path | None,
) -> Row:
    extra: dict[str, Any] = {} if epsilon is None else {"epsilon": epsilon}
    return METHODS[method](s, n, config, score_on=score_on, cache=cache, **extra)


def _tuning_score(row: Row) -> float:
    return float(row["mean_accuracy"] if "mean_accuracy" in row else row["accuracy"])


def tune(
    method: str,
    tuning_split: Split,
    n: int | None,
    epsilon: float | None,
    cache: Path | None,
    log: Log = lambda _: None,
    configs: Sequence[Config] | None = None,
) -> tuple[Config, float, list[float]]:
    """The best of ``configs`` (default the method's grid) for one cell, scored on
    ``tuning_split.tuning`` only: (chosen, its tuning accuracy, every configuration's
    tuning accuracy in order)."""
    configs = grid(tuning_split.dataset, method) if configs is None else configs
    scores = []
    for config in configs:
        row = _call(method, tuning_split, n, config, epsilon, tuning_split.tuning, cache)
        scores.append(_tuning_score(row))
        log(
            f"  tune {method} n={row['n']} eps={epsilon}: {config.as_dict()} -> "
            f"{scores[-1]:.3f} in {row['seconds']:.1f} s"
        )
    best = int(np.argmax(scores))
    return configs[best], scores[best], scores


def cell(
    method: str,
    dataset: str,
    n: int | None,
    epsilon: float | None,
    seeds: Sequence[int],
    cache: Path | None,
    log: Log = lambda _: None,
    architectures: Sequence[str] | None = None,
) -> list[Row]:
    """One (dataset, n, epsilon) cell of one method: tuned once, then a row per seed."""
    if TUNING_SEED in seeds:
        raise ValueError(f"seed {TUNING_SEED} is the tuning seed; report other seeds")
    if (method in PRIVATE) != (epsilon is not None):
        raise ValueError(f"{method}: epsilon {epsilon} (the DP methods need one, others none)")
    t0 = time.perf_counter()
    configs = grid(dataset, method, architectures)
    chosen, tuned, scores = tune(
        method, split(dataset, TUNING_SEED), n, epsilon, cache, log, configs
    )
    tuning_seconds = time.perf_counter() - t0
    rows = []
    for seed in seeds:
        s = split(dataset, seed)
        row = _call(method, s, n, chosen, epsilon, s.test, cache)
        row |= {
            "tuning_accuracy": tuned,
            "tuning_grid": [c.as_dict() for c in configs],
            "tuning_grid_accuracy": scores,
            "tuning_seconds": tuning_seconds,
        }
        log(
            f"{method} n={row['n']} eps={epsilon} seed={seed}: {row['accuracy']:.3f} in {row['seconds']:.1f} s"
        )
        rows.append(row)
    return rows


def run_baselines(
    dataset: str,
    sizes: Sequence[int | None] | None = None,
    epsilons: Sequence[float] = EPSILONS,
    seeds: Sequence[int] = (1, 2, 3),
    cache: Path | None = None,
    *,
    methods: Sequence[str] = tuple(METHODS),
    architectures: Sequence[str] | None = None,
    log: Log = lambda _: None,
    done: Callable[[list[Row]], None] = lambda _: None,
) -> list[Row]:
    """Every row of the baselines for ``dataset``: per size (``None``: all of a share;
    default the dataset's grid sizes), the non-private methods once and the DP methods
    per epsilon, each tuned per cell (on the grids' points of ``architectures`` only, if
    given). ``done`` sees the rows so far after each cell."""
    rows: list[Row] = []
    for n in LAYOUTS[dataset].sizes if sizes is None else sizes:
        for method in methods:
            for eps in epsilons if method in PRIVATE else (None,):
                rows += cell(method, dataset, n, eps, seeds, cache, log, architectures)
                done(rows)
    return rows


def _size(text: str) -> int | None:
    return None if text == "all" else int(text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.side_by_side.baselines")
    p.add_argument("--dataset", choices=DATASETS, required=True)
    p.add_argument(
        "--sizes",
        nargs="+",
        type=_size,
        help="labelled records per hospital ('all'); default the grid's",
    )
    p.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    p.add_argument(
        "--architectures",
        nargs="+",
        help="tune on these architectures' grid points only (a cheaper, partial search)",
    )
    p.add_argument("--cache", type=Path, help="folder for the body's features (npz)")
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: small models run fastest so)",
    )
    return p


def _document(argv: Sequence[str], rows: list[Row]) -> dict[str, Any]:
    versions = {name: metadata.version(name) for name in ("torch", "opacus", "flwr")}
    return {
        "command": ["python", "-m", "experiments.side_by_side.baselines", *argv],
        "versions": versions,
        "rows": rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(args_list)
    torch.set_num_threads(args.threads)

    def save(rows: list[Row]) -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(_document(args_list, rows), indent=1) + "\n")

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    rows = run_baselines(
        args.dataset,
        args.sizes,
        args.epsilons,
        args.seeds,
        args.cache,
        methods=args.methods,
        architectures=args.architectures,
        log=log,
        done=save,
    )
    save(rows)
    log(f"{len(rows)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
