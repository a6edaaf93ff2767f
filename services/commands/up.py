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

import numpy as np
from numpy.typing import NDArray

from capc.data.readers import read_records, read_unlabelled
from capc.data.schema import SchemaError
from capc.mechanisms import from_config
from capc.models.ensemble import Voters
from capc.models.foreign import CodeModelRefusedError, Interface
from capc.planning.sizing import recheck
from capc.privacy.accountants import DEFAULT_ACCOUNTANT, Accounting, make
from capc.round.errors import LedgerRefusedError
from capc.task_config import TaskConfig, config_hash
from services import tasks
from services.commands.demo import DEMO_TEST, DEMO_VOTERS, shipped_body
from services.common.ledger import Ledger
from services.gateway.tokens import TokenStore
from services.local import TASK_NAME, LocalConsortium, free_port

#: The guardian's defaults (capc guardian): the accountant and delta every cap is read at.
DELTA = 1e-5
#: Seconds the guardian waits for a round's shares. Real records (the CaPC loop) are read
#: with each teacher's own statistics, one body pass per teacher: 256 records through 40
#: DIET teachers take about 20 s on a quiet 2-core machine, far more on a busy one.
SHARE_TIMEOUT_S = 300.0
#: How long the printed tokens stay valid (days).
TOKEN_DAYS = 30.0
#: The offline data's input shape (animal-mnist): what teachers fitted here and the
#: default test set and reference batch take.
OFFLINE_SHAPE = (1, 28, 28)
#: The command a looping hospital runs on its own unlabelled records.
LOOP_COMMAND = "capcctl loop run --records UNLABELLED.npz --reveal-records-to-answerers --wait"


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


def teacher_counts(
    own: dict[int, Path], parties: int, per_hospital: int, want: Interface | None = None
) -> list[int]:
    """Teachers each hospital votes with: its own file's count, else ``per_hospital``.
    The guardian pins these (--register NAME=EPS:TEACHERS). ``want``: the task's
    interface, which a foreign model (ONNX, TorchScript) that declares no input shape or
    classes takes them from; a file that cannot be loaded is refused by name."""
    counts: list[int] = []
    for i in range(parties):
        if i not in own:
            counts.append(per_hospital)
            continue
        try:
            counts.append(len(Voters.load([own[i]], want)))
        except CodeModelRefusedError as err:
            # capc up runs every hospital here, with this process's rights: no code models.
            raise SystemExit(
                f"capc up: hospital-{i}'s teacher file is refused: {err}. capc up runs "
                "capc checkpoints and ONNX files only; run a hospital that votes with its "
                "own code as its own capc answerer --trust-model-code"
            ) from err
        except (ValueError, OSError, RuntimeError) as err:
            raise SystemExit(f"capc up: hospital-{i}'s teacher file {own[i]}: {err}") from None
    return counts


def interface_of(args: argparse.Namespace) -> Interface:
    """What the task asks of a teacher, read before the teachers are counted: the task
    file's (--task), else the default task's (the planned task only changes its noise)."""
    config = config_of(tasks.load(TASK_NAME) if args.task is None else read_task_file(args.task))
    return Interface(task_label(args), config.input_shape, config.outputs, config.multi_label)


def task_label(args: argparse.Namespace) -> str:
    """The task as printouts name it: its file's name (--task breast-cancer.json:
    "breast-cancer"), else the default image task's. The consortium serves it under
    the wire name TASK_NAME whatever its records are."""
    return TASK_NAME if args.task is None else Path(args.task).stem


# -- data -----------------------------------------------------------------------------
Labelled = tuple[NDArray[np.float32], NDArray[np.int64]]


@dataclass(frozen=True)
class LoopPlan:
    """``--loop HOSPITAL``: the hospital's index, its own labelled records (x (N, *shape)
    float32, y (N,) class indices) and its held-out test set (the same)."""

    hospital: int
    own: Labelled
    test: Labelled

    @property
    def name(self) -> str:
        return f"hospital-{self.hospital}"

    @property
    def querier(self) -> str:
        """The certificate the guardian binds to the hospital (capc guardian --querier)."""
        return f"{self.name}-querier"


def config_of(task: dict[str, Any]) -> TaskConfig:
    """The task as every party parses it (its records' schema, shape and classes)."""
    return TaskConfig.parse(TASK_NAME, task, config_hash(task))


def existing(path: Path, flag: str) -> Path:
    """``path`` resolved; a clear refusal when it is not a file."""
    if not path.is_file():
        raise SystemExit(f"capc up: {flag} {path}: no such file")
    return path.resolve()


def labelled(path: Path, flag: str, task: TaskConfig) -> Labelled:
    """An NPZ's x (N, *input_shape) float32 and y (N,) class indices, checked against the task."""
    try:
        r = read_records(existing(path, flag), task.records, task.input_shape, task.class_names)
    except SchemaError as err:
        raise SystemExit(f"capc up: {flag}: {err}") from None
    return r.x, r.y


