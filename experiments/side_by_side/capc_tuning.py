"""capc tuned as the baselines are: at most 8 configurations per (dataset, n) cell,
trained on the tuning seed's shares and scored on ``split.tuning`` only (issue 43).

Run (animal-mnist; about 40 minutes on 2 shared cores; every finished cell is saved)::

    python -m experiments.side_by_side.capc_tuning --out experiments/results/side-by-side-capc-tuning.json \
        --sizes all 1000 --loop-sizes 1000 200 --pool 32768
    python -m experiments.side_by_side.capc_tuning --out experiments/results/side-by-side-capc-tuning.json \
        --sizes 200 50 --loop-sizes --pool 32768 --add-to

PATE with public records, on the student's grid (the queries are the split's public
records, at most all of them; every cell about a minute)::

    python -m experiments.side_by_side.capc_tuning --out experiments/results/side-by-side-capc-tuning.json \
        --sizes --loop-sizes --pate-sizes all 1000 200 50 --add-to

The CaPC loop at n = 50, and breast-cancer (:mod:`.table_tuning`: the same grid at its
task's share of the vote; minutes)::

    python -m experiments.side_by_side.capc_tuning --out experiments/results/side-by-side-capc-tuning.json \
        --sizes --loop-sizes 50 --add-to
    python -m experiments.side_by_side.capc_tuning --out experiments/results/side-by-side-capc-tuning.json \
        --dataset breast-cancer --sizes all 50 --pate-sizes all 50 --pool 32768 --add-to

The loop on breast-cancer (n = 50: at n = all a hospital has no unlabelled rows)::

    python -m experiments.side_by_side.capc_tuning --out experiments/results/side-by-side-capc-tuning.json \
        --dataset breast-cancer --sizes --loop-sizes 50 --add-to

No services run: this is central mode on the library pieces the services use.

* Teachers: each hospital's ``m`` heads on the shipped body
  (:func:`.capc_runs.image_ensemble`, what ``capc_runs.fit_image_teachers`` saves for
  a hospital's party).
* Queries: the DIET student's Gaussian recipe with the split's seed from record 0,
  as ``capc_runs`` submits it; each batch of :data:`.tuner.BATCH` queries is read with its
  own BatchNorm statistics, by the teachers (one pass for every head, as a party's
  ensemble does) and by the student. The services' rounds start at each job's first
  query, so where a job's length is not a multiple of :data:`.tuner.BATCH` their batches
  are cut elsewhere; nothing else differs.
  PATE with public records asks about the split's public records in their order:
  the teachers read them with their own stored statistics (a party reads a
  submitted file's records so), the student in batches of :data:`.tuner.BATCH` with their
  own statistics (the student service reads every job's queries so).
* Labels: one central round on the summed votes
  (:func:`capc.round.central.label_histograms`, oracle mode, as
  :func:`capc.learning.pate.label_within_budgets` labels): the mechanism object's
  noise draw and plaintext oracle, bit for bit a networked round's labels for the
  same votes and noise.
* The student: what the student service's trainer does for a pretrained body
  (``services.student.training.ModelTrainer._fit_pretrained``, default options):
  a batch-standardised, class-balanced head with L2 :data:`STUDENT_L2` on the
  answered queries' features, the reference batch's statistics stored, then scored.
  The loop's model is the same head on the hospital's own records (features in
  batches of :data:`OWN_BATCH`, in the trainer's order) and its bought labels, with
  the statistics of a batch of its own records.

Pricing (every eps is a prefix of one run per configuration). The guardian's
ledger and each hospital's own charge the guardian's accountant (``gdp``, exact
Gaussian DP, ``services.commands.up.accountant``) at delta 1e-5; before a round runs its
worst case (every query answered) must fit the cap on top of what earlier rounds
were actually charged, and afterwards the round is charged what happened: the
threshold test of every query, GNMax on the answered ones. Under ``gdp`` that is a
privacy filter under fully adaptive composition (Smith and Thakurta 2022: adaptively
chosen Gaussian mechanisms whose sum of mu**2 is kept within the cap before each
step are mu-GDP). So the labels a configuration buys at eps ``e`` are those of the
rounds a fresh cap of ``e`` admits (:func:`.tuner.admitted`, the guardian's rounds of
:func:`capc.round.central_budget.budget_filter`): rounds of :data:`.tuner.BATCH`
queries while a whole round's worst case fits, then the largest round whose worst
case still fits, until none does. What decides the stop is data-independent apart
from the answered counts, which are DP outputs charged inside the cap. For GNMax
every query is answered and this is exactly ``queries_fit(task, e)``, the count
``capc_runs`` prices its rows at (checked at run time). A confident mechanism runs
as robust-confident-gnmax, the one distributed rounds take (the guardian refuses
confident-gnmax's single shared test noise); its test has L2 sensitivity sqrt(2).
Through the services today a confident task's rows would be priced by its worst
case (``capc_runs.counts``), fewer queries than this filter: a student that keeps
submitting rounds until the guardian refuses one gets these.

Configurations (:func:`student_grid`, :func:`loop_grid`): teachers per hospital
``m`` around the grid's rule ``m0 = teachers_per_hospital``; GNMax with sigma a
multiple of the shipped share of the vote (sigma = 40 x voters / 250); and
robust-confident-gnmax with threshold and test noise as fractions of the voters.
The loop (hospital 0 buying labels for its unlabelled records from the others'
teachers) is also tried with two post-processings of its labels: keeping only those
its own model agrees with, and weighting its own records four times (they enter
the fit four times). Its "alone" is its model on its own records, scored on the
same tuning records.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from experiments.side_by_side.capc_runs import (
    TABLE_VOTERS,
    scaled_task,
    teachers_per_hospital,
)
from experiments.side_by_side.data import DATASETS, TUNING_SEED, Split, split
from experiments.side_by_side.table_tuning import TableTuner
from experiments.side_by_side.tuned import OWN_WEIGHT
from experiments.side_by_side.tuner import DATASET, EPSILONS, Candidate, Log, Tuner
from services.commands.demo import DEMO_TASK, DEMO_VOTERS

#: Datasets of table rows (no body: MLP teachers, students and loop models).
TABLES = ("breast-cancer",)
#: At most this many configurations per (dataset, n) cell, as the baselines.
MAX_GRID = 8
#: Largest number of synthetic queries a configuration may use (a recipe's limit).
MAX_POOL = 65_536
#: The shipped GNMax sigma per voter (the demo's 40 of 250).
SIGMA_SHARE = float(DEMO_TASK["mechanism"]["sigma"]) / DEMO_VOTERS
#: Each dataset's shipped sigma per voter: images the demo's; breast-cancer its task's
#: 23 for 3 hospitals x 8 teachers (``capc_runs.scaled_task``).
SIGMA_SHARES = {
    DATASET: SIGMA_SHARE,
    "breast-cancer": float(scaled_task("breast-cancer", TABLE_VOTERS)["mechanism"]["sigma"])
    / TABLE_VOTERS,
}


def gnmax(voters: int, factor: float = 1.0, share: float = SIGMA_SHARE) -> dict[str, Any]:
    """GNMax with sigma ``factor`` times the shipped ``share`` (per voter) of ``voters``."""
    return {"name": "gnmax", "sigma": round(share * voters * factor, 4)}


def robust(
    voters: int, threshold: float, sigma1: float, factor: float = 1.0, share: float = SIGMA_SHARE
) -> dict[str, Any]:
    """robust-confident-gnmax: threshold and test noise as fractions of ``voters``, the
    answer's sigma ``factor`` times the shipped ``share``."""
    return {
        "name": "robust-confident-gnmax",
        "sigma": round(share * voters * factor, 4),
        "threshold": round(threshold * voters, 4),
        "sigma1": round(sigma1 * voters, 4),
    }


