"""``capc diet``: pretrain a shared body on synthetic images, run the central-mode experiment.

Pure: no services, no network. The ``capc`` dispatcher in ``services.commands.cli``
mounts it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from capc.cli_output import stdout_to_stderr
from capc.data.generators import GENERATORS
from capc.learning.diet import (
    DATASETS,
    STATISTICS,
    BodyConfig,
    DietConfig,
    format_table,
    load_result,
    pretrained_body,
    quick,
    run,
    save_body,
)
from capc.learning.pate import ACCOUNTANTS, LABELS_BY, ConfidentParams
from capc.learning.simclr import PRECISIONS, PretrainConfig, PretrainingPausedError
from capc.models import ARCHITECTURES, load_teacher
from capc.models.checkpoint import weights_sha256

#: The experiment's defaults, so the command line and ``DietConfig`` cannot drift apart.
DEFAULTS = DietConfig()


def _names(text: str, known: tuple[str, ...] | list[str], what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"{what}: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(known)}"
        )
    return names


def _numbers(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def _threshold(text: str) -> float | None:
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of votes or none (plain GNMax), got {text!r}"
        ) from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"the threshold must be >= 0 or none, got {text!r}")
    return value


def _body_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--architecture",
        choices=sorted(ARCHITECTURES),
        default=DEFAULTS.body.architecture,
        help="the body's network (default %(default)s)",
    )
    p.add_argument(
        "--width", type=int, default=DEFAULTS.body.width, help="channels of the first stage"
    )
    p.add_argument(
        "--pretrain-steps",
        type=int,
        default=DEFAULTS.body.pretrain.steps,
        help="SimCLR steps on synthetic images (default %(default)s)",
    )
    p.add_argument(
        "--pretrain-batch",
        type=int,
        default=DEFAULTS.body.pretrain.batch,
        help="images per SimCLR step (default %(default)s)",
    )
    p.add_argument(
        "--pretrain-precision",
        choices=PRECISIONS,
        default=DEFAULTS.body.pretrain.precision,
        help="bf16: bfloat16 autocast, 2-2.5x faster on CPUs with bf16 instructions",
    )
    p.add_argument(
        "--pretrain-generators",
        type=lambda s: _names(s, list(GENERATORS), "--pretrain-generators"),
        default=DEFAULTS.body.generators,
        help="comma-separated synthetic image generators to pretrain on",
    )
    p.add_argument(
        "--pool", type=int, default=DEFAULTS.body.pool, help="synthetic images to pretrain on"
    )


def _body_config(args: argparse.Namespace) -> BodyConfig:
    return BodyConfig(
        architecture=args.architecture,
        width=args.width,
        generators=args.pretrain_generators,
        pool=args.pool,
        pretrain=PretrainConfig(
            steps=args.pretrain_steps,
            batch=args.pretrain_batch,
            precision=args.pretrain_precision,
        ),
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``diet pretrain`` and ``diet run``."""
    p = sub.add_parser("diet", help="data-free learning: pretraining and the DIET experiment")
    dsub = p.add_subparsers(dest="diet_command", required=True)

    pre = dsub.add_parser("pretrain", help="pretrain a shared body on synthetic images")
    _body_args(pre)
    pre.add_argument("--classes", type=int, default=10, help="outputs of the (unused) head")
    pre.add_argument("--out", type=Path, required=True, help="checkpoint to write")
    pre.add_argument("--cache", type=Path, default=Path(".capc-cache"), help="pretrained bodies")
    pre.add_argument(
        "--half",
        action="store_true",
        help="store the body in float16 (half the bytes; loading upcasts it)",
    )
    pre.add_argument(
        "--record",
        type=Path,
        default=None,
        help="also write a JSON record of the body: this command, its configuration, the "
        "file's and the weights' SHA-256, and the machine",
    )
    pre.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="minutes; pause there, keeping the state in the cache (the same command resumes; "
        "exit status 3 while unfinished)",
    )
    pre.set_defaults(handler=run_pretrain)

    r = dsub.add_parser("run", help="the central-mode DIET-PATE experiment (no services)")
    r.add_argument(
        "--dataset", choices=DATASETS, default="animal-mnist", help="the private data set"
    )
    r.add_argument(
        "--teachers", type=int, default=DEFAULTS.teachers, help="teachers (default %(default)s)"
    )
    r.add_argument(
        "--split",
        choices=("iid", "skewed"),
        default="iid",
        help="how the private data is split among the teachers",
    )
    _body_args(r)
    r.add_argument(
        "--generators",
        type=lambda s: _names(s, list(GENERATORS), "--generators"),
        default=DEFAULTS.generators,
        help="comma-separated synthetic query generators",
    )
    r.add_argument(
        "--statistics",
        type=lambda s: _names(s, STATISTICS, "--statistics"),
        default=STATISTICS,
        help="comma-separated BatchNorm statistics modes to compare",
    )
    r.add_argument(
        "--epsilons", type=_numbers, default=DEFAULTS.epsilons, help="comma-separated budgets"
    )
    r.add_argument("--delta", type=float, default=DEFAULTS.delta, help="target delta")
    r.add_argument(
        "--seeds", type=int, default=len(DEFAULTS.seeds), help="number of seeds (0, 1, ...)"
    )
    r.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="seeds run from this one on: a configuration chosen on seeds 0..n-1 is "
        "checked on fresh splits, queries and noise with --first-seed n",
    )
    r.add_argument(
        "--queries", type=int, default=DEFAULTS.queries, help="synthetic queries per generator"
    )
    r.add_argument(
        "--batch", type=int, default=DEFAULTS.batch, help="queries per round (statistics batch)"
    )
    r.add_argument(
        "--threshold",
        type=_threshold,
        default=DEFAULTS.mechanism.threshold,
        help="T for 100 teachers (scaled); none: plain GNMax, every query answered",
    )
    r.add_argument(
        "--sigma1", type=float, default=DEFAULTS.mechanism.sigma1, help="for 100 teachers (scaled)"
    )
    r.add_argument(
        "--sigma2", type=float, default=DEFAULTS.mechanism.sigma2, help="for 100 teachers (scaled)"
    )
    r.add_argument(
        "--accountants",
        type=lambda s: _names(s, ACCOUNTANTS, "--accountants"),
        default=DEFAULTS.accountants,
        help="rdp: data-independent RDP filter (the data-dependent epsilon is only a "
        "sanitised side column and never decides where labelling stops); gdp: exact "
        "Gaussian DP (the tightest; the guardian's ledger default); each is a row of its own on "
        "the same labels",
    )
    r.add_argument(
        "--labels-by",
        choices=LABELS_BY,
        default=DEFAULTS.labels_by,
        help="oracle: the mechanism's plaintext oracle; 2pc: the same labels through the "
        "protocol's guardian, party and student in one process, with the real garbled "
        "circuit (slower; a check that central labels are the protocol's)",
    )
    r.add_argument(
        "--student-l2",
        type=float,
        default=DEFAULTS.student_l2,
        help="L2 penalty of the student's head (per unit of mean loss)",
    )
    r.add_argument("--no-baseline", action="store_true", help="skip standard PATE from scratch")
    r.add_argument("--cache", type=Path, default=Path(".capc-cache"), help="pretrained bodies")
    r.add_argument("--out", type=Path, help="write the JSON result here")
    r.add_argument("--quick", action="store_true", help="tiny settings, for a smoke test")
    r.add_argument("--json", action="store_true", help="print the JSON result")
    r.set_defaults(handler=run_experiment)

    show = dsub.add_parser("show", help="print the table of a saved result, goals rechecked")
    show.add_argument("result", type=Path, help="a JSON file written by capc diet run --out")
    show.add_argument("--markdown", action="store_true", help="a markdown table")
    show.set_defaults(handler=show_result)


