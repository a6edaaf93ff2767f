"""``capc demo``: a whole DIET-CaPC consortium on this machine, end to end, at eps 10.

1. The body: pretrained by ``capc diet pretrain`` on synthetic images only and
   shipped with the project (``services/assets/demo-body.pt``; its command and
   digest are in ``demo-body.json``), or pretrained here with ``--pretrain-steps``.
2. Five hospitals each host 50 teachers: the body with the BatchNorm statistics
   and last layer of one disjoint part of the hospital's share of animal-mnist
   (250 teachers in all). The guardian, the hospitals, the student party and the
   gateway start as separate processes over mutual TLS.
3. An analyst asks the gateway (``capcctl budget``) how many queries every
   hospital's cap of eps 10 (delta 1e-5, exact Gaussian DP) still covers, labels
   that many Gaussian-noise queries with ``capcctl``, trains the student's last
   layer on the answers and asks it for a prediction of one held-out record.
4. The demo prints what happened: the labels' agreement with the teachers'
   noiseless majority, the student's accuracy on 1000 held-out real images, the
   epsilon each hospital spent, and the dashboard's address; with ``--json`` it
   ends with one JSON object.

GNMax at sigma = 16% of the teachers (40 votes for 250) is the mechanism of the
central-mode experiment's best configuration (docs/diet.md); the ledger stops
every hospital at its cap, whatever the votes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from capc.cli_output import stdout_to_stderr
from capc.data.generators import Recipe
from capc.learning.diet import BodyConfig, pretrained_body, save_body
from capc.learning.simclr import PretrainConfig
from capc.mechanisms import from_config
from capc.models.ensemble import Voters
from services import tasks
from services.commands.demo_args import DEMO_CAP as DEMO_CAP
from services.local import LocalConsortium

#: GNMax for 250 teachers; other consortium sizes keep sigma at the same share of the vote.
DEMO_TASK: dict[str, Any] = tasks.load("demo")
DEMO_VOTERS = 250
#: Queries per round: each round's queries are read with their own statistics.
DEMO_BATCH = 512
#: Held-out real images the student is tested on.
DEMO_TEST = 1000
#: The results a finished demo leaves in its directory (what --json prints).
RESULT = "result.json"
ASSETS = Path(__file__).resolve().parents[1] / "assets"
#: The shipped body and its record (the command that made it, its digests).
SHIPPED_BODY = ASSETS / "demo-body.pt"
SHIPPED_RECORD = ASSETS / "demo-body.json"
#: A body pretrained here when asked (--pretrain-steps): small, so it takes minutes.
QUICK_BODY = BodyConfig(width=16, pool=4096, pretrain=PretrainConfig(steps=300))
BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class Steps:
    """Numbered progress lines with the time since the demo started."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.n = 0
        self.start = time.perf_counter()

    def __call__(self, text: str) -> None:
        self.n += 1
        self.note(f"[{self.n}/{self.total}] {text}")

    def note(self, text: str) -> None:
        print(f"{time.perf_counter() - self.start:6.0f}s  {text}", flush=True)


def capcctl(url: str, token: str, ca: Path, *args: str, progress: bool = False) -> str:
    """Run the analyst's client; its progress bar goes to this terminal when ``progress``."""
    env = {**os.environ, "CAPC_URL": url, "CAPC_TOKEN": token, "CAPC_CA": str(ca)}
    cmd = [sys.executable, "-m", "capc_client.cli", *args]
    out = subprocess.run(
        cmd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=None if progress else subprocess.PIPE,
        timeout=1800,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"capcctl {' '.join(args)} failed: {out.stderr or out.stdout}")
    return out.stdout


def shipped_body() -> tuple[Path, dict[str, Any]]:
    """The shipped body and its record, checked against the digest the record names."""
    record: dict[str, Any] = json.loads(SHIPPED_RECORD.read_text())
    digest = hashlib.sha256(SHIPPED_BODY.read_bytes()).hexdigest()
    if digest != record["file_sha256"]:
        raise RuntimeError(
            f"{SHIPPED_BODY} has SHA-256 {digest}, its record {record['file_sha256']}: the "
            "shipped body was changed; restore it from git or pass --body / --pretrain-steps"
        )
    return SHIPPED_BODY, record