def student_grid(n: int, hospitals: int, dataset: str = DATASET) -> list[Candidate]:
    """The DIET student's (and PATE's) configurations for ``n`` labelled records a
    hospital of ``dataset``; the first is the shipped rule (``capc_runs``)."""
    m0 = teachers_per_hospital(dataset, n)
    few, many = max(1, m0 // 5), 2 * m0
    v0, vf, vm = hospitals * m0, hospitals * few, hospitals * many
    share = SIGMA_SHARES[dataset]
    return [
        Candidate("shipped: m0, gnmax at the share", m0, gnmax(v0, share=share)),
        Candidate("m0, gnmax at 2x the share", m0, gnmax(v0, 2.0, share)),
        Candidate("m0, gnmax at 4x the share", m0, gnmax(v0, 4.0, share)),
        Candidate("2 m0, gnmax at the share", many, gnmax(vm, share=share)),
        Candidate("m0/5, gnmax at the share", few, gnmax(vf, share=share)),
        Candidate("m0/5, gnmax at m0's sigma", few, gnmax(v0, share=share)),
        Candidate("m0, confident T .5 s1 .2", m0, robust(v0, 0.5, 0.2, share=share)),
        Candidate("m0, confident T .6 s1 .3 at 2x", m0, robust(v0, 0.6, 0.3, 2.0, share)),
    ]


def loop_grid(n: int, hospitals: int, dataset: str = DATASET) -> list[Candidate]:
    """The CaPC loop's configurations for ``n`` labelled records a hospital of ``dataset``
    (sigma for every hospital's teachers, as the consortium's task sets it; hospital 0's
    own never vote)."""
    m0 = teachers_per_hospital(dataset, n)
    v0, voting = hospitals * m0, (hospitals - 1) * m0
    share = SIGMA_SHARES[dataset]
    confident = robust(voting, 0.7, 0.15)
    confident["sigma"] = gnmax(v0, share=share)["sigma"]
    shipped = gnmax(v0, share=share)
    return [
        Candidate("shipped: gnmax, retrain", m0, shipped),
        Candidate("gnmax, agree", m0, shipped, "agree"),
        Candidate("gnmax, own x4", m0, shipped, "own-x4"),
        Candidate("confident T .7 s1 .15, retrain", m0, confident),
        Candidate("confident T .7 s1 .15, agree", m0, confident, "agree"),
        Candidate("confident T .7 s1 .15, own x4", m0, confident, "own-x4"),
    ]


def chosen(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (dataset, method, n, eps): the configuration with the best tuning accuracy, and the
    shipped rule's for comparison. On a tie the first that the services can run (a loop
    that does not filter its labels, :data:`.tuned.OWN_WEIGHT`), else the first, as
    the baselines: tied configurations score the same, so which of them is reported
    reads nothing more of the data."""
    out = []
    cells: dict[tuple[str, str, int, float], list[dict[str, Any]]] = {}
    for r in rows:
        if r["epsilon"] is not None:
            cells.setdefault((r["dataset"], r["method"], r["n"], r["epsilon"]), []).append(r)
    for (dataset, method, n, e), rs in cells.items():
        scored = [r for r in rs if r["tuning_accuracy"] is not None]
        top = max((r["tuning_accuracy"] for r in scored), default=None)
        tied = [r for r in scored if r["tuning_accuracy"] == top]
        runnable = [r for r in tied if r["config"].get("labels", "retrain") in OWN_WEIGHT]
        best = (runnable or tied)[0] if tied else None
        shipped = next(r for r in rs if r["config"]["name"].startswith("shipped"))
        out.append(
            {
                "dataset": dataset,
                "method": method,
                "n": n,
                "epsilon": e,
                "chosen": None if best is None else best["config"]["name"],
                "tuning_accuracy": None if best is None else best["tuning_accuracy"],
                "shipped_tuning_accuracy": shipped["tuning_accuracy"],
                "chosen_config": None if best is None else best["config"],
            }
        )
    return out


def run(
    s: Split,
    sizes: Sequence[int | None],
    loop_sizes: Sequence[int],
    pool: int,
    log: Log,
    score_on: NDArray[np.int64] | None = None,
    grid: Callable[[int, int], list[Candidate]] | None = None,
    loops: Callable[[int, int], list[Candidate]] | None = None,
    tuner: Tuner | None = None,
    pate_sizes: Sequence[int | None] = (),
) -> list[dict[str, Any]]:
    """Every tuning row of ``s`` (only its hospitals' shares, its public records and
    ``score_on``, by default the tuning records, are read). ``grid``: the student's
    configurations (default: :func:`student_grid` of ``s``'s dataset). ``tuner``: one
    whose features and teachers to reuse. ``pate_sizes``: n for PATE with public records,
    tried on the student's grid. ``loops``: the loop's configurations (default:
    :func:`loop_grid` of ``s``'s dataset)."""
    grid = grid or partial(student_grid, dataset=s.dataset)
    loops = loops or partial(loop_grid, dataset=s.dataset)
    tuner = tuner or tuner_for(s, pool, log, score_on)
    rows: list[dict[str, Any]] = []
    students = [("student", size, tuner.student) for size in sizes]
    students += [("pate-public", size, tuner.pate_public) for size in pate_sizes]
    for what, size, method in students:
        n = s.size(size)
        candidates = grid(n, s.hospitals)
        if len(candidates) > MAX_GRID:
            raise ValueError(f"{len(candidates)} configurations for n={n}; at most {MAX_GRID}")
        for c in candidates:
            rows += method(n, c)
            log(
                f"{what} n={n} {c.name}: "
                + ", ".join(
                    f"eps {r['epsilon']:g} {r['labels']} labels {r['tuning_accuracy']}"
                    for r in rows[-len(EPSILONS) :]
                )
            )
    for n in loop_sizes:
        candidates = loops(n, s.hospitals)
        if len(candidates) > MAX_GRID:
            raise ValueError(f"{len(candidates)} loop configurations for n={n}")
        rows += tuner.loop(n, candidates)
        log(f"loop n={n} done")
    return rows


def tuner_for(s: Split, pool: int, log: Log, score_on: NDArray[np.int64] | None = None) -> Tuner:
    """The tuner of ``s``'s kind: images' (:class:`.tuner.Tuner`) or a table's
    (:class:`.table_tuning.TableTuner`)."""
    if s.dataset not in TABLES:
        return Tuner(s, pool, log, score_on)
    return TableTuner(s, pool, log, score_on)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.side_by_side.capc_tuning")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file of rows")
    parser.add_argument(
        "--dataset",
        choices=DATASETS,
        default=DATASET,
        help="the dataset whose capc to tune (its rows join the file's others)",
    )
    parser.add_argument(
        "--sizes",
        nargs="*",
        default=["all", "1000", "200", "50"],
        help="labelled records per hospital for the student ('all': a whole share)",
    )
    parser.add_argument(
        "--pate-sizes",
        nargs="*",
        default=[],
        help="labelled records per hospital for PATE with public records ('all': a share)",
    )
    parser.add_argument(
        "--loop-sizes",
        nargs="*",
        type=int,
        default=None,
        help="n for the loop (default: 200 1000 on images; none on tables, as before they had one)",
    )
    parser.add_argument(
        "--pool", type=int, default=MAX_POOL, help="synthetic queries at most (<= 65,536)"
    )
    parser.add_argument(
        "--add-to",
        action="store_true",
        help="merge into the saved rows (a row of the same method, n, eps and config replaced)",
    )
    parser.add_argument(
        "--rows-from",
        type=Path,
        nargs="+",
        default=None,
        help="saved tuning files whose rows to merge in (with --add-to); nothing is run",
    )
    return parser


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    config = row["config"]
    name = None if config is None else config["name"]
    return (row["dataset"], row["method"], row["n"], row["epsilon"], name)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 1 <= args.pool <= MAX_POOL:
        raise SystemExit(f"--pool must lie in [1, {MAX_POOL}]")
    torch.set_num_threads(1)
    command = shlex.join(
        ["python", "-m", "experiments.side_by_side.capc_tuning", *(argv or sys.argv[1:])]
    )
    start = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - start:6.0f} s] {text}", file=sys.stderr, flush=True)

    sizes = [None if v == "all" else int(v) for v in args.sizes]
    pate_sizes = [None if v == "all" else int(v) for v in args.pate_sizes]
    saved = json.loads(args.out.read_text()) if args.add_to and args.out.exists() else {}
    rows: list[dict[str, Any]] = list(saved.get("rows", []))
    commands = [*saved.get("commands", []), command]
    seconds = saved.get("seconds", 0.0)
    if args.rows_from:
        # Cells run apart (in parallel, into their own files) merged without running.
        for path in args.rows_from:
            other = json.loads(path.read_text())
            rows = _merged(rows, other["rows"])
            commands += [c for c in other["commands"] if c not in commands]
            seconds += other.get("seconds", 0.0)
        _write(args.out, rows, commands, seconds)
        return 0
    s = split(args.dataset, TUNING_SEED)
    tuner = tuner_for(s, args.pool, log)
    loop_sizes = args.loop_sizes
    if loop_sizes is None:
        loop_sizes = [] if s.dataset in TABLES else [200, 1000]
    # Each cell is saved as it ends, so a run that is stopped keeps what it finished.
    cells: list[tuple[list[int | None], list[int], list[int | None]]]
    cells = [([v], [], []) for v in sizes]
    cells += [([], [n], []) for n in loop_sizes]
    cells += [([], [], [v]) for v in pate_sizes]
    for cell_sizes, cell_loops, cell_pate in cells:
        new = run(s, cell_sizes, cell_loops, args.pool, log, tuner=tuner, pate_sizes=cell_pate)
        rows = _merged(rows, new)
        _write(args.out, rows, commands, seconds + time.perf_counter() - start)
    return 0


def _merged(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``old`` with ``new`` added, a new row replacing an old one of its key."""
    fresh = {_key(r) for r in new}
    return [r for r in old if _key(r) not in fresh] + list(new)


def _write(path: Path, rows: list[dict[str, Any]], commands: list[str], seconds: float) -> None:
    result = {
        "experiment": "side_by_side_capc_tuning",
        "commands": commands,
        "datasets": sorted({r["dataset"] for r in rows}),
        "seed": TUNING_SEED,
        "scored_on": "split.tuning",
        "accountant": "gdp (services.commands.up.accountant), delta 1e-5, rounds admitted by worst case",
        "rows": rows,
        "chosen": chosen(rows),
        "seconds": seconds,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    raise SystemExit(main())
