"""The side-by-side grid: every method on the same splits, saved as rows.

Run (both datasets, every method, seeds 1-3; hours on 2 shared cores):
    python -m experiments.side_by_side --out experiments/results/side-by-side.json

Parts of the grid can run apart and land in the same file (rows with the same
dataset, method, n, eps and seed are replaced):
    python -m experiments.side_by_side --out experiments/results/side-by-side.json \
        --datasets breast-cancer --methods capc --add-to

Rows saved elsewhere (a part run on another machine) are merged without running:
    python -m experiments.side_by_side --out experiments/results/side-by-side.json \
        --add-to --rows-from part.json

capc's methods at their tuned picks (``capc_tuning``'s ``chosen``; :mod:`.tuned`):
a consortium per (n, configuration) not the shipped rule, running only the methods
that chose it; its rows replace the grid's at the eps it was chosen for (the grid's
are kept under ``untuned_capc_rows``), and the grid's rows where the shipped rule
was chosen are marked ``tuned``:
    python -m experiments.side_by_side --out experiments/results/side-by-side.json \
        --datasets animal-mnist --methods capc --capc-methods capc-diet-student \
        --tuned-from experiments/results/side-by-side-capc-tuning.json --add-to

``--configurations NAME ...`` runs only the named picks (each for every seed).
``--capc-methods`` names capc's methods to run, with or without ``--tuned-from``: the
grid's CaPC loop alone on breast-cancer (its rows at the shipped rule), then its picks:
    python -m experiments.side_by_side --out experiments/results/side-by-side.json \
        --datasets breast-cancer --methods capc --capc-methods capc-loop --add-to --sizes 50

After the tuning file changes, ``--mark-only`` re-marks the saved rows by its picks
(a row stays ``tuned`` only while its configuration is still the pick):
    python -m experiments.side_by_side --out experiments/results/side-by-side.json \
        --datasets animal-mnist --methods capc --add-to --mark-only \
        --tuned-from experiments/results/side-by-side-capc-tuning.json

Issue 52's consortia (``--scenario``; .scenarios), e.g. mixed models per hospital
(.mixed; animal-mnist at n = all) and breast-cancer's DP-trained teachers (.dp_tables):
    python -m experiments.side_by_side --out experiments/results/side-by-side.json \
        --add-to --datasets animal-mnist --scenario mixed-models --methods baselines capc-dp \
        --epsilons 10
    python -m experiments.side_by_side --out experiments/results/side-by-side.json \
        --add-to --datasets breast-cancer --methods capc-dp --epsilons 10 1 5 2

Every command is recorded as it ran (``commands``) and mapped, in ``documented_as``,
to the docs/results.md commands that make its rows: itself without ``--work`` (a
scratch folder) where it ran so; a part run into a scratch file is mapped by hand
(a unit test holds every recorded command to a docs command).

Progress goes to stderr; every finished cell is saved at once, so a run that is
stopped keeps what it finished. The summary (means and spreads over seeds), the
goals and the plots are recomputed from the rows (``summary``, ``plots``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.side_by_side import summary, tuned
from experiments.side_by_side.capc_runs import METHODS, CapcConfig, run_capc
from experiments.side_by_side.data import DATASETS, LAYOUTS, split
from experiments.side_by_side.scenarios import SCENARIOS

#: Grid sizes of each non-iid scenario (``None``: all).
SCENARIO_SIZES: dict[str, tuple[int | None, ...]] = {
    "small-querier": (50, 200),
    "skew-0.1": (None,),
    "skew-0.5": (None,),
    "mixed-models": (None,),
}

METHOD_GROUPS = ("capc", "baselines", "capc-dp")
#: Datasets of table rows: their DP-teacher methods are .dp_tables's.
TABLE_DATASETS = ("breast-cancer",)


def key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What makes a row unique in the saved file (a row without a scenario is iid's)."""
    return (
        row["dataset"],
        row["method"],
        row["n"],
        row["epsilon"],
        row["seed"],
        row.get("scenario", "iid"),
        row.get("hospital"),
    )


