"""Measured bytes of capc's labelling jobs, and the side-by-side rows made before the
counting relay given bytes fitted from them.

Run (every teacher count the saved capc rows use; minutes a consortium on 2 shared
cores):
    python -m experiments.side_by_side.capc_bytes --out experiments/results/side-by-side.json

Refit the rows from the saved measurements, measuring nothing:
    python -m experiments.side_by_side.capc_bytes --out experiments/results/side-by-side.json --fill-only

Per (dataset, teachers per hospital ``m``) one :class:`services.local.LocalConsortium`
of separate processes over mutual TLS, as the grid's (``capc_runs.consortium``: the
same hospitals, task and sigma for ``m``), with the counting relay in front of the
guardian (:mod:`experiments.side_by_side.wire`). Each hospital fits its ``m``
teachers on its first ``RECORDS_PER_TEACHER * m`` records: a job's bytes depend on
the vote's shape (hospitals, teachers, classes), not on how good the teachers are.
Every hospital's cap is large (the grid's cap would run out; no byte depends on it).

Each method runs, through the REST API and the grid's own submit calls, jobs of
``SIZES`` queries in rounds of the grid's batch (256): ``first`` (the student
party's first job, which opens its session with the guardian), the same size again
and a job of several rounds (``fit``: the line ``per_round * rounds + per_query *
queries``, :mod:`experiments.side_by_side.bytes_fit`), and one more size
(``check``: measured against the line, the residual saved). The DIET student labels
generated queries, PATE-public the public records, the loop (images) hospital 0's
own unlabelled records through its querier party. ``session_setup_bytes`` is the
first job less the same size again. The hospitals' heartbeats while nothing runs
are ``idle_bytes_per_s``.

The measurements are saved under ``capc_bytes`` in the results file (the command in
``commands``), and every capc row without measured bytes is filled from them
(:func:`experiments.side_by_side.bytes_fit.fill`); accuracies are not touched.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from capc_client import Client
from numpy.typing import NDArray

from experiments.side_by_side import bytes_fit
from experiments.side_by_side.__main__ import kept, write
from experiments.side_by_side.capc_runs import (
    CapcConfig,
    Cell,
    consortium,
    label,
    start_loop,
    submit_diet,
    submit_records,
)
from experiments.side_by_side.data import DATASETS, split
from experiments.side_by_side.wire import count_guardian, settled
from services.testbed.proxy import LinkProxy

#: Jobs a method runs: first (opens the session), fit (one round; several), check.
SIZES = (8, 264, 600)
#: Records each hospital fits a teacher on (the grid's rule: ~10 images, ~12 rows).
RECORDS_PER_TEACHER = {"animal-mnist": 10, "breast-cancer": 12}
#: Every hospital's cap here: large, so that no measurement runs out.
CAP = 1e6
#: Seconds of nothing running over which the heartbeats are counted.
IDLE_S = 30.0
Log = Callable[[str], None]


def teacher_counts(
    rows: Sequence[dict[str, Any]], datasets: Sequence[str]
) -> list[tuple[str, int]]:
    """Every (dataset, teachers per hospital) the saved capc rows of ``datasets`` use."""
    return sorted(
        {
            (r["dataset"], int(r["teachers_per_hospital"]))
            for r in rows
            if r["method"].startswith("capc-") and r["dataset"] in datasets
        }
    )


def _tile(x: NDArray[np.float32], start: int, count: int) -> NDArray[np.float32]:
    """``count`` records of ``x`` from ``start``, wrapping round (bytes do not depend on
    which records they are)."""
    return x[np.arange(start, start + count) % len(x)]


def measure_method(
    method: str,
    client: Client,
    submit: Callable[[int, int], Any],
    relay: LinkProxy,
    sizes: Sequence[int],
    log: Log,
) -> dict[str, Any]:
    """One method's jobs (``submit(start, count)`` submits one) and its fitted line."""
    first, one, check = sizes
    jobs: list[dict[str, Any]] = []
    start = 0
    for role, q in (("first", first), ("fit", first), ("fit", one), ("check", check)):
        t0 = time.perf_counter()
        got = label(client, partial(submit, start, q), f"{method}: {q} queries", relay)
        jobs.append(
            {
                "role": role,
                "queries": q,
                "rounds": bytes_fit.rounds(q),
                "answered": got.answered,
                "bytes": got.bytes_sent,
                "seconds": time.perf_counter() - t0,
            }
        )
        log(f"  {method}: {role} job of {q} queries: {got.bytes_sent} bytes")
        start += q
    line = bytes_fit.fit([(j["queries"], j["bytes"]) for j in jobs if j["role"] == "fit"])
    predicted = line.predict(check)
    return {
        "method": method,
        "jobs": jobs,
        "per_round": line.per_round,
        "per_query": line.per_query,
        "session_setup_bytes": jobs[0]["bytes"] - jobs[1]["bytes"],
        "check": {
            "queries": check,
            "measured": jobs[-1]["bytes"],
            "predicted": predicted,
            "residual": jobs[-1]["bytes"] - predicted,
            "relative_residual": (jobs[-1]["bytes"] - predicted) / jobs[-1]["bytes"],
        },
    }


