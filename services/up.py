"""``capc up``: a whole DIET-CaPC consortium on this machine that an analyst can use.

Starts the guardian, N hospitals, the student party (``capc student``, with its
held-out test set and reference batch) and the REST gateway (HTTPS, a development
certificate) as separate processes over mutual TLS (services/local.py), creates
an analyst and an admin token, and prints, on stdout, the task's name, the
``export CAPC_URL=... CAPC_TOKEN=... CAPC_CA=...`` line and a first ``capcctl``
command; progress goes to stderr. It runs until interrupted; run again on the
same ``--dir``, it reuses the keys, teachers and ledgers (spent epsilon included).

The default task is the demo's: every hospital hosts 50 DIET teachers (the shipped
pretrained body with one disjoint part of its data's BatchNorm statistics and last
layer each) and votes under GNMax, sigma chosen by the guardian's own accountant
(exact Gaussian DP, delta 1e-5) so that at least ``--queries`` queries fit every
hospital's cap, and never below 16% of the voters (the demo's sigma 40 for 250).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capc.mechanisms import from_config
from capc.models.ensemble import Voters
from capc.privacy.accountants import DEFAULT_ACCOUNTANT, Accounting, make
from services import tasks
from services.common.ledger import Ledger, LedgerError
from services.demo import DEMO_TEST, DEMO_VOTERS, shipped_body
from services.local import TASK_NAME, LocalConsortium

#: The guardian's defaults (capc guardian): the accountant and delta every cap is read at.
DELTA = 1e-5
#: How long the printed tokens stay valid (days).
TOKEN_DAYS = 30.0


def note(text: str) -> None:
    """A progress line, on stderr: stdout holds only what a user copies (or the JSON)."""
    print(text, file=sys.stderr, flush=True)


# -- planning -------------------------------------------------------------------------
def accountant() -> Accounting:
    """The accountant a guardian's ledger uses unless told otherwise (capc guardian)."""
    return make(DEFAULT_ACCOUNTANT)


def queries_fit(task: dict[str, Any], epsilon: float) -> int:
    """Queries of ``task``'s worst case that fit a fresh cap of ``epsilon`` at delta 1e-5,
    by the guardian's accountant (Ledger.queries_fit without a ledger)."""
    mech = from_config(task["mechanism"], int(task["num_classes"]))
    return accountant().max_count(mech.per_query(), epsilon, DELTA)


def planned_task(voters: int, epsilon: float, queries: int) -> dict[str, Any]:
    """The default task for ``voters`` teachers in all: GNMax with sigma the larger of the
    demo's share of the vote (40 for 250) and the smallest sigma (to 0.01) at which
    ``queries`` queries fit a cap of ``epsilon``."""
    task = tasks.load(TASK_NAME)
    mech = from_config(task["mechanism"], int(task["num_classes"]))
    share = mech.scaled_noise(voters / DEMO_VOTERS)
    # A Gaussian's loss scales as 1 / sigma**2: m times the loss is sigma / sqrt(m).
    m = accountant().max_multiplier(share.per_query(), queries, epsilon, DELTA)
    sigma = float(share.to_config()["sigma"])
    if m < 1.0:
        sigma = math.ceil(sigma / math.sqrt(m) * 100.0) / 100.0
    task["mechanism"] = {**task["mechanism"], "sigma": sigma}
    return task


# -- hospitals ------------------------------------------------------------------------
def own_teachers(items: Sequence[str], parties: int) -> dict[int, Path]:
    """``--teachers NAME=FILE`` pairs as {hospital index: file}; names are hospital-I."""
    out: dict[int, Path] = {}
    names = {f"hospital-{i}": i for i in range(parties)}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or name not in names or not file:
            raise SystemExit(
                f"capc up: --teachers takes NAME=FILE with NAME one of hospital-0 .. "
                f"hospital-{parties - 1}, got {item!r}"
            )
        path = Path(file).resolve()
        if not path.is_file():
            raise SystemExit(f"capc up: {name}'s teacher file {path} does not exist")
        out[names[name]] = path
    return out


def teacher_counts(own: dict[int, Path], parties: int, per_hospital: int) -> list[int]:
    """Teachers each hospital votes with: its own file's count, else ``per_hospital``.
    The guardian pins these (--register NAME=EPS:TEACHERS)."""
    return [len(Voters.load([own[i]])) if i in own else per_hospital for i in range(parties)]


# -- what the user sees ---------------------------------------------------------------
@dataclass(frozen=True)
class Access:
    """How an analyst reaches the running consortium."""

    url: str
    analyst: str
    admin: str
    ca: Path

    def export(self) -> str:
        """The shell line that sets capcctl's environment."""
        return (
            f"export CAPC_URL={self.url} CAPC_TOKEN={shlex.quote(self.analyst)} "
            f"CAPC_CA={shlex.quote(str(self.ca))}"
        )


def first_command(left: int, queries: int) -> str | None:
    """A capcctl command the hospitals' remaining budgets cover (``left`` queries); None
    when they cover none."""
    if left < 1:
        return None
    return f"capcctl jobs submit --count {min(queries, left)} --wait"


def queries_left(c: LocalConsortium, task: dict[str, Any]) -> dict[str, int]:
    """Per hospital: queries of the task's worst case its remaining cap covers, as the
    guardian's ledger counts them (what it spent in an earlier run included)."""
    mech = from_config(task["mechanism"], int(task["num_classes"]))
    ledger = Ledger(c.db, delta=None, migrate=False)
    try:
        return {
            f"hospital-{i}": ledger.queries_fit(mech.per_query(), c.cap(i), f"hospital-{i}")
            for i in range(c.parties)
        }
    finally:
        ledger.engine.dispose()


