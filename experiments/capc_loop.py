"""The CaPC loop's gain through the networked services, at the demo's privacy budget.

The demo's consortium (services/commands/demo.py): the shipped body, 5 hospitals x 50 DIET
teachers on their shares of animal-mnist, GNMax sigma 40 (services/tasks/demo.json),
each hospital's cap eps 10 at delta 1e-5; the guardian, the hospitals, hospital 0's
querier student party and its gateway run as separate processes over mutual TLS.
Hospital 0 also queries (the guardian binds ``hospital-0-querier`` to it, so its
teachers never vote on its rounds). From records held out of every hospital it
owns, per seed, 200 labelled records (the n = 50 run uses the first 50), 500
unlabelled ones and 500 test records; the seed picks which held-out records are
which and is the training seed of both models.

For each (seed, n), with ``capcctl loop run --reveal-records-to-answerers --wait
--json`` as a separate process against the querier's gateway: hospital 0's model on
its n records alone (before), its 500 unlabelled records labelled by the other 4
hospitals (in the clear, the explicit audited choice), its model on both (after).

Budgets: ONE consortium (one ledger, every cap eps 10) serves all 6 runs, each
through a fresh querier party and gateway (the querier's certificate, hence its
guardian binding, is kept). 6 runs of 500 labels are 3,000 queries per answering
hospital, which eps 10 covers at sigma 40 (3,072 do: eps 9.75); 1,000 labels a run
would not fit. The eps saved per run is the guardian's cumulative charge to each
hospital for this querier, so it grows run by run. The teachers are fitted once
(split seed 0, 1,700 records held out of every hospital, as for 1,000 unlabelled
records a run) and copied into the consortium's directory; hospital 0's records
are the first 1,200 of those 1,700, so no teacher saw any of them.

Run (3 seeds, about 25 minutes on 2 shared cores):
    python -m experiments.capc_loop --out experiments/results/capc-loop.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from capc_client import Client
from numpy.typing import NDArray

from experiments.report import save
from services.commands.demo import DEMO_VOTERS, demo_task, shipped_body
from services.gateway.tokens import TokenStore
from services.harness import stop_all
from services.local import LocalConsortium, free_port

QUERIER, HOSPITAL = "hospital-0-querier", "hospital-0"
DELTA = 1e-5


@dataclass(frozen=True)
class Config:
    """The consortium, hospital 0's records and the runs."""

    hospitals: int = 5
    teachers: int = 50
    epsilon: float = 10.0
    owned: tuple[int, ...] = (50, 200)
    unlabelled: int = 500
    test: int = 500
    batch: int = 250
    #: Seconds the guardian waits for a hospital's shares: 2 shared cores read 250
    #: records through 50 teachers slowly (30 s, the default, aborted rounds).
    share_timeout: float = 300.0
    epochs: int = 10
    seeds: tuple[int, ...] = (1, 2, 3)
    #: Records held out of every hospital when its teachers are fitted (a superset of
    #: ``held_out``: the same split's first records).
    teacher_held_out: int = 1700

    @property
    def held_out(self) -> int:
        """Records held out of every hospital: hospital 0's own, unlabelled and test."""
        return max(self.owned) + self.unlabelled + self.test


@dataclass(frozen=True)
class Records:
    """Hospital 0's records in one seed: labelled (the largest n), unlabelled, test."""

    own: tuple[NDArray[np.float32], NDArray[np.int64]]
    unlabelled: NDArray[np.float32]
    test: tuple[NDArray[np.float32], NDArray[np.int64]]


def split_records(c: LocalConsortium, config: Config, seed: int) -> Records:
    """The seed's draw of hospital 0's records from the consortium's held-out ones."""
    x, y = c.queries, np.asarray(c.truth, dtype=np.int64)
    order = np.random.default_rng([11, seed]).permutation(len(x))
    n, u = max(config.owned), config.unlabelled
    own, unl, test = order[:n], order[n : n + u], order[n + u : n + u + config.test]
    return Records((x[own], y[own]), x[unl], (x[test], y[test]))


def consortium(
    config: Config, directory: Path, body: Path, held_out: int | None = None
) -> LocalConsortium:
    """The demo's consortium in ``directory`` with hospital 0's querier bound to it;
    ``held_out`` records (the config's by default) out of every hospital."""
    total = config.hospitals * config.teachers
    return LocalConsortium(
        directory,
        parties=config.hospitals,
        task=demo_task(total),
        body=body,
        teachers=[config.teachers] * config.hospitals,
        held_out=config.held_out if held_out is None else held_out,
        epsilon_cap=config.epsilon,
        queriers={QUERIER: HOSPITAL},
        share_timeout=config.share_timeout,
        log=lambda s: print(s, flush=True),
    )