def noiseless_majority(c: LocalConsortium, recipe: Recipe, batch: int) -> np.ndarray:
    """Every teacher's plain plurality vote on the job's queries, each round's queries read
    with their own statistics as the hospitals read them."""
    x = recipe.generate()
    voters = [Voters.load(c.model_paths(i)) for i in range(c.parties)]
    preds = np.concatenate(
        [
            np.concatenate(
                [v.predict(x[lo : lo + batch], current_statistics=True) for v in voters], axis=1
            )
            for lo in range(0, len(x), batch)
        ]
    )
    hist = from_config(c.task["mechanism"], int(c.task["num_classes"])).summed_votes(preds)
    return np.asarray(hist.argmax(axis=1), dtype=np.int64)


def screenshot(url: str, path: Path, pin: str) -> bool:
    """Save the dashboard as seen by headless Chromium; False where there is no Chromium.

    The browser knows no private CA, so it trusts the gateway's key by its ``pin``
    (that key alone), never every certificate."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return False
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [
                browser,
                *BROWSER_FLAGS,
                f"--user-data-dir={profile}",
                f"--ignore-certificate-errors-spki-list={pin}",
                "--window-size=1200,900",
                "--virtual-time-budget=5000",
                f"--screenshot={path}",
                url,
            ],
            capture_output=True,
            timeout=120,
            check=False,
        )
    return out.returncode == 0 and path.exists()


def demo_task(teachers: int) -> dict[str, Any]:
    """The demo's task for ``teachers`` teachers in all: sigma the same share of the vote."""
    task = dict(DEMO_TASK)
    mech = from_config(task["mechanism"], int(task["num_classes"]))
    task["mechanism"] = mech.scaled_noise(teachers / DEMO_VOTERS).to_config()
    return task


def _body(args: argparse.Namespace, directory: Path, steps: Steps) -> Path:
    pretrain_steps = args.pretrain_steps
    if pretrain_steps is None and args.body is None and not SHIPPED_BODY.exists():
        # A checkout without the shipped body still runs the demo, on a smaller body.
        pretrain_steps = QUICK_BODY.pretrain.steps
        steps.note(
            f"no shipped body at {SHIPPED_BODY} (`make demo-body` makes it); a small body is "
            "pretrained here instead, so the student will be less accurate"
        )
    if pretrain_steps is not None:
        body_path = directory / "body.pt"
        config = replace(QUICK_BODY, pretrain=replace(QUICK_BODY.pretrain, steps=pretrain_steps))
        if body_path.exists():
            steps(f"pretrained body found at {body_path}")
            return body_path
        steps(
            f"pretraining a ResNet-10 body on {config.pool} synthetic images "
            f"({config.pretrain.steps} SimCLR steps, no real data)"
        )
        model = pretrained_body(config, None, 10, steps.note, "cpu")
        save_body(body_path, model, config)
        return body_path
    if args.body is not None:
        steps(f"pretrained body: {args.body}")
        return Path(args.body)
    path, record = shipped_body()
    steps(
        f"the shipped body, pretrained on synthetic images only ({record['command']}; "
        f"SHA-256 {record['file_sha256'][:12]}...)"
    )
    return path


def _check(args: argparse.Namespace) -> None:
    if not 1 <= args.hospitals <= 64 or not 1 <= args.teachers <= 1024:
        raise SystemExit("capc demo: --hospitals takes 1 to 64, --teachers 1 to 1024")
    if not args.epsilon > 0:
        raise SystemExit("capc demo: --epsilon must be positive")
    if args.queries is not None and args.queries < 1:
        raise SystemExit("capc demo: --queries must be at least 1")


def already_ran(directory: Path) -> str | None:
    """One line saying the demo in ``directory`` already ran, where its results are and how
    to start afresh; None if it has not run there."""
    result = directory / RESULT
    if not result.exists():
        return None
    return (
        f"capc demo: the demo in {directory} already ran (each hospital's budget is spent); "
        f"its results are in {result} and {directory / 'student.pt'}; to start afresh run "
        f"`make demo DIR=NEW_DIR` (capc demo --dir NEW_DIR) or remove {directory}"
    )