def run_pretrain(args: argparse.Namespace) -> int:
    """Write a pretrained body as a model checkpoint with a card saying how it was made."""
    config = _body_config(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.time_limit is not None and not args.time_limit > 0:
        print("error: --time-limit must be a positive number of minutes", file=sys.stderr)
        return 2
    deadline = None if args.time_limit is None else time.monotonic() + 60 * args.time_limit
    try:
        model = pretrained_body(
            config, args.cache, args.classes, lambda s: print(s, flush=True), device, deadline
        )
    except PretrainingPausedError as paused:
        print(str(paused), flush=True)
        return 3
    save_body(args.out, model, config, half=args.half)
    digest = weights_sha256(model.features)
    print(f"wrote {args.out} (weights SHA-256 {digest})")
    if args.record is not None:
        stored = load_teacher(args.out)
        record = {
            "command": pretrain_command(args),
            "config": asdict(config),
            "body_config_key": config.key,
            "file_sha256": hashlib.sha256(args.out.read_bytes()).hexdigest(),
            "weights_sha256": digest,
            "stored_weights_sha256": weights_sha256(stored.model.features),
            "stored": "float16" if args.half else "float32",
            "architecture": config.architecture,
            "width": config.width,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "device": device,
            "machine": platform.processor() or platform.machine(),
        }
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.record}")
    return 0


def pretrain_command(args: argparse.Namespace) -> str:
    """The ``capc diet pretrain`` command line that makes this body (every body option
    spelt out; --out, --record, --cache and --time-limit left out, as they change nothing
    in the weights)."""
    parts = [
        "capc diet pretrain",
        f"--architecture {args.architecture}",
        f"--width {args.width}",
        f"--pretrain-steps {args.pretrain_steps}",
        f"--pretrain-batch {args.pretrain_batch}",
        f"--pretrain-precision {args.pretrain_precision}",
        f"--pretrain-generators {','.join(args.pretrain_generators)}",
        f"--pool {args.pool}",
        f"--classes {args.classes}",
    ]
    if args.half:
        parts.append("--half")
    return " ".join(parts)


def run_experiment(args: argparse.Namespace) -> int:
    """Run the experiment, print the table (or JSON) and save the JSON."""
    try:
        config = DietConfig(
            dataset=args.dataset,
            teachers=args.teachers,
            split=args.split,
            body=_body_config(args),
            generators=args.generators,
            statistics=args.statistics,
            epsilons=args.epsilons,
            delta=args.delta,
            seeds=tuple(range(args.first_seed, args.first_seed + args.seeds)),
            queries=args.queries,
            batch=args.batch,
            mechanism=ConfidentParams(args.threshold, args.sigma1, args.sigma2),
            accountants=args.accountants,
            labels_by=args.labels_by,
            student_l2=args.student_l2,
            baseline=not args.no_baseline,
        )
        if args.quick:
            config = quick(config)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else print
    with stdout_to_stderr(args.json):
        result = run(config, args.cache, log)
    text = json.dumps(result, indent=2, default=float)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text if args.json else format_table(result), flush=True)
    return 0


def show_result(args: argparse.Namespace) -> int:
    """Print a saved result's table (text or markdown), its goals recomputed from the table."""
    try:
        result = load_result(args.result)
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {args.result} is not a result of capc diet run: {err}", file=sys.stderr)
        return 2
    print(format_table(result, markdown=args.markdown))
    return 0