def merged(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``old`` with every row of ``new`` added, a new row replacing an old one of its key."""
    fresh = {key(r) for r in new}
    return [r for r in old if key(r) not in fresh] + list(new)


#: What :func:`write` makes itself; any other key of a saved file is carried over.
MADE = ("experiment", "commands", "delta", "rows", "summary")


def kept(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved file's keys that :func:`write` does not make (e.g. ``capc_bytes``)."""
    return {k: v for k, v in saved.items() if k not in MADE}


def write(
    path: Path,
    rows: list[dict[str, Any]],
    commands: list[str],
    others: dict[str, Any] | None = None,
) -> None:
    """Save ``rows`` with their summary and the commands that made them, and ``others``
    (keys made elsewhere, e.g. capc_bytes's measurements)."""
    result = {
        "experiment": "side_by_side",
        "commands": commands,
        "delta": 1e-5,
        "rows": rows,
        "summary": summary.table(rows),
        **(others or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)


def reproducible(command: str) -> str:
    """``command`` without ``--work DIR``, which only places scratch files."""
    words = shlex.split(command)
    out: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
        elif w == "--work":
            skip = True
        elif not w.startswith("--work="):
            out.append(w)
    return shlex.join(out)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.side_by_side")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file of rows")
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--methods", nargs="+", choices=METHOD_GROUPS, default=METHOD_GROUPS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=None,
        help="labelled records per hospital ('all' for a whole share); default: the grid's",
    )
    parser.add_argument(
        "--teachers",
        type=int,
        default=None,
        help="capc: teachers per hospital (default: capc_runs.teachers_per_hospital)",
    )
    parser.add_argument(
        "--mechanism",
        type=json.loads,
        default=None,
        help="capc: the task's mechanism as JSON (default: the shipped share of the vote)",
    )
    parser.add_argument(
        "--capc-methods",
        nargs="+",
        choices=METHODS,
        default=list(METHODS),
        help="the capc methods to run (with --tuned-from: whose tuned picks to run); default all",
    )
    parser.add_argument(
        "--tuned-from",
        type=Path,
        default=None,
        help="capc: run the tuned picks of this capc_tuning file instead of the grid",
    )
    parser.add_argument(
        "--configurations",
        nargs="+",
        default=None,
        help="with --tuned-from: run only the picks of these configuration names (the "
        "others' rows stay as saved)",
    )
    parser.add_argument(
        "--mark-only",
        action="store_true",
        help="with --tuned-from: mark the saved rows by its picks; run nothing",
    )
    parser.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default="iid",
        help="the consortium (.scenarios); not iid: baselines are alone and dp_fedavg, "
        "capc is the central-mode loop (small-querier), capc-dp the DP-teacher methods",
    )
    parser.add_argument(
        "--epsilons",
        nargs="+",
        type=float,
        default=None,
        help="scenario and capc-dp runs: these eps only (default 1 2 5 10)",
    )
    parser.add_argument("--add-to", action="store_true", help="merge into the saved rows")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: temp)")
    parser.add_argument(
        "--rows-from",
        type=Path,
        nargs="+",
        default=None,
        help="saved side-by-side files whose rows to merge in; nothing is run",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if 0 in args.seeds:
        parser.error("seed 0 is the tuning seed; report seeds 1 and up")
    if args.mark_only and args.tuned_from is None:
        parser.error("--mark-only marks rows by --tuned-from's picks")
    import torch

    # The driver fits many tiny heads; one thread each op avoids thread hand-offs that
    # cost more than the arithmetic (10x on recalibration on a loaded 2-core machine).
    torch.set_num_threads(1)
    command = shlex.join(["python", "-m", "experiments.side_by_side", *(argv or sys.argv[1:])])
    saved = json.loads(args.out.read_text()) if args.add_to and args.out.exists() else {}
    rows: list[dict[str, Any]] = list(saved.get("rows", []))
    commands = [*saved.get("commands", []), command]
    # Kept (not made) by write(): each run adds its own reproducible form.
    saved["documented_as"] = {**saved.get("documented_as", {}), command: [reproducible(command)]}
    if args.rows_from:
        for path in args.rows_from:
            other = json.loads(path.read_text())
            rows = merged(rows, other["rows"])
            theirs = other.get("commands") or [shlex.join(other["command"])]
            commands += [c for c in theirs if c not in commands]
            # A part made by this driver says which commands make its rows; keep that.
            saved["documented_as"] = {
                **other.get("documented_as", {}),
                **saved["documented_as"],
            }
        write(args.out, rows, commands, kept(saved))
        return 0
    capc = CapcConfig(teachers=args.teachers, mechanism=args.mechanism)
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as tmp:
        work = args.work or Path(tmp)
        for dataset in args.datasets:
            sizes = LAYOUTS[dataset].sizes if args.sizes is None else _sizes(args.sizes)
            if args.scenario != "iid" or "capc-dp" in args.methods:
                if args.scenario != "iid" and args.sizes is None:
                    sizes = list(SCENARIO_SIZES[args.scenario])
                rows = _scenario(args, dataset, sizes, work, rows, commands, saved)
                continue
            if "baselines" in args.methods:
                from experiments.side_by_side.baselines import run_baselines

                new = run_baselines(dataset, sizes, capc.epsilons, args.seeds, work)
                rows = merged(rows, new)
                write(args.out, rows, commands, kept(saved))
            if "capc" in args.methods and args.tuned_from is not None:
                rows = _tuned(args, dataset, capc, work, rows, commands, saved)
            elif "capc" in args.methods:
                # Only the named methods, each at every eps (None: all, as the grid ran).
                methods = (
                    None
                    if set(args.capc_methods) == set(METHODS)
                    else {m: capc.epsilons for m in args.capc_methods}
                )
                for seed in args.seeds:
                    for n in sizes:
                        new = run_capc(split(dataset, seed), [n], capc, work, log, methods)
                        rows = merged(rows, new)
                        write(args.out, rows, commands, kept(saved))
    log(summary.markdown(summary.table(rows)))
    return 0


UNTUNED = "untuned_capc_rows"


def _tuned(
    args: argparse.Namespace,
    dataset: str,
    capc: CapcConfig,
    work: Path,
    rows: list[dict[str, Any]],
    commands: list[str],
    saved: dict[str, Any],
) -> list[dict[str, Any]]:
    """``rows`` with capc's tuned picks of ``dataset`` run and marked (:mod:`.tuned`),
    saved after every consortium; the grid rows they replace go to :data:`UNTUNED`."""
    picks = tuned.load(args.tuned_from, dataset)
    others = kept(saved)
    untuned: list[dict[str, Any]] = list(others.get(UNTUNED, []))
    rows = tuned.mark(rows, picks, dataset)
    write(args.out, rows, commands, others)
    if args.mark_only:
        return rows
    if args.sizes is None:
        order = sorted({int(p["n"]) for p in picks}, reverse=True)
    else:
        whole = split(dataset, args.seeds[0]).size(None)
        order = [whole if n is None else n for n in _sizes(args.sizes)]
    for n in order:
        for seed in args.seeds:
            for run in tuned.runs(picks, [n], args.capc_methods):
                if args.configurations and run.configuration not in args.configurations:
                    continue
                log(f"tuned: n={n} seed={seed} {run.configuration} {run.methods}")
                made = run_capc(split(dataset, seed), [n], run.config(capc), work, log, run.methods)
                new = tuned.kept(made, run)
                fresh = {key(r) for r in new}
                replaced = [r for r in rows if key(r) in fresh and not r.get("tuned")]
                untuned = merged(untuned, replaced)
                rows = tuned.mark(merged(rows, new), picks, dataset)
                others = {**others, UNTUNED: untuned}
                write(args.out, rows, commands, others)
    saved.update(others)
    return rows


def _scenario(
    args: argparse.Namespace,
    dataset: str,
    sizes: Sequence[int | None],
    work: Path,
    rows: list[dict[str, Any]],
    commands: list[str],
    saved: dict[str, Any],
) -> list[dict[str, Any]]:
    """``args.scenario``'s rows of ``dataset`` (.dp_capc), saved after every cell: the
    baselines (alone, dp_fedavg; iid: none here, the grid has them), today's loop in
    central mode (small-querier) and the DP-teacher methods, each tuned on the scenario's
    pseudo consortium (.scenarios.tuning_split)."""
    from experiments.side_by_side import dp_capc
    from experiments.side_by_side.data import TUNING_SEED
    from experiments.side_by_side.scenarios import transform, tuning_split

    epsilons = args.epsilons or list(CapcConfig().epsilons)
    scenario = args.scenario
    if scenario == "mixed-models":
        return _mixed(args, dataset, sizes, work, rows, commands, saved, epsilons)
    # The same partial search as the grid's animal-mnist baselines (diet-linear points).
    archs = ("diet-linear",) if dataset == "animal-mnist" else None
    contexts: dict[tuple[str, int], dp_capc.Context] = {}

    def save(new: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = merged(rows, new)
        write(args.out, out, commands, kept(saved))
        return out

    for n in sizes:
        tuning = tuning_split(split(dataset, TUNING_SEED), scenario, n)

        def by_seed(seed: int, n: int | None = n) -> Any:
            return transform(split(dataset, seed), scenario, n)

        if "baselines" in args.methods and scenario != "iid":
            for method, eps_list in (("alone", [None]), ("dp_fedavg", epsilons)):
                for e in eps_list:
                    new = dp_capc.baseline_cell(
                        method, by_seed, tuning, n, e, args.seeds, work, log, archs
                    )
                    rows = save(new)
        if "capc" in args.methods and scenario == "small-querier":
            for seed in args.seeds:
                new = [
                    r
                    for r in dp_capc.partitioned_loop(by_seed(seed), n, log)
                    if r["epsilon"] in epsilons
                ]
                rows = save(new)
        if "capc-dp" in args.methods and dataset in TABLE_DATASETS:
            from experiments.side_by_side import dp_tables

            for e in epsilons:
                rows = save(dp_tables.cell(by_seed, tuning, n, e, args.seeds, work, log))
        elif "capc-dp" in args.methods:
            methods = dp_capc.METHODS if scenario != "small-querier" else ("capc-dp-loop",)
            for e in epsilons:
                new = dp_capc.cell(
                    by_seed, tuning, n, e, args.seeds, work, log, methods, contexts=contexts
                )
                rows = save(new)
    return rows


def _mixed(
    args: argparse.Namespace,
    dataset: str,
    sizes: Sequence[int | None],
    work: Path,
    rows: list[dict[str, Any]],
    commands: list[str],
    saved: dict[str, Any],
    epsilons: Sequence[float],
) -> list[dict[str, Any]]:
    """Mixed models' rows (.mixed): animal-mnist at n = all only."""
    from experiments.side_by_side import mixed
    from experiments.side_by_side.data import TUNING_SEED
    from experiments.side_by_side.scenarios import transform, tuning_split

    if dataset != "animal-mnist" or list(sizes) != [None]:
        raise SystemExit(
            "mixed-models runs on animal-mnist at n = all only (--datasets animal-mnist, "
            "no --sizes): its architectures are image models"
        )
    out = rows

    def save(new: list[dict[str, Any]]) -> None:
        nonlocal out
        out = merged(out, new)
        write(args.out, out, commands, kept(saved))

    mixed.run(
        lambda seed: transform(split(dataset, seed), mixed.SCENARIO, None),
        tuning_split(split(dataset, TUNING_SEED), mixed.SCENARIO, None),
        epsilons,
        args.seeds,
        work,
        log,
        save,
        [m for m in args.methods if m in ("baselines", "capc-dp")],
    )
    return out


def _sizes(items: Sequence[str]) -> list[int | None]:
    return [None if s == "all" else int(s) for s in items]


if __name__ == "__main__":
    raise SystemExit(main())