def measure(
    dataset: str, m: int, seed: int, sizes: Sequence[int], work: Path, log: Log
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One consortium's start-up and idle bytes, and each of its methods' jobs."""
    s = split(dataset, seed)
    n = min(s.size(None), RECORDS_PER_TEACHER[dataset] * m)
    if n < m:
        raise ValueError(f"{dataset}: {m} teachers a hospital need {m} records, a share has {n}")
    cell = Cell(s, n, CapcConfig(teachers=m), work / f"{dataset}-m{m}", log)
    t0 = time.perf_counter()
    c, _, got_m = consortium(cell, epsilon_cap=CAP)
    relay = count_guardian(c)
    methods: list[dict[str, Any]] = []
    try:
        c.start()
        c.start_student()
        c.start_gateway()
        setup = settled(relay)
        analyst = Client(c.gateway_url, c.token("analyst", "capc-bytes"), ca=c.ca, timeout=600)
        public = s.x[s.public]
        submitters: list[tuple[str, Client, Callable[[int, int], Any]]] = [
            ("capc-diet-student", analyst, partial(submit_diet, analyst, cell)),
            (
                "capc-pate-public",
                analyst,
                lambda lo, q: submit_records(
                    analyst, cell, _tile(public, lo, q), f"public-{lo}.npz"
                ),
            ),
        ]
        querier_setup = None
        if cell.images:
            hospital, querier_setup = start_loop(cell, c, relay)
            own = s.x[s.unlabelled(0, n)]
            submitters.append(
                (
                    "capc-loop",
                    hospital,
                    lambda lo, q: submit_records(
                        hospital, cell, _tile(own, lo, q), f"own-{lo}.npz", own=True
                    ),
                )
            )
        for method, client, submit in submitters:
            entry = measure_method(method, client, submit, relay, sizes, log)
            methods.append({"dataset": dataset, "teachers_per_hospital": got_m, **entry})
        before, idle_start = settled(relay), time.perf_counter()
        time.sleep(IDLE_S)
        idle = (relay.bytes_total - before) / (time.perf_counter() - idle_start)
    finally:
        c.stop()
        relay.stop()
    entry = {
        "dataset": dataset,
        "teachers_per_hospital": got_m,
        "hospitals": s.hospitals,
        "records_per_hospital": n,
        "setup_bytes": setup,
        "querier_setup_bytes": querier_setup,
        "idle_bytes_per_s": idle,
        "seconds": time.perf_counter() - t0,
    }
    return entry, methods


def _merge(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``old`` with the entries of ``new`` replacing those of the same cell."""

    def key(e: dict[str, Any]) -> tuple[Any, ...]:
        return (e["dataset"], e["teachers_per_hospital"], e.get("method"))

    fresh = {key(e) for e in new}
    return [e for e in old if key(e) not in fresh] + list(new)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.side_by_side.capc_bytes")
    parser.add_argument("--out", type=Path, required=True, help="the side-by-side results")
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument(
        "--sizes",
        nargs=3,
        type=int,
        default=list(SIZES),
        metavar=("ONE_ROUND", "ROUNDS", "CHECK"),
        help="queries of the first and fit jobs (one round; several) and of the check job",
    )
    parser.add_argument("--seed", type=int, default=1, help="whose hospital shares teach")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: temp)")
    parser.add_argument(
        "--fill-only", action="store_true", help="refit the rows from the saved measurements"
    )
    return parser


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    one, several, _ = args.sizes
    if bytes_fit.rounds(one) != 1 or bytes_fit.rounds(several) < 2:
        parser.error(f"--sizes: {one} must fit one round of {bytes_fit.BATCH}, {several} not")
    import torch

    torch.set_num_threads(1)  # as the grid's driver: many tiny fits on 2 shared cores
    command = shlex.join(
        ["python", "-m", "experiments.side_by_side.capc_bytes", *(argv or sys.argv[1:])]
    )
    saved = json.loads(args.out.read_text())
    rows: list[dict[str, Any]] = saved["rows"]
    measured: dict[str, Any] = saved.get("capc_bytes") or {
        "batch": bytes_fit.BATCH,
        "consortia": [],
        "methods": [],
        "commands": [],
    }
    if not args.fill_only:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="capc-bytes-") as tmp:
            for dataset, m in teacher_counts(rows, args.datasets):
                log(f"{dataset}, {m} teachers a hospital")
                entry, methods = measure(
                    dataset, m, args.seed, args.sizes, args.work or Path(tmp), log
                )
                measured["consortia"] = _merge(measured["consortia"], [entry])
                measured["methods"] = _merge(measured["methods"], methods)
        measured["sizes"] = list(args.sizes)
        measured["seconds"] = time.perf_counter() - start
    measured["commands"] = [*measured.get("commands", []), command]
    rows = bytes_fit.fill(rows, measured, datasets=args.datasets)
    commands = [*saved["commands"], command]
    write(args.out, rows, commands, {**kept(saved), "capc_bytes": measured})
    for e in measured["methods"]:
        log(
            f"{e['dataset']} m={e['teachers_per_hospital']} {e['method']}: "
            f"{e['per_query']:.0f} B a query, {e['per_round']:.0f} B a round, "
            f"check {e['check']['relative_residual']:+.2%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