def unlabelled(path: Path, flag: str, task: TaskConfig) -> NDArray[np.float32]:
    """An NPZ's x (N, *input_shape) float32, checked against the task."""
    try:
        return read_unlabelled(existing(path, flag), task.records, task.input_shape)
    except SchemaError as err:
        raise SystemExit(f"capc up: {flag}: {err}") from None


def loop_plan(args: argparse.Namespace, task: TaskConfig) -> LoopPlan | None:
    """``--loop HOSPITAL --own-data OWN.npz --own-test TEST.npz`` read and checked; None
    without --loop."""
    if args.loop is None:
        if args.own_data is not None or args.own_test is not None:
            raise SystemExit("capc up: --own-data and --own-test go with --loop HOSPITAL")
        return None
    names = {f"hospital-{i}": i for i in range(args.parties)}
    if args.loop not in names:
        raise SystemExit(
            f"capc up: --loop takes one of hospital-0 .. hospital-{args.parties - 1}, "
            f"got {args.loop!r}"
        )
    if args.own_data is None or args.own_test is None:
        raise SystemExit("capc up: --loop needs --own-data OWN.npz and --own-test TEST.npz")
    own = labelled(args.own_data, "--own-data", task)
    test = labelled(args.own_test, "--own-test", task)
    return LoopPlan(names[args.loop], own, test)


@dataclass(frozen=True)
class StudentData:
    """``--test-data`` (x, y) and ``--reference-data`` (x), read and checked before anything
    starts; None: the offline held-out images."""

    test: Labelled | None
    reference: NDArray[np.float32] | None

    def apply(self, c: LocalConsortium) -> None:
        """Replace the prepared consortium's offline test set and reference batch."""
        if self.test is not None:
            c.queries, c.truth = self.test
        if self.reference is not None:
            c.reference = self.reference