def run(args: argparse.Namespace) -> int:
    """The demo; returns 0 once it has reported (and, with --serve, been stopped).

    A directory the demo already ran in is not run again (its hospitals' budgets are
    spent): one line says so. With --json, stdout holds only the JSON object."""
    _check(args)
    directory: Path = args.dir.resolve()
    done = already_ran(directory)
    if done is not None:
        print(done, file=sys.stderr if args.json else sys.stdout, flush=True)
        if args.json:
            print((directory / RESULT).read_text().strip(), flush=True)
        return 0
    with stdout_to_stderr(args.json):
        result = _demo(args, directory)
    (directory / RESULT).write_text(json.dumps(result, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps(result, sort_keys=True), flush=True)
    return 0


def _demo(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """Start the consortium in ``directory``, label, train, report; the results."""
    steps = Steps(6)
    directory.mkdir(parents=True, exist_ok=True)
    body = _body(args, directory, steps)
    total = args.hospitals * args.teachers
    steps(
        f"{args.hospitals} hospitals fit {args.teachers} teachers each on disjoint parts of "
        f"their animal-mnist images ({total} teachers)"
    )
    consortium = LocalConsortium(
        directory / "consortium",
        parties=args.hospitals,
        task=demo_task(total),
        body=body,
        teachers=[args.teachers] * args.hospitals,
        held_out=DEMO_TEST,
        log=steps.note,
        epsilon_cap=args.epsilon,
        progress=not args.json,
    )
    consortium.prepare()
    steps("starting the guardian, the hospitals, the student party and the gateway")
    try:
        consortium.start()
        consortium.start_student()
        consortium.start_gateway()
        serve = will_serve(args, sys.stdin.isatty())
        result = _label_and_train(args, consortium, steps, directory, total, serve)
        if serve:
            print("the consortium stays up; Ctrl-C stops it", flush=True)
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            stop.wait()
    finally:
        consortium.stop()
    return result


def will_serve(args: argparse.Namespace, terminal: bool) -> bool:
    """Whether the consortium stays up after the report: --serve, or a terminal without
    --no-serve or --json."""
    return bool(args.serve or (not args.no_serve and not args.json and terminal))


def dashboard_line(dashboard: str, serving: bool) -> str:
    """The report's dashboard line: its address while the consortium stays up; otherwise
    that it stops with the demo (an address that no longer answers is no help)."""
    if serving:
        return f"dashboard:              {dashboard} (admin token below)"
    return (
        "dashboard:              stops with the demo; run it with --serve (or from a "
        "terminal) to keep the consortium and its dashboard up"
    )


def _label_and_train(
    args: argparse.Namespace,
    consortium: LocalConsortium,
    steps: Steps,
    directory: Path,
    total: int,
    serving: bool = True,
) -> dict[str, Any]:
    url, ca = consortium.gateway_url, consortium.ca
    analyst = consortium.token("analyst", "demo-analyst")
    admin = consortium.token("admin", "demo-data-office")
    steps.note(f"gateway at {url} (OpenAPI at {url}/docs)")

    # The plan comes from the ledger alone (caps and the mechanism's worst case), never
    # from the votes: whole rounds that every hospital's remaining budget covers.
    plan = json.loads(capcctl(url, admin, ca, "budget", "--json"))
    covered = min(int(b["queries_left"]) for b in plan["budgets"])
    queries = (covered // DEMO_BATCH) * DEMO_BATCH
    if args.queries is not None:
        queries = min(queries, args.queries)
    if queries < 1:
        raise SystemExit(
            f"capc demo: the hospitals' caps in {directory} cover {covered} more queries, not a "
            f"round of {DEMO_BATCH} (an earlier demo spent them); to start afresh run "
            f"`make demo DIR=NEW_DIR` (capc demo --dir NEW_DIR), remove {directory}, or raise "
            "--epsilon"
        )
    batch = min(DEMO_BATCH, queries)
    steps(
        f"labelling {queries} {args.generator} queries through the gateway (capcctl): the "
        f"rounds of {batch} that every hospital's cap of eps {args.epsilon:g} covers"
    )
    job = json.loads(
        capcctl(
            url,
            analyst,
            ca,
            "jobs",
            "submit",
            "--generator",
            args.generator,
            "--count",
            str(queries),
            "--batch-size",
            str(batch),
            "--json",
        )
    )
    capcctl(url, analyst, ca, "jobs", "watch", job["id"], progress=not args.json)
    job = json.loads(capcctl(url, analyst, ca, "jobs", "show", job["id"], "--json"))
    if job["state"] != "done":
        raise RuntimeError(f"the labelling job ended {job['state']}: {job.get('error')}")
    results = directory / "labels.npz"
    capcctl(url, analyst, ca, "jobs", "results", job["id"], "-o", str(results))
    with np.load(results) as data:
        labels = np.asarray(data["labels"])
    recipe = Recipe(args.generator, 0, 0, queries, (1, 28, 28))
    answered = labels >= 0
    agree = float(
        (labels[answered] == noiseless_majority(consortium, recipe, batch)[answered]).mean()
    )

    steps("training the student's last layer on the answered queries")
    model = json.loads(capcctl(url, analyst, ca, "models", "train", job["id"], "--wait", "--json"))
    if model["state"] != "done":
        raise RuntimeError(f"student training ended {model['state']}: {model.get('error')}")
    student = directory / "student.pt"
    capcctl(url, analyst, ca, "models", "download", model["id"], "-o", str(student))
    # One held-out record on its own: its prediction does not depend on other records.
    one = directory / "one-record.json"
    one.write_text(json.dumps(consortium.queries[:1].tolist()))
    single = json.loads(
        capcctl(url, analyst, ca, "models", "predict", model["id"], str(one), "--json")
    )
    budgets = json.loads(capcctl(url, admin, ca, "budget", "--json"))

    steps("report")
    metrics = model["metrics"]
    epsilon = {b["party"]: float(b["epsilon_spent"]) for b in budgets["budgets"]}
    dashboard = f"{url}/dashboard"
    shot = directory / "dashboard.png"
    have_shot = screenshot(f"{dashboard}#token={admin}", shot, consortium.gateway_pin())
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else print
    say()
    say(f"hospitals:              {consortium.parties}, {total} teachers in all")
    say(f"queries labelled:       {int(answered.sum())} of {len(labels)} answered")
    say(
        f"label accuracy:         {agree:.3f} (answers that match the teachers' noiseless majority)"
    )
    say(
        f"student test accuracy:  {metrics['test_accuracy']:.3f} on {metrics['test_examples']} "
        f"held-out real images (trained on {metrics['examples']} answers)"
    )
    say(
        f"one record alone:       class {single['labels'][0]} "
        f"(true class {int(consortium.truth[0])}), predicted without any other record"
    )
    say(f"student model:          {directory / 'student.pt'}")
    say(f"epsilon spent (ledger delta {budgets['delta']:g}, {budgets['accounting']}):")
    for b in budgets["budgets"]:
        say(
            f"  {b['party']}: {b['epsilon_spent']:.2f} of cap {b['epsilon_cap']:g}; guarantee "
            f"(eps {b['epsilon_spent']:.2f}, delta {b['full_delta']:.12g} = ledger delta with the "
            f"noise cut-off + {b['rounds_asked']} rounds x 2^-40)"
        )
    say(dashboard_line(dashboard, serving))
    if have_shot:
        say(f"dashboard screenshot:   {shot}")
    say(f"admin token:            {admin}")
    say(f"CA certificate:         {ca} (CAPC_CA for capcctl; the gateway serves HTTPS)")
    return {
        "student_accuracy": float(metrics["test_accuracy"]),
        "epsilon": epsilon,
        "delta": float(budgets["delta"]),
        "hospitals": consortium.parties,
        "teachers": total,
        "queries": len(labels),
        "answered": int(answered.sum()),
    }
