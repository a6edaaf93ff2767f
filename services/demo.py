"""``capc demo``: a whole DIET-CaPC consortium on this machine, end to end.

1. A body is pretrained on synthetic images (no real data; kept for the next run).
2. Three hospitals each fit its last layer on their own disjoint part of
   animal-mnist; the guardian, the hospitals, the student party and the
   gateway start as separate processes over mutual TLS.
3. An analyst labels programmatic queries through the gateway with
   ``capcctl`` (the light client), and trains the student's last layer on
   the answers.
4. The demo prints what happened: the labels' agreement with the hospitals'
   noiseless majority, the student's accuracy on real held-out images, the
   epsilon each hospital spent, and the dashboard's address.

With three hospitals the noise that keeps labels useful is small, so each
hospital spends a large epsilon: a consortium of many hospitals (or the
central-mode experiment, ``capc diet run``) is where the privacy is strong.
"""

from __future__ import annotations

import argparse
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

from capc.data.generators import Recipe
from capc.learning.diet import BodyConfig, pretrained_body, save_body
from capc.learning.simclr import PretrainConfig
from capc.models import load_teacher
from capc.privacy.mechanisms.single_label import vote_histogram
from services import tasks
from services.local import LocalConsortium

#: Three hospitals vote, so the threshold asks for two or three agreeing votes.
DEMO_TASK: dict[str, Any] = tasks.load("demo")
#: Each hospital's cap: three votes need little noise, so every query costs much epsilon.
DEMO_CAP = 20_000.0
DEMO_BODY = BodyConfig(width=16, pretrain=PretrainConfig(steps=300))
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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``capc demo``."""
    p = sub.add_parser("demo", help="run a local DIET-CaPC consortium end to end and report")
    p.add_argument("--dir", type=Path, default=Path("demo"), help="keys, models and databases")
    p.add_argument("--hospitals", type=int, default=3)
    p.add_argument("--queries", type=int, default=1024, help="programmatic queries to label")
    p.add_argument(
        "--generator",
        choices=["gaussian", "spectral", "dead_leaves", "fractal", "mix"],
        default="fractal",
    )
    p.add_argument("--pretrain-steps", type=int, default=DEMO_BODY.pretrain.steps)
    serve = p.add_mutually_exclusive_group()
    serve.add_argument(
        "--serve", action="store_true", help="keep the consortium up afterwards (Ctrl-C stops)"
    )
    serve.add_argument("--no-serve", action="store_true", help="stop as soon as it has reported")
    p.set_defaults(handler=run)


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
        timeout=900,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"capcctl {' '.join(args)} failed: {out.stderr or out.stdout}")
    return out.stdout


def noiseless_majority(c: LocalConsortium, recipe: Recipe, batch: int) -> np.ndarray:
    """The hospitals' plain plurality vote on the job's queries, as each normalised them."""
    x = recipe.generate()
    preds = []
    for i in range(c.parties):
        teacher = load_teacher(c.model_path(i))
        preds.append(
            np.concatenate(
                [
                    teacher.predict(x[lo : lo + batch], current_statistics=True)
                    for lo in range(0, len(x), batch)
                ]
            )
        )
    hist = vote_histogram(np.stack(preds, axis=1), int(c.task["num_classes"]))
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


def run(args: argparse.Namespace) -> int:
    """The demo; returns 0 once it has reported (and, with --serve, been stopped)."""
    steps = Steps(6)
    directory: Path = args.dir.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    body_path = directory / "body.pt"
    config = replace(DEMO_BODY, pretrain=replace(DEMO_BODY.pretrain, steps=args.pretrain_steps))
    if body_path.exists():
        steps(f"pretrained body found at {body_path}")
    else:
        steps(
            f"pretraining a ResNet-10 body on {config.pool} synthetic images "
            f"({config.pretrain.steps} SimCLR steps, no real data)"
        )
        model = pretrained_body(config, None, 10, steps.note, "cpu")
        save_body(body_path, model, config)

    steps(f"{args.hospitals} hospitals fit the last layer on their own part of animal-mnist")
    consortium = LocalConsortium(
        directory / "consortium",
        parties=args.hospitals,
        task=dict(DEMO_TASK),
        body=body_path,
        log=steps.note,
        epsilon_cap=DEMO_CAP,
    )
    consortium.prepare()
    steps("starting the guardian, the hospitals, the student party and the gateway")
    try:
        consortium.start()
        consortium.start_student()
        consortium.start_gateway()
        url, ca = consortium.gateway_url, consortium.ca
        analyst = consortium.token("analyst", "demo-analyst")
        admin = consortium.token("admin", "demo-data-office")
        steps.note(f"gateway at {url} (OpenAPI at {url}/docs)")

        batch = 256
        steps(f"labelling {args.queries} {args.generator} queries through the gateway (capcctl)")
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
                str(args.queries),
                "--batch-size",
                str(batch),
                "--json",
            )
        )
        capcctl(url, analyst, ca, "jobs", "watch", job["id"], progress=True)
        job = json.loads(capcctl(url, analyst, ca, "jobs", "show", job["id"], "--json"))
        if job["state"] != "done":
            raise RuntimeError(f"the labelling job ended {job['state']}: {job.get('error')}")
        results = directory / "labels.npz"
        capcctl(url, analyst, ca, "jobs", "results", job["id"], "-o", str(results))
        with np.load(results) as data:
            labels = np.asarray(data["labels"])
        recipe = Recipe(args.generator, 0, 0, args.queries, (1, 28, 28))
        answered = labels >= 0
        agree = float(
            (labels[answered] == noiseless_majority(consortium, recipe, batch)[answered]).mean()
        )

        steps("training the student's last layer on the answered queries")
        model = json.loads(
            capcctl(url, analyst, ca, "models", "train", job["id"], "--wait", "--json")
        )
        if model["state"] != "done":
            raise RuntimeError(f"student training ended {model['state']}: {model.get('error')}")
        student = directory / "student.pt"
        capcctl(url, analyst, ca, "models", "download", model["id"], "-o", str(student))
        budgets = json.loads(capcctl(url, admin, ca, "budget", "--json"))

        steps("report")
        dashboard = f"{url}/dashboard"
        shot = directory / "dashboard.png"
        have_shot = screenshot(f"{dashboard}#token={admin}", shot, consortium.gateway_pin())
        metrics = model["metrics"]
        print(flush=True)
        print(f"queries labelled:       {int(answered.sum())} of {len(labels)} answered")
        print(
            f"label accuracy:         {agree:.3f} (answers that match the hospitals' noiseless "
            "majority)"
        )
        print(
            f"student test accuracy:  {metrics['test_accuracy']:.3f} on {metrics['test_examples']} "
            f"held-out real images (trained on {metrics['examples']} answers)"
        )
        print(f"student model:          {student}")
        print(f"epsilon spent (delta {budgets['delta']:g}, {budgets['accounting']}):")
        for b in budgets["budgets"]:
            print(f"  {b['party']}: {b['epsilon_spent']:.2f} of cap {b['epsilon_cap']:g}")
        print(f"dashboard:              {dashboard} (admin token below)")
        if have_shot:
            print(f"dashboard screenshot:   {shot}")
        print(f"admin token:            {admin}")
        print(f"CA certificate:         {ca} (CAPC_CA for capcctl; the gateway serves HTTPS)")
        print(
            "note: three hospitals give a three-vote histogram, so the noise that keeps labels "
            "useful is small and each query costs much epsilon; `capc diet run` shows 100 "
            "teachers at eps <= 10.",
            flush=True,
        )
        serve = args.serve or (not args.no_serve and sys.stdin.isatty())
        if serve:
            print("the consortium stays up; Ctrl-C stops it", flush=True)
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            stop.wait()
    finally:
        consortium.stop()
    return 0