def fit_teachers(config: Config, template: Path, body: Path) -> None:
    """Fit every hospital's teachers once, in ``template`` (split seed 0)."""
    consortium(config, template, body, max(config.teacher_held_out, config.held_out)).prepare()


def seeded(config: Config, template: Path, work: Path, body: Path) -> LocalConsortium:
    """A fresh consortium (own PKI and ledger) on the template's teachers."""
    directory = work / "consortium"
    shutil.rmtree(directory, ignore_errors=True)  # a fresh ledger, whatever ran before
    directory.mkdir(parents=True)
    for i in range(config.hospitals):
        shutil.copy(template / f"hospital-{i}.pt", directory / f"hospital-{i}.pt")
    c = consortium(config, directory, body)
    c.prepare()
    return c


class Querier:
    """Hospital 0's querier party and its gateway over ``c``, stopped by :meth:`stop`."""

    def __init__(self, c: LocalConsortium, records: Records, n: int, root: Path) -> None:
        self.c, self.root = c, root
        (c.directory / f"{QUERIER}.db").unlink(missing_ok=True)  # a fresh job store
        own = (records.own[0][:n], records.own[1][:n])
        student_port = c.start_querier(0, own, records.test)
        self.db = str(root / "loop-gateway.db")
        self.port = free_port()
        c.serve_gateway("loop-gateway", student_port, self.port, self.db)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def token(self, role: str) -> str:
        """A fresh bearer token of ``role`` for this gateway."""
        return TokenStore(self.db).create(role, role, 1.0)[0]

    def capcctl(self, *args: str) -> str:
        """``capcctl ARGS`` as the hospital's analyst, a separate process; its stdout."""
        env = {
            **os.environ,
            "CAPC_URL": self.url,
            "CAPC_TOKEN": self.token("analyst"),
            "CAPC_CA": str(self.c.ca),
        }
        out = subprocess.run(
            [sys.executable, "-m", "capc_client.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"capcctl {' '.join(args)} failed: {out.stderr or out.stdout}")
        return out.stdout

    def budgets(self) -> dict[str, float]:
        """Every hospital's eps spent, as the guardian's ledger says (admin, REST)."""
        admin = Client(self.url, self.token("admin"), ca=self.c.ca)
        return {b.party: float(b.epsilon_spent) for b in admin.budgets().budgets}

    def stop(self) -> None:
        """Stop the querier and its gateway; the consortium runs on."""
        mine = [p for p in self.c.procs if p.name in (QUERIER, "loop-gateway")]
        stop_all(mine, grace=30)  # a gateway may be busy for a while past SIGTERM
        self.c.procs = [p for p in self.c.procs if p not in mine]


def run_loop(
    c: LocalConsortium, records: Records, config: Config, seed: int, n: int, root: Path
) -> dict[str, Any]:
    """One (seed, n) run of ``capcctl loop run``; its row."""
    start = time.perf_counter()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    path = root / "own-unlabelled.npz"
    np.savez(path, x=records.unlabelled)
    q = Querier(c, records, n, root)
    try:
        ran = time.perf_counter()
        report = json.loads(
            q.capcctl(
                "loop",
                "run",
                "--records",
                str(path),
                "--reveal-records-to-answerers",
                "--batch-size",
                str(config.batch),
                "--epochs",
                str(config.epochs),
                "--seed",
                str(seed),
                "--wait",
                "--json",
                "--quiet",
            )
        )
        loop_seconds = time.perf_counter() - ran
        spent = q.budgets()
    finally:
        q.stop()
    return row(report, spent, config, seed, n, loop_seconds, time.perf_counter() - start)


def row(
    report: dict[str, Any],
    spent: dict[str, float],
    config: Config,
    seed: int,
    n: int,
    loop_seconds: float,
    seconds: float,
) -> dict[str, Any]:
    """The saved row of one run, from the loop's report and the guardian's budgets."""
    if report["hospital"] != HOSPITAL or report["bound_hospital"] != HOSPITAL:
        raise RuntimeError(f"the querier is not bound to {HOSPITAL}: {report}")
    out = {
        "seed": seed,
        "own": n,
        "unlabelled": config.unlabelled,
        "test": config.test,
        "accuracy_before": float(report["accuracy_before"]),
        "accuracy_after": float(report["accuracy_after"]),
        "gain": float(report["gain"]),
        "labels_bought": int(report["labels_bought"]),
        "records_revealed": int(report["records_revealed"]),
        "epsilon_by_party": report["epsilon_by_party"],
        "epsilon_charged_others": float(report["epsilon_spent"]),
        "epsilon_spent": spent,
        "hospital_0_epsilon": spent[HOSPITAL],
        "loop_seconds": loop_seconds,
        "seconds": seconds,
    }
    print(
        f"seed {seed}, n {n}: {out['accuracy_before']:.3f} -> {out['accuracy_after']:.3f} "
        f"(gain {out['gain']:+.3f}), {out['labels_bought']} labels, others' eps "
        f"{out['epsilon_charged_others']:.2f}, hospital-0 {out['hospital_0_epsilon']:g}, "
        f"{loop_seconds:.0f} s",
        flush=True,
    )
    return out


def run_all(
    config: Config, template: Path, work: Path, body: Path, partial: Path
) -> tuple[list[dict[str, Any]], float]:
    """One consortium; every (seed, n) in turn through a fresh querier, each row saved to
    ``partial`` as it comes. The rows and the consortium's start-up seconds."""
    start = time.perf_counter()
    c = seeded(config, template, work, body)
    rows: list[dict[str, Any]] = []
    try:
        c.start()
        started = time.perf_counter() - start
        for seed in config.seeds:
            records = split_records(c, config, seed)
            for n in config.owned:
                rows.append(run_loop(c, records, config, seed, n, work / f"seed-{seed}-own-{n}"))
                partial.write_text(json.dumps(rows, indent=2) + "\n")
    finally:
        c.stop()
    return rows, started


def _mean_std(values: Sequence[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), "std": float(v.std())}


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per n: before, after and gain (mean and std over seeds), the largest eps the loop
    charged any other hospital, the largest hospital 0 spent, labels bought per run."""
    out = []
    for n in sorted({int(r["own"]) for r in rows}):
        mine = [r for r in rows if r["own"] == n]
        out.append(
            {
                "own": n,
                "seeds": len(mine),
                "before": _mean_std([r["accuracy_before"] for r in mine]),
                "after": _mean_std([r["accuracy_after"] for r in mine]),
                "gain": _mean_std([r["gain"] for r in mine]),
                "largest_epsilon_others": max(r["epsilon_charged_others"] for r in mine),
                "largest_epsilon_hospital_0": max(r["hospital_0_epsilon"] for r in mine),
                "labels_bought": float(np.mean([r["labels_bought"] for r in mine])),
            }
        )
    return out


def pays(s: dict[str, Any]) -> bool:
    """The loop pays when its mean gain exceeds the seeds' spread of the gain and of the
    accuracy before."""
    return bool(s["gain"]["mean"] > max(s["gain"]["std"], s["before"]["std"]))


def format_table(result: dict[str, Any]) -> str:
    """The summary as the markdown table docs/results.md shows."""

    def cell(m: dict[str, float]) -> str:
        return f"{m['mean']:.3f} +- {m['std']:.3f}"

    lines = [
        "| own labelled n | before | after | gain | pays | eps charged to the others "
        "(largest, cumulative) | hospital-0 eps | labels bought |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in result["summary"]:
        lines.append(
            f"| {s['own']} | {cell(s['before'])} | {cell(s['after'])} | {cell(s['gain'])} | "
            f"{'yes' if pays(s) else 'no'} | {s['largest_epsilon_others']:.2f} | "
            f"{s['largest_epsilon_hospital_0']:g} | {s['labels_bought']:.0f} |"
        )
    return "\n".join(lines)


def run(config: Config, work: Path, command: str) -> dict[str, Any]:
    """Fit the teachers, then every seed's consortium; the saved result."""
    start = time.perf_counter()
    body, record = shipped_body()
    template = work / "teachers"
    fit_teachers(config, template, body)
    fitted = time.perf_counter() - start
    rows, started = run_all(config, template, work, body, work / "rows.json")
    return {
        "experiment": "capc-loop",
        "command": command,
        "body_sha256": record["file_sha256"],
        "task": demo_task(config.hospitals * config.teachers),
        "demo_voters": DEMO_VOTERS,
        "delta": DELTA,
        "config": {**asdict(config), "held_out": config.held_out},
        "rows": rows,
        "summary": summarise(rows),
        "teacher_fit_seconds": fitted,
        "consortium_start_seconds": started,
        "seconds": time.perf_counter() - start,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, default=len(Config.seeds))
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--unlabelled", type=int, default=Config.unlabelled)
    ap.add_argument("--work", type=Path, default=None, help="keep the consortia here")
    args = ap.parse_args(args_list)
    config = Config(
        unlabelled=args.unlabelled,
        seeds=tuple(range(args.first_seed, args.first_seed + args.seeds)),
    )
    command = " ".join(["python -m experiments.capc_loop", *args_list])
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # 2 shared cores: one thread a process
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        result = run(config, args.work, command)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = run(config, Path(tmp), command)
    save(result, args.out)
    print(format_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