def loop_quorum(task: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The task with a quorum the loop's rounds can meet: they leave the looping hospital
    out, so at most ``parties - 1`` answer. The planned task's quorum is lowered to that
    (the noise per query does not depend on it); a task file's is refused."""
    answering = args.parties - 1
    quorum = int(task.get("quorum", 1))
    if quorum <= answering:
        return task
    if args.task is not None or answering < 1:
        raise SystemExit(
            f"capc up: --loop {args.loop}'s rounds leave it out, so {answering} hospital(s) "
            f"answer, fewer than the task's quorum of {quorum}: more --parties or a smaller "
            "quorum"
        )
    note(f"--loop: quorum {quorum} -> {answering} (the rounds leave {args.loop} out)")
    return {**task, "quorum": answering}


def is_table(task: TaskConfig) -> bool:
    """Whether the task's records are table rows ((F,) inputs): its teachers and students
    are MLPs trained from scratch, no pretrained (image) body takes them."""
    return len(task.input_shape) == 1


def student_data(args: argparse.Namespace, task: TaskConfig, own: dict[int, Path]) -> StudentData:
    """The student's test set and reference batch; a task the offline data cannot serve
    (another input shape) is refused unless the test set is given, the reference batch
    too for images (a table's student has no body to read through one), and every
    hospital brings its own teachers."""
    if task.input_shape != OFFLINE_SHAPE:
        given = [("--test-data", args.test_data)]
        if not is_table(task):
            given.append(("--reference-data", args.reference_data))
        missing = [flag for flag, value in given if value is None]
        missing += [f"--teachers hospital-{i}=FILE" for i in range(args.parties) if i not in own]
        if missing:
            raise SystemExit(
                f"capc up: the task's inputs are {'x'.join(map(str, task.input_shape))}, not "
                f"the offline data's {'x'.join(map(str, OFFLINE_SHAPE))}: give "
                + ", ".join(missing)
                + " (capc data pack writes the data, capc teacher fit the teachers: "
                "docs/hospital.md)"
            )
    test = None if args.test_data is None else labelled(args.test_data, "--test-data", task)
    reference = (
        None
        if args.reference_data is None
        else unlabelled(args.reference_data, "--reference-data", task)
    )
    return StudentData(test, reference)


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


@dataclass(frozen=True)
class LoopAccess:
    """How a looping hospital reaches its own gateway (over its querier student party)."""

    hospital: str
    url: str
    token: str
    ca: Path
    #: An admin token of the same gateway: its operator's budget, ledger and audit views
    #: and dashboard.
    admin: str = ""
    #: Queries of the task's worst case the other hospitals' caps still cover (the
    #: least of them): at most this many of its records can be labelled.
    queries_left: int = 0

    def export(self) -> str:
        """The shell line that sets capcctl's environment for the hospital's gateway."""
        return Access(self.url, self.token, "", self.ca).export()

    def summary(self) -> dict[str, Any]:
        """The ``loop`` object of ``capc up --json``."""
        return {
            "hospital": self.hospital,
            "url": self.url,
            "token": self.token,
            "ca": str(self.ca),
            "export": self.export(),
            "command": LOOP_COMMAND,
            "admin_token": self.admin,
            "dashboard": f"{self.url}/dashboard",
            "queries_left": self.queries_left,
        }


#: With --loop, the share of the hospitals' remaining queries the consortium's first
#: suggested job may take: the rest is left for the looping hospital's records.
LOOP_SHARE = 4


def first_command(left: int, queries: int, loop: bool = False) -> str | None:
    """A capcctl command the hospitals' remaining budgets cover (``left`` queries); None
    when they cover none. With a CaPC loop (``loop``) it takes at most a quarter of
    ``left``, so that the loop's labels are not spent by the first suggested job: every
    query the consortium's student asks charges the same hospitals the loop asks."""
    count = min(queries, left // LOOP_SHARE if loop else left)
    if count < 1:
        return None
    return f"capcctl jobs submit --count {count} --wait"


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


def describe(
    task: dict[str, Any], counts: list[int], epsilon: float, fit: int, label: str = TASK_NAME
) -> str:
    """One line: the task's name (``label``: its file's, see :func:`task_label`), its
    records, its mechanism, the voters and what fits a cap."""
    mech = dict(task["mechanism"])
    name = mech.pop("name")
    params = ", ".join(
        f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in mech.items()
    )
    return (
        f"task {label} ({records_text(task)}): {name} ({params}) over {sum(counts)} teachers "
        f"({len(counts)} hospitals: {', '.join(map(str, counts))}); {fit} queries fit each "
        f"hospital's cap of eps {epsilon:g} (delta {DELTA:g}, exact Gaussian DP)"
    )


def records_text(task: dict[str, Any]) -> str:
    """What the task's records are, in a few words: "table rows of 30 features" or
    "1x28x28 images"."""
    shape = config_of(task).input_shape
    if len(shape) == 1:
        return f"table rows of {shape[0]} features"
    return f"{'x'.join(map(str, shape))} images"


def print_report(
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
    if summary["command"] is None and min(summary["queries_left"].values(), default=0) > 0:
        print("# what the caps still cover is left for the loop below")
    elif summary["command"] is None:
        print("# every hospital's cap is spent: capc up --dir NEW starts a fresh consortium")
    else:
        if summary.get("loop") is not None:
            print(
                "# the consortium's first job takes at most a quarter of what the caps "
                "cover: the rest is left for the loop below"
            )
        print(summary["command"], flush=True)
    loop = summary.get("loop")
    if loop is not None:
        print(
            f"# {loop['hospital']}'s CaPC loop: its own gateway; the other hospitals' caps "
            f"cover {loop['queries_left']} more queries, so label at most that many of its "
            "records (capcctl loop run checks this before it spends)"
        )
        print(
            f"# its admin token, an admin's of {loop['hospital']} alone (its budget, ledger, "
            f"loop and the audit log; the dashboard at {loop['dashboard']}): "
            f"CAPC_TOKEN={loop['admin_token']}"
        )
        print(loop["export"])
        print(loop["command"], flush=True)


# -- the command ----------------------------------------------------------------------
def _check(args: argparse.Namespace) -> None:
    if not 1 <= args.parties <= 64:
        raise SystemExit("capc up: --parties takes 1 to 64")
    if not 1 <= args.teachers_per_hospital <= 1024:
        raise SystemExit("capc up: --teachers-per-hospital takes 1 to 1024")
    if not args.epsilon > 0 or args.queries < 1:
        raise SystemExit("capc up: --epsilon must be positive and --queries at least 1")


def read_task_file(path: Path) -> dict[str, Any]:
    """A task file's configuration; a clear refusal when it cannot be read."""
    try:
        config: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"capc up: cannot read the task {path}: {err}") from None
    return config


def task_for(args: argparse.Namespace, counts: list[int]) -> dict[str, Any]:
    """The task file's configuration, or the planned default for these voters."""
    if args.task is None:
        return planned_task(sum(counts), args.epsilon, args.queries)
    return read_task_file(args.task)


def body_path(args: argparse.Namespace, task: TaskConfig) -> Path | None:
    """The pretrained body the consortium's and a loop's students fit their last layer on:
    ``--body``, else the shipped one; None for a table task, whose students are MLPs
    trained from scratch (as its teachers are)."""
    if not is_table(task):
        if args.body is not None:
            return Path(args.body)
        if task.input_shape != OFFLINE_SHAPE:
            raise SystemExit(
                f"capc up: the shipped body takes {'x'.join(map(str, OFFLINE_SHAPE))} images, "
                f"the task's are {'x'.join(map(str, task.input_shape))}: pretrain a body for "
                "them (capc diet pretrain) and give --body FILE"
            )
        return shipped_body()[0]
    if args.body is not None:
        raise SystemExit(
            f"capc up: --body {args.body} is a pretrained image body, but the task's records "
            f"are table rows of {task.input_shape[0]} features: its students are MLPs trained "
            "from scratch; run it again without --body"
        )
    return None


def consortium(
    args: argparse.Namespace,
) -> tuple[LocalConsortium, list[int], LoopPlan | None, StudentData]:
    """The consortium ``args`` describe, not yet prepared; each hospital's teachers; and
    the CaPC loop to start, if any (its querier bound to its hospital at the guardian);
    and the student's test set and reference batch."""
    own = own_teachers(args.teachers, args.parties)
    counts = teacher_counts(own, args.parties, args.teachers_per_hospital, interface_of(args))
    task = task_for(args, counts)
    plan = loop_plan(args, config_of(task))
    if plan is not None:
        task = loop_quorum(task, args)
    # Read and checked now, so a bad file is refused before minutes of fitting.
    data = student_data(args, config_of(task), own)
    body = body_path(args, config_of(task))
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
        # Set before the guardian starts: it binds the querier at start-up.
        queriers={} if plan is None else {plan.querier: plan.name},
        share_timeout=SHARE_TIMEOUT_S,
        progress=not args.json,
    )
    return c, counts, plan, data


def start_loop(c: LocalConsortium, plan: LoopPlan) -> LoopAccess:
    """The hospital's querier student party and a second gateway over it, with a fresh
    admin token of that gateway's own: the loop reveals the hospital's records to the
    answering hospitals, which only an admin may choose (and the audit names)."""
    student_port = c.start_querier(plan.hospital, plan.own, plan.test, exclude_self=True)
    note(f"{plan.querier} serving jobs ({len(plan.own[1])} own labelled records)")
    port, db = free_port(), str(c.directory / f"{plan.querier}-gateway.db")
    # Its admin token is an admin's of this hospital alone, not of the consortium.
    c.serve_gateway(f"{plan.querier}-gateway", student_port, port, db, hospital=plan.name)
    store = TokenStore(db)
    # The loop reveals its own records to the answerers, which needs the admin role.
    token = store.create("admin", f"{plan.name}-loop", TOKEN_DAYS)[0]
    admin = token
    others = {k: v for k, v in queries_left(c, c.task).items() if k != plan.name}
    return LoopAccess(
        plan.name,
        f"https://127.0.0.1:{port}",
        token,
        c.ca,
        admin,
        min(others.values(), default=0),
    )


def start(c: LocalConsortium, data: StudentData) -> Access:
    """Prepare and start every process; an analyst's and an admin's fresh tokens."""
    c.prepare()
    data.apply(c)
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
    c, counts, plan, data = consortium(args)
    reused = (c.directory / "ledger.db").exists()
    if reused:
        note(
            f"reusing {c.directory} from an earlier run: its keys, teachers and ledgers "
            "(epsilon spent there still counts); a new --dir starts afresh"
        )
    fit = queries_fit(c.task, args.epsilon)
    note(describe(c.task, counts, args.epsilon, fit, task_label(args)))
    # The task was planned for some teacher counts; the ones that register may differ
    # (a hospital bringing one model of its own): re-checked every start.
    checks = recheck(
        c.task["mechanism"],
        int(c.task.get("num_classes") or 2),
        int(c.task.get("quorum", 1)),
        counts,
    )
    for warning in checks:
        note(f"warning: {warning}")
    if fit < args.queries:
        note(f"warning: this task covers only {fit} queries per hospital at eps {args.epsilon:g}")
    try:
        try:
            access = start(c, data)
            loop = None if plan is None else start_loop(c, plan)
        except LedgerRefusedError as err:
            raise SystemExit(
                f"capc up: {err} (the ledger in {c.directory}; use a new --dir)"
            ) from None
        left = queries_left(c, c.task)
        least = min(left.values())
        summary = {
            "task": TASK_NAME,
            "description": describe(c.task, counts, args.epsilon, fit, task_label(args)),
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
            "command": first_command(least, args.queries, loop=loop is not None),
            "dashboard": f"{access.url}/dashboard",
            "guardian": c.address,
            "dir": str(c.directory),
            "reused": reused,
            "seconds": round(time.perf_counter() - began, 1),
            "warnings": checks,
        }
        if loop is not None:
            summary["loop"] = loop.summary()
        print_report(args, c, access, summary)
        note(f"consortium is up after {summary['seconds']:.0f}s; Ctrl-C stops it")
        threading.Event().wait()
    except StopRequestedError as why:
        note(f"{why}: stopping the consortium")
    finally:
        c.stop()
    return 0
