"""capc's methods in the side-by-side grid, through the networked services.

One consortium of separate processes over mutual TLS per (dataset, n, seed): the
guardian, every hospital with teachers fitted on its first ``n`` labelled records,
the student party and the gateway (and, where hospital 0 has unlabelled records,
its querier party with its own gateway). Three methods run in it, each through the REST API:

* ``capc-diet-student``: the student party with no data of its own labels
  programmatically generated queries (DIET-CaPC; table rows drawn from the task's
  public ranges) and trains on them;
* ``capc-pate-public``: the same student party labels the public records (real,
  in-distribution, unlabelled) and trains on them (CaPC with public data);
* ``capc-loop``: hospital 0 labels its own unlabelled records (its share past its
  first ``n``) through the others' teachers and retrains its own model on its ``n``
  records plus the labels (``accuracy_before`` is that model on its records alone):
  for images the pretrained body's last layer, for tables an MLP from scratch for
  ``CapcConfig.table_loop_epochs`` epochs (the student service without a body).

Budgets. Every round is the same GNMax mechanism, so a method's labels cost what
their count costs: the labels a row reports at eps ``e`` are the first
``queries_fit(task, e)`` of that method, by the guardian's own accountant at
delta 1e-5 (``services.commands.up.queries_fit``). That is what a consortium running that
method alone under a cap of ``e`` would release. The three methods share one
consortium to save its start-up (each hospital's cap covers all three; the
guardian's totals are saved beside the rows), so they are three independent
releases, each priced on its own.

Bytes. A zero-delay counting relay stands in front of the guardian
(:mod:`experiments.side_by_side.wire`), so a row's ``bytes_sent`` is every byte to
and from the guardian during the labelling jobs that bought its queries (each
job's own in ``job_bytes``); the consortium's start-up (connections, handshakes)
is ``consortium_setup_bytes``, and the loop querier's ``querier_setup_bytes``,
in no method's bytes. A student party opens its session with the guardian (its
connection and base OTs) in its first job, so the DIET student's and the loop's
first job carry it. Rows made before the relay get fitted bytes
(:mod:`experiments.side_by_side.capc_bytes`).

The grid's hyperparameters follow the shipped tasks: teachers per hospital
by :func:`teachers_per_hospital`, and GNMax's sigma the same share of the vote as
the shipped task's (the demo's 40 for 250 teachers; breast-cancer's 23 for 24), as
``services.commands.demo.demo_task`` scales it. (``capc up``'s planner also raises sigma
until 1,000 queries fit eps 10; with few teachers that drowns every vote, so it is
not used here.) That is the grid's rule; ``capc_tuning`` tunes capc on the tuning
records as the baselines are tuned, and :mod:`.tuned` reruns the cells where it
picked another configuration (``CapcConfig.teachers`` and ``mechanism``, only the
methods that picked it, :class:`Cell`'s ``methods``).
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from capc_client import Client
from numpy.typing import NDArray

from capc.data.offline import partition
from capc.learning.teachers import fit_head_ensemble, fit_scratch_teachers
from capc.mechanisms import from_config
from capc.models import load_teacher
from capc.models.checkpoint import Teacher
from capc.models.ensemble import TeacherEnsemble, save_checkpoints, save_ensemble
from experiments.side_by_side.data import Split, task
from experiments.side_by_side.wire import MEASURED, SETUP, count_guardian, settled
from services.commands.demo import SHIPPED_BODY, demo_task
from services.commands.up import queries_fit
from services.common.limits import MAX_OWN_WEIGHT
from services.local import LocalConsortium, free_port
from services.testbed.proxy import LinkProxy

DELTA = 1e-5
QUERIER, HOSPITAL = "hospital-0-querier", "hospital-0"
Log = Callable[[str], None]


@dataclass(frozen=True)
class CapcConfig:
    """The budgets a row is priced at and how students are trained."""

    epsilons: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0)
    batch: int = 256
    #: Epochs of every student and of the loop's models (the services' default).
    epochs: int = 10
    #: Table students: few epochs learn the noisy labels' trend (experiments/tabular.py).
    table_epochs: int = 5
    table_teacher_epochs: int = 100
    #: Tables: the loop's model (hospital 0's MLP on its own rows and the bought labels)
    #: is trained as its teachers are, for as many epochs.
    table_loop_epochs: int = 100
    #: Seconds the guardian waits for a hospital's shares on 2 loaded cores.
    share_timeout: float = 300.0
    #: Teachers per hospital; ``None``: :func:`teachers_per_hospital` (the grid's rule).
    teachers: int | None = None
    #: The task's mechanism (a :mod:`capc.mechanisms` config, e.g. a tuned one from
    #: ``experiments.side_by_side.capc_tuning``); ``None``: :func:`scaled_task`'s. A
    #: distributed round takes offset-robust mechanisms only (gnmax,
    #: robust-confident-gnmax). Every row is priced by its worst case
    #: (:func:`counts`), every query answered, which for a confident mechanism buys
    #: fewer queries than a filter on what was actually answered would.
    mechanism: dict[str, Any] | None = None
    #: The loop's retrained model takes hospital 0's own records this many times beside
    #: the bought labels (the student service's ``own_weight``; 1: once, the grid's).
    own_weight: int = 1

    def __post_init__(self) -> None:
        if self.teachers is not None and self.teachers < 1:
            raise ValueError(f"teachers per hospital must be >= 1, got {self.teachers}")
        if not 1 <= self.own_weight <= MAX_OWN_WEIGHT:
            raise ValueError(f"own_weight must lie in [1, {MAX_OWN_WEIGHT}], got {self.own_weight}")


def teachers_per_hospital(dataset: str, n: int) -> int:
    """Teachers each hospital votes with when it holds ``n`` labelled records: about ten
    records a teacher for images (at most the demo's 50), a dozen rows for tables (at
    most the adoption experiment's 8)."""
    if dataset == "breast-cancer":
        return max(2, min(8, n // 12))
    return max(5, min(50, n // 10))


#: Teachers the shipped breast-cancer task's sigma is set for (3 hospitals x 8).
TABLE_VOTERS = 24


def scaled_task(dataset: str, voters: int) -> dict[str, Any]:
    """The shipped task with sigma the same share of ``voters`` as it has of its own."""
    if dataset != "breast-cancer":
        return demo_task(voters)
    out = dict(task(dataset) or {})
    mech = from_config(out["mechanism"], int(out["num_classes"]))
    out["mechanism"] = mech.scaled_noise(voters / TABLE_VOTERS).to_config()
    return out


def counts(task_dict: dict[str, Any], epsilons: Sequence[float], most: int) -> list[int]:
    """For each eps, how many of a method's queries its cap buys (at most ``most``)."""
    return [min(most, queries_fit(task_dict, e)) for e in epsilons]


# -- teachers ---------------------------------------------------------------------------
def _parts(idx: NDArray[np.int64], m: int, seed: int, i: int) -> list[NDArray[np.int64]]:
    """Disjoint parts of a hospital's labelled records, one a teacher."""
    return [idx[p] for p in partition(len(idx), m, seed=100 + 1000 * seed + i)]


def image_ensemble(split: Split, n: int, m: int, i: int, base: Teacher) -> TeacherEnsemble:
    """Hospital ``i``'s ``m`` DIET teachers: heads on ``base``'s body (held, not copied)
    fitted on disjoint parts of its ``n`` labelled records (what its party votes with)."""
    parts = _parts(split.labelled(i, n), m, split.seed, i)
    return fit_head_ensemble(
        base.model,
        split.x,
        split.y,
        parts,
        architecture=base.architecture,
        width=base.width,
        l2=1e-2,
    )


def fit_image_teachers(split: Split, n: int, m: int, directory: Path) -> dict[int, Path]:
    """Each hospital's ``m`` DIET teachers (heads on the shipped body) on its ``n``
    labelled records; {hospital index: ensemble file}."""
    base = load_teacher(SHIPPED_BODY)
    out: dict[int, Path] = {}
    for i in range(split.hospitals):
        idx = split.labelled(i, n)
        ensemble = image_ensemble(split, n, m, i, base)
        ensemble.card = {
            "data": f"{split.dataset}, hospital {i}'s first {len(idx)} records",
            "method": f"pretrained body; {m} teachers' own statistics and last layers",
            "teachers": m,
        }
        out[i] = directory / f"own-hospital-{i}.pt"
        save_ensemble(out[i], ensemble)
    return out


def table_teachers(split: Split, n: int, m: int, i: int, epochs: int) -> list[Teacher]:
    """Hospital ``i``'s ``m`` MLP teachers trained from scratch for ``epochs`` epochs on
    disjoint parts of its ``n`` labelled rows (what its party votes with)."""
    return fit_scratch_teachers(
        split.x,
        split.y,
        _parts(split.labelled(i, n), m, split.seed, i),
        architecture="mlp",
        outputs=split.classes,
        epochs=epochs,
        seed=1000 * split.seed + 10 * i,
        card={"data": f"{split.dataset}, hospital {i}"},
    )


def fit_table_teachers(
    split: Split, n: int, m: int, epochs: int, directory: Path
) -> dict[int, Path]:
    """Each hospital's :func:`table_teachers`; {hospital index: checkpoints file}."""
    out: dict[int, Path] = {}
    for i in range(split.hospitals):
        out[i] = directory / f"own-hospital-{i}.pt"
        save_checkpoints(out[i], table_teachers(split, n, m, i, epochs))
    return out


# -- one consortium ----------------------------------------------------------------------
def _train(
    client: Client,
    jobs: list[str],
    architecture: str | None,
    epochs: int,
    seed: int,
    own_weight: int = 1,
) -> float:
    weight = None if own_weight == 1 else own_weight  # the request a grid row made
    model = client.train(jobs, architecture, epochs=epochs, seed=seed, own_weight=weight)
    model = client.wait_model(model.id, timeout=3600)
    if model.state != "done":
        raise RuntimeError(f"training on jobs {jobs} failed: {model.error}")
    return float(model.metrics["test_accuracy"])


@dataclass(frozen=True)
class Labelled:
    """One labelling job's outcome: its id, the labels it bought and its bytes to and
    from the guardian."""

    job: str
    answered: int
    bytes_sent: int


def label(client: Client, submit: Callable[[], Any], what: str, relay: LinkProxy) -> Labelled:
    """Submit a labelling job and wait for it to end, counting the bytes through
    ``relay`` meanwhile (from quiet before to quiet after)."""
    before = settled(relay)
    job = client.wait(submit().id, timeout=7200)
    if job.state != "done":
        raise RuntimeError(f"{what}: the job failed: {job.error}")
    return Labelled(job.id, int(job.answered), settled(relay) - before)


def submit_diet(client: Client, cell: Cell, start: int, count: int) -> Any:
    """The DIET student's job: ``count`` generated queries from index ``start``."""
    generator = "gaussian" if cell.images else "beta"
    params = {} if cell.images else {"a": 1.0, "b": 3.0}
    return client.submit_recipe(
        generator,
        count,
        params=params,
        seed=cell.split.seed,
        start=start,
        batch_size=cell.config.batch,
    )


def submit_records(
    client: Client, cell: Cell, x: NDArray[np.float32], name: str, own: bool = False
) -> Any:
    """A job on records ``x`` (N, ...): public ones, or (``own``) the querying
    hospital's own, which go to the answering hospitals in the clear."""
    part = _npz(cell.work / name, x)
    return client.submit_file(part, batch_size=cell.config.batch, reveal_records_to_answerers=own)


def _npz(path: Path, x: NDArray[np.float32]) -> Path:
    np.savez(path, x=x)
    return path


#: capc's methods, in the order a cell runs them.
METHODS = ("capc-diet-student", "capc-pate-public", "capc-loop")


@dataclass
class Cell:
    """One (dataset, n, seed) consortium's inputs.

    ``methods``: which methods run and at which eps each ({method: eps}); ``None``:
    every method at ``config.epsilons`` (the grid). A tuned configuration runs only
    the methods that chose it, each priced only up to the eps it was chosen for."""

    split: Split
    n: int
    config: CapcConfig
    work: Path
    log: Log
    methods: dict[str, tuple[float, ...]] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.methods or {}) - set(METHODS)
        if unknown:
            raise ValueError(f"unknown capc methods {sorted(unknown)}; known: {METHODS}")

    @property
    def images(self) -> bool:
        return self.split.dataset != "breast-cancer"

    def epsilons(self, method: str) -> tuple[float, ...]:
        """The eps ``method`` is priced at in this cell (none: it does not run)."""
        if self.methods is None:
            return self.config.epsilons
        return tuple(sorted(self.methods.get(method, ())))

    def row(self, method: str, epsilon: float, **fields: Any) -> dict[str, Any]:
        return {
            "dataset": self.split.dataset,
            "method": method,
            "n": self.split.size(self.n),
            "epsilon": epsilon,
            "delta": DELTA,
            "seed": self.split.seed,
            "bytes_sent": None,
            "accountant": "the guardian's ledger accountant (services.commands.up.queries_fit)",
            **fields,
        }


def consortium(
    cell: Cell, epsilon_cap: float | None = None
) -> tuple[LocalConsortium, dict[str, Any], int]:
    """The cell's consortium (prepared, not started), its task and teachers per hospital.

    ``epsilon_cap``: each hospital's cap (default: 4x the largest eps, the grid's)."""
    split, n = cell.split, cell.split.size(cell.n)
    m = cell.config.teachers or teachers_per_hospital(split.dataset, n)
    directory = cell.work / "consortium"
    shutil.rmtree(directory, ignore_errors=True)  # a fresh ledger and PKI
    directory.mkdir(parents=True)
    voters = split.hospitals * m
    task_dict = scaled_task(split.dataset, voters)
    if cell.config.mechanism is not None:
        task_dict = {**task_dict, "mechanism": dict(cell.config.mechanism)}
    if cell.images:
        own = fit_image_teachers(split, n, m, directory)
    else:
        own = fit_table_teachers(split, n, m, cell.config.table_teacher_epochs, directory)
    # Each hospital's cap covers the three methods together; each row is priced alone.
    cap = 4.0 * max(cell.config.epsilons) if epsilon_cap is None else epsilon_cap
    c = LocalConsortium(
        directory,
        parties=split.hospitals,
        dataset=split.dataset,
        task=task_dict,
        body=SHIPPED_BODY if cell.images else None,
        teachers=[m] * split.hospitals,
        held_out=len(split.test),
        split_seed=0,
        epsilon_cap=cap,
        own_models=own,
        queriers={QUERIER: HOSPITAL},
        share_timeout=cell.config.share_timeout,
        log=cell.log,
    )
    c.prepare()
    if not np.array_equal(c.queries, split.x[split.test]):
        raise RuntimeError("the consortium's held-out records are not the split's test records")
    return c, task_dict, m


def _hyperparameters(config: CapcConfig, task_dict: dict[str, Any]) -> dict[str, Any]:
    """What a row records of its mechanism: sigma, and the whole mechanism when overridden."""
    out: dict[str, Any] = {"sigma": task_dict["mechanism"]["sigma"]}
    if config.mechanism is not None:
        out["mechanism"] = dict(task_dict["mechanism"])
    return out


def _loop_hyperparameters(config: CapcConfig, task_dict: dict[str, Any]) -> dict[str, Any]:
    """A loop row's: :func:`_hyperparameters`, and its own records' weight where not 1."""
    out = _hyperparameters(config, task_dict)
    if config.own_weight != 1:
        out["own_weight"] = config.own_weight
    return out


def _bytes_fields(costs: list[int]) -> dict[str, Any]:
    """A row's bytes: the sum of the jobs' that bought its queries."""
    return {"bytes_sent": sum(costs), "job_bytes": list(costs), "bytes_measured": MEASURED}


def student_methods(
    cell: Cell, c: LocalConsortium, task_dict: dict[str, Any], relay: LinkProxy
) -> list[dict[str, Any]]:
    """The DIET student and PATE with public data, at every eps, through the gateway."""
    cfg, split = cell.config, cell.split
    analyst = Client(c.gateway_url, c.token("analyst", "side-by-side"), ca=c.ca, timeout=600)
    architecture, epochs = (None, cfg.epochs) if cell.images else ("mlp", cfg.table_epochs)
    rows: list[dict[str, Any]] = []
    for method, most in (("capc-diet-student", 10**9), ("capc-pate-public", len(split.public))):
        epsilons = cell.epsilons(method)
        jobs: list[str] = []
        costs: list[int] = []
        bought, done, start = 0, 0, time.perf_counter()
        for e, k in zip(epsilons, counts(task_dict, epsilons, most), strict=True):
            if k > done:
                lo = done
                submit: Callable[[], Any] = (
                    partial(submit_diet, analyst, cell, lo, k - lo)
                    if method == "capc-diet-student"
                    else partial(
                        submit_records,
                        analyst,
                        cell,
                        split.x[split.public][lo:k],
                        f"public-{lo}.npz",
                    )
                )
                got = label(analyst, submit, f"{method} at eps {e:g}", relay)
                if got.answered:  # the trainer refuses a job with no answered query
                    jobs.append(got.job)
                costs.append(got.bytes_sent)
                bought, done = bought + got.answered, k
            accuracy = _train(analyst, jobs, architecture, epochs, split.seed) if jobs else None
            rows.append(
                cell.row(
                    method,
                    e,
                    accuracy=accuracy,
                    queries=done,
                    labels=bought,
                    seconds=time.perf_counter() - start,
                    hyperparameters=_hyperparameters(cfg, task_dict),
                    **_bytes_fields(costs),
                )
            )
            cell.log(f"{method} n={cell.n} seed={split.seed} eps={e:g}: {done} queries, {accuracy}")
    return rows


def start_loop(cell: Cell, c: LocalConsortium, relay: LinkProxy) -> tuple[Client, int]:
    """Hospital 0's querier party (its model on its ``n`` records) and its own gateway:
    a client of that gateway, and the bytes through ``relay`` while they started."""
    split = cell.split
    own = split.labelled(0, cell.n)
    before = settled(relay)
    port = c.start_querier(
        0, (split.x[own], split.y[own]), (split.x[split.test], split.y[split.test])
    )
    db = str(cell.work / "loop-gateway.db")
    gateway = free_port()
    c.serve_gateway("loop-gateway", port, gateway, db)
    setup = settled(relay) - before
    from services.gateway.tokens import TokenStore

    # The loop reveals the querier's own records to the answerers: the admin role's call.
    token = TokenStore(db).create("admin", "side-by-side", 1.0)[0]
    return Client(f"https://127.0.0.1:{gateway}", token, ca=c.ca, timeout=600), setup


def loop_method(
    cell: Cell, c: LocalConsortium, task_dict: dict[str, Any], relay: LinkProxy
) -> list[dict[str, Any]]:
    """Hospital 0's CaPC loop at every eps: labels for its own unlabelled records from
    the other hospitals, and its model retrained on them, through its own gateway."""
    cfg, split = cell.config, cell.split
    unlabelled = split.x[split.unlabelled(0, cell.n)]
    hospital, setup = start_loop(cell, c, relay)
    start = time.perf_counter()
    architecture, epochs = (None, cfg.epochs) if cell.images else ("mlp", cfg.table_loop_epochs)
    before = _train(hospital, [], architecture, epochs, split.seed)
    rows: list[dict[str, Any]] = []
    jobs: list[str] = []
    costs: list[int] = []
    bought, done = 0, 0
    epsilons = cell.epsilons("capc-loop")
    for e, k in zip(epsilons, counts(task_dict, epsilons, len(unlabelled)), strict=True):
        if k > done:
            got = label(
                hospital,
                partial(
                    submit_records, hospital, cell, unlabelled[done:k], f"own-{done}.npz", own=True
                ),
                f"capc-loop at eps {e:g}",
                relay,
            )
            if got.answered:  # the trainer refuses a job with no answered query
                jobs.append(got.job)
            costs.append(got.bytes_sent)
            bought, done = bought + got.answered, k
        after = (
            _train(hospital, jobs, architecture, epochs, split.seed, cfg.own_weight)
            if jobs
            else before
        )
        rows.append(
            cell.row(
                "capc-loop",
                e,
                accuracy=after,
                accuracy_before=before,
                gain=after - before,
                queries=done,
                labels=bought,
                unlabelled=len(unlabelled),
                seconds=time.perf_counter() - start,
                hyperparameters=_loop_hyperparameters(cfg, task_dict),
                querier_setup_bytes=setup,
                **_bytes_fields(costs),
            )
        )
        cell.log(f"capc-loop n={cell.n} seed={split.seed} eps={e:g}: {before:.3f} -> {after:.3f}")
    return rows


def run_cell(cell: Cell) -> list[dict[str, Any]]:
    """Every capc method's rows for one (dataset, n, seed)."""
    start = time.perf_counter()
    c, task_dict, m = consortium(cell)
    relay = count_guardian(c)
    try:
        c.start()
        c.start_student()
        c.start_gateway()
        setup = settled(relay)
        rows = student_methods(cell, c, task_dict, relay)
        # At n = all a hospital has no unlabelled records to label (a share's odd one
        # left over is not a loop).
        if cell.n < cell.split.size(None) and cell.epsilons("capc-loop"):
            rows += loop_method(cell, c, task_dict, relay)
        admin = Client(c.gateway_url, c.token("admin", "side-by-side"), ca=c.ca, timeout=600)
        totals = {b.party: b.epsilon_spent for b in admin.budgets().budgets}
    finally:
        c.stop()
        relay.stop()
    seconds = time.perf_counter() - start
    for r in rows:
        r["teachers_per_hospital"] = m
        r["consortium_epsilon_spent"] = totals
        r["consortium_seconds"] = seconds
        r["consortium_setup_bytes"] = setup
        r["consortium_setup_measured"] = SETUP
    if not all(math.isfinite(v) for v in totals.values()):
        raise RuntimeError(f"the guardian reports a non-finite spend: {totals}")
    return rows


def run_capc(
    split: Split,
    sizes: Sequence[int | None],
    config: CapcConfig,
    work: Path,
    log: Log,
    methods: dict[str, tuple[float, ...]] | None = None,
) -> list[dict[str, Any]]:
    """Every capc row of ``split`` (one dataset, one seed) for the grid's sizes
    (``methods``: only these, at these eps; :class:`Cell`)."""
    rows: list[dict[str, Any]] = []
    for n in sizes:
        size = split.size(n)
        where = work / f"{split.dataset}-n{size}-s{split.seed}"
        rows += run_cell(Cell(split, size, config, where, log, methods))
    return rows
