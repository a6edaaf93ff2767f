"""``capc labeldp alibi|rr|pate-fm``: one label-DP training run with its canary audit.

Pure: no services, no network. Prints a short summary, or with ``--json``
the run's row (accuracy, provable epsilon, empirical epsilon of the canary
attack with its Clopper-Pearson interval, whether the audit refutes the claim).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from capc.cli_output import stdout_to_stderr
from capc.labeldp import pipeline
from capc.labeldp.pipeline import DataConfig, PateFmSettings, PublicBodyConfig
from capc.learning.fixmatch import FixMatchConfig
from capc.privacy import accountants
from capc.privacy.randomness import SecureRandom


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dataset", choices=pipeline.DATASETS, default="digits", help="the labelled data set"
    )
    p.add_argument("--subset", type=positive_int, help="use at most this many records")
    p.add_argument("--epsilon", type=positive_float, required=True, help="label-DP epsilon (nats)")
    p.add_argument(
        "--canaries", type=int, default=100, help="training records given a random wrong label"
    )
    p.add_argument("--seed", type=int, default=0, help="data split, canaries, initialisation")
    p.add_argument(
        "--body-steps",
        type=positive_int,
        default=PublicBodyConfig().steps,
        help="SimCLR steps of the public body",
    )
    p.add_argument(
        "--width", type=positive_int, default=PublicBodyConfig().width, help="small-cnn width"
    )
    p.add_argument("--cache", type=Path, default=Path(".capc-cache"), help="public bodies")
    p.add_argument(
        "--noise-seed",
        help="replay the privacy noise from this seed (experiments only: never for real data)",
    )
    p.add_argument("--out", type=Path, help="also write the JSON row here")
    p.add_argument("--json", action="store_true", help="print the row as JSON")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``labeldp alibi``, ``labeldp rr`` and ``labeldp pate-fm``."""
    p = sub.add_parser("labeldp", help="label-DP training (ALIBI, randomized response, PATE-FM)")
    lsub = p.add_subparsers(dest="labeldp_command", required=True)
    a = lsub.add_parser(
        "alibi",
        help="exact discrete Laplace noise on one-hot labels on a grid, Bayesian soft labels",
    )
    _common(a)
    a.add_argument("--epochs", type=positive_int, help="training epochs (default per dataset)")
    a.set_defaults(handler=run_cli, method="alibi")
    r = lsub.add_parser("rr", help="randomized response on labels (baseline)")
    _common(r)
    r.add_argument("--epochs", type=positive_int, help="training epochs (default per dataset)")
    r.set_defaults(handler=run_cli, method="rr")
    f = lsub.add_parser("pate-fm", help="PATE with FixMatch teachers and student")
    _common(f)
    d = PateFmSettings()
    f.add_argument(
        "--teachers", type=positive_int, default=d.teachers, help="teachers (default %(default)s)"
    )
    f.add_argument(
        "--sigma",
        type=positive_float,
        default=d.sigma,
        help="answer noise, fraction of the teachers",
    )
    f.add_argument(
        "--sigma1",
        type=float,
        default=d.sigma1,
        help="threshold-test noise, fraction of the teachers (0: plain GNMax, no test)",
    )
    f.add_argument("--threshold", type=float, default=d.threshold, help="fraction of the teachers")
    f.add_argument(
        "--queries", type=positive_int, help="at most this many (default: what the budget admits)"
    )
    f.add_argument(
        "--min-queries",
        type=positive_int,
        default=d.min_queries,
        help="raise every noise until this many queries fit the budget",
    )
    f.add_argument(
        "--selection",
        choices=("prototypes", "random"),
        default=d.selection,
        help="how the student picks the records it asks about",
    )
    f.add_argument("--delta", type=positive_float, default=d.delta, help="target delta")
    f.add_argument(
        "--accountant",
        choices=tuple(accountants.ACCOUNTANTS),
        default=d.accountant,
        help="privacy accountant (default %(default)s)",
    )
    f.add_argument(
        "--teacher-steps",
        type=positive_int,
        default=d.teacher.steps,
        help="FixMatch steps per teacher",
    )
    f.add_argument(
        "--student-steps",
        type=positive_int,
        default=d.student.steps,
        help="FixMatch steps of the student",
    )
    f.set_defaults(handler=run_cli, method="pate-fm")


def run_method(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    """Build the run the arguments describe and return its row."""
    data = DataConfig(args.dataset, args.subset, canaries=args.canaries, seed=args.seed)
    split = pipeline.load(data)
    body = pipeline.public_body(
        split,
        PublicBodyConfig(width=args.width, steps=args.body_steps, seed=args.seed),
        args.cache,
        log,
    )
    rng = SecureRandom() if args.noise_seed is None else SecureRandom.from_seed(args.noise_seed)
    if args.method == "pate-fm":
        if not args.sigma1 >= 0 or not args.threshold >= 0:
            raise ValueError("sigma1 and threshold are fractions >= 0")
        d = PateFmSettings()
        settings = PateFmSettings(
            teachers=args.teachers,
            sigma=args.sigma,
            sigma1=args.sigma1,
            threshold=args.threshold,
            queries=args.queries,
            min_queries=args.min_queries,
            selection=args.selection,
            delta=args.delta,
            accountant=args.accountant,
            teacher=FixMatchConfig(
                **{**d.teacher.__dict__, "steps": args.teacher_steps, "seed": args.seed}
            ),
            student=FixMatchConfig(
                **{**d.student.__dict__, "steps": args.student_steps, "seed": args.seed}
            ),
        )
        features = pipeline.pool_features(split, body, args.seed)
        row = pipeline.run_pate_fm(split, features, args.epsilon, settings, rng, args.seed)
    else:
        config = pipeline.default_train_config(args.dataset, args.seed)
        if args.epochs is not None:
            config = type(config)(**{**config.__dict__, "epochs": args.epochs})
        run = pipeline.run_alibi if args.method == "alibi" else pipeline.run_rr
        row = run(split, body, args.epsilon, config, rng)
    return {"dataset": args.dataset, "seed": args.seed, **row}


def run_cli(args: argparse.Namespace) -> int:
    """Run one method and print its row."""
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 4)))
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else print
    try:
        with stdout_to_stderr(args.json):
            row = run_method(args, log)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = json.dumps(row, indent=2, default=float)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    if args.json:
        print(text, flush=True)
    else:
        a = row["audit"]
        print(
            f"{row['method']} on {row['dataset']}: test accuracy {row['accuracy']:.3f}, "
            f"provable epsilon {row['epsilon']:.3f} (delta {row['delta']:g}); "
            f"canary attack {a['correct']}/{a['guesses']} right of {a['canaries']}, "
            f"empirical epsilon >= {a['lower']:.3f} (95% CI {a['lower']:.2f}-"
            f"{a['upper'] if a['upper'] is not None else float('inf'):.2f})"
            + ("  REFUTES THE CLAIM" if row["flagged"] else "")
        )
    return 0