def describe(task: dict[str, Any], counts: list[int], epsilon: float, fit: int) -> str:
    """One line: the task's name, its mechanism, the voters and what fits a cap."""
    mech = dict(task["mechanism"])
    name = mech.pop("name")
    params = ", ".join(
        f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in mech.items()
    )
    return (
        f"task {TASK_NAME}: {name} ({params}) over {sum(counts)} teachers "
        f"({len(counts)} hospitals: {', '.join(map(str, counts))}); {fit} queries fit each "
        f"hospital's cap of eps {epsilon:g} (delta {DELTA:g}, exact Gaussian DP)"
    )


def report(
    args: argparse.Namespace,
    c: LocalConsortium,
    access: Access,
    summary: dict[str, Any],
) -> None:
    """Print what a user needs on stdout: one JSON object with --json, else lines."""
    if args.json:
        print(json.dumps(summary, sort_keys=True), flush=True)
        return
    print(summary["description"])
    for name, left in summary["queries_left"].items():
        print(f"  {name}: {left} queries left under its cap")
    print(access.export())
    print(
        f"# admin token (capcctl budget, parties, ledger, audit; the dashboard at "
        f"{access.url}/dashboard): CAPC_TOKEN={access.admin}"
    )
    if summary["command"] is None:
        print("# every hospital's cap is spent: capc up --dir NEW starts a fresh consortium")
    else:
        print(summary["command"], flush=True)


# -- the command ----------------------------------------------------------------------
def _check(args: argparse.Namespace) -> None:
    if not 1 <= args.parties <= 64:
        raise SystemExit("capc up: --parties takes 1 to 64")
    if not 1 <= args.teachers_per_hospital <= 1024:
        raise SystemExit("capc up: --teachers-per-hospital takes 1 to 1024")
    if not args.epsilon > 0 or args.queries < 1:
        raise SystemExit("capc up: --epsilon must be positive and --queries at least 1")


def task_for(args: argparse.Namespace, counts: list[int]) -> dict[str, Any]:
    """The task file's configuration, or the planned default for these voters."""
    if args.task is None:
        return planned_task(sum(counts), args.epsilon, args.queries)
    try:
        config: dict[str, Any] = json.loads(Path(args.task).read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"capc up: cannot read the task {args.task}: {err}") from None
    return config


def consortium(args: argparse.Namespace) -> tuple[LocalConsortium, list[int]]:
    """The consortium ``args`` describe, not yet prepared; and each hospital's teachers."""
    own = own_teachers(args.teachers, args.parties)
    counts = teacher_counts(own, args.parties, args.teachers_per_hospital)
    task = task_for(args, counts)
    body = Path(args.body) if args.body is not None else shipped_body()[0]
    c = LocalConsortium(
        Path(args.dir).resolve(),
        parties=args.parties,
        task=task,
        body=body,
        teachers=counts,
        own_models=own,
        held_out=DEMO_TEST,
        log=note,
        epsilon_cap=args.epsilon,
    )
    return c, counts


def start(c: LocalConsortium) -> Access:
    """Prepare and start every process; an analyst's and an admin's fresh tokens."""
    c.prepare()
    c.start()
    c.start_student()
    note("student party serving jobs")
    c.start_gateway()
    analyst = c.token("analyst", "capc-up-analyst", TOKEN_DAYS)
    admin = c.token("admin", "capc-up-admin", TOKEN_DAYS)
    return Access(c.gateway_url, analyst, admin, c.ca)


class StopRequestedError(Exception):
    """SIGINT or SIGTERM arrived: stop every process and return."""


def _interrupt(signum: int, frame: object) -> None:
    raise StopRequestedError(signal.Signals(signum).name)


def stop_on_signals() -> None:
    """SIGINT and SIGTERM interrupt whatever runs, start-up included, so that the
    ``finally`` stopping the children always runs (none is left behind)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)


def run(args: argparse.Namespace) -> int:
    """``capc up``: start, print how to reach it, serve until interrupted."""
    _check(args)
    began = time.perf_counter()
    stop_on_signals()
    c, counts = consortium(args)
    reused = (c.directory / "ledger.db").exists()
    if reused:
        note(
            f"reusing {c.directory} from an earlier run: its keys, teachers and ledgers "
            "(epsilon spent there still counts); a new --dir starts afresh"
        )
    fit = queries_fit(c.task, args.epsilon)
    note(describe(c.task, counts, args.epsilon, fit))
    if fit < args.queries:
        note(f"warning: this task covers only {fit} queries per hospital at eps {args.epsilon:g}")
    try:
        try:
            access = start(c)
        except LedgerError as err:
            raise SystemExit(
                f"capc up: {err} (the ledger in {c.directory}; use a new --dir)"
            ) from None
        left = queries_left(c, c.task)
        least = min(left.values())
        summary = {
            "task": TASK_NAME,
            "description": describe(c.task, counts, args.epsilon, fit),
            "mechanism": c.task["mechanism"],
            "teachers": {f"hospital-{i}": n for i, n in enumerate(counts)},
            "epsilon_cap": args.epsilon,
            "delta": DELTA,
            "queries_fit": fit,
            "queries_left": left,
            "url": access.url,
            "token": access.analyst,
            "admin_token": access.admin,
            "ca": str(access.ca),
            "export": access.export(),
            "command": first_command(least, args.queries),
            "dashboard": f"{access.url}/dashboard",
            "guardian": c.address,
            "dir": str(c.directory),
            "reused": reused,
            "seconds": round(time.perf_counter() - began, 1),
        }
        report(args, c, access, summary)
        note(f"consortium is up after {summary['seconds']:.0f}s; Ctrl-C stops it")
        threading.Event().wait()
    except StopRequestedError as why:
        note(f"{why}: stopping the consortium")
    finally:
        c.stop()
    return 0
