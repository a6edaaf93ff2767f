"""``capc teacher fit``: a hospital's teachers from its own records, in one checkpoint file.

Reads a folder of images in class subfolders, DICOM files with a labels
CSV, a CSV/Parquet table or an NPZ (:mod:`capc.data.readers`), checks every
record against the task, splits the records into N disjoint teacher parts
and a held-out part, fits the teachers (:mod:`capc.learning.hospital`) and
writes one file that ``capc answerer --model FILE`` loads. A bad record is
an error naming its file and row or field (exit status 2); the output is
written atomically, so a failure leaves no file.

With ``--dp-epsilon`` the teachers are trained by full-batch DP-SGD
(:mod:`capc.learning.dp_teacher`) and the file's card carries the training's
accounting record (``card["dp_training"]``), which the hospital's ledger
charges once when the teacher is registered.

``capc teacher export --onnx``: a capc checkpoint's teachers as ONNX files, the
format for a hospital that does not fully trust the model's author.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: Exit status of refused data or options.
REFUSED = 2
#: The shipped body (services/assets): the default for 1x28x28 image tasks.
SHIPPED_BODY = Path(__file__).resolve().parents[1] / "assets" / "demo-body.pt"
#: capc.learning.dp_teacher's defaults, repeated here so that --help needs no torch import
#: (a unit test keeps them equal).
DP_DEFAULTS: dict[str, float] = {"delta": 1e-5, "steps": 300, "clip": 1.0, "lr": 0.5}


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    teacher = sub.add_parser("teacher", help="fit a hospital's teachers").add_subparsers(
        dest="teacher_command", required=True
    )
    p = teacher.add_parser(
        "fit",
        help="fit N teachers on disjoint parts of this hospital's records",
        description="Images: DIET last layers on a shared pretrained body (one ensemble "
        "checkpoint). Tables: N mlp teachers trained from scratch (one checkpoints file). "
        "Every record is checked against the task; a bad one is named (file, row or field).",
    )
    p.add_argument("--task", type=Path, required=True, help="the task file (capc task init)")
    p.add_argument(
        "--data",
        type=Path,
        required=True,
        help="a folder of class subfolders of PNG/JPEG images; a folder of DICOM files (with "
        "--labels); a .csv or .parquet table; or an .npz with arrays x and y",
    )
    p.add_argument("--teachers", type=int, default=1, help="teachers (disjoint parts; default 1)")
    p.add_argument("--out", type=Path, required=True, help="the checkpoint file to write")
    p.add_argument(
        "--labels",
        type=Path,
        help="DICOM: a CSV with a file column (paths relative to --data) and a label column",
    )
    p.add_argument("--file-column", default="file", help="--labels' file column (default file)")
    p.add_argument("--label-column", default="label", help="--labels' label column (default label)")
    p.add_argument(
        "--label",
        help="a table's label column (default: the task's records.label, else 'label')",
    )
    p.add_argument(
        "--body",
        type=Path,
        help="images: the pretrained body (default: the shipped one, for 1x28x28 tasks)",
    )
    p.add_argument(
        "--held-out", type=float, default=0.2, help="share held out to measure (default 0.2)"
    )
    p.add_argument("--epochs", type=int, default=30, help="tables: training epochs (default 30)")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="split and training seed (default 0); DP-SGD's noise never comes from it",
    )
    dp = p.add_argument_group(
        "DP training",
        "Train the teachers by full-batch DP-SGD: every answer is then post-processing of one "
        "training, which the hospital's ledger charges once, when the teacher is registered. "
        "Images: a linear head on the shared body with its stored (public) statistics; "
        "tables: a linear model on the encoded rows. The defaults (300 steps, lr 0.5, clip 1) "
        "were chosen on the side-by-side experiment's tuning records of animal-mnist, which "
        "no hospital holds; nothing is tuned on your records.",
    )
    dp.add_argument(
        "--dp-epsilon",
        type=float,
        help="train with DP-SGD at this epsilon (nats): the training's whole privacy cost",
    )
    dp.add_argument(
        "--dp-delta", type=float, help=f"the training's delta (default {DP_DEFAULTS['delta']:g})"
    )
    dp.add_argument(
        "--dp-steps", type=int, help=f"full-batch DP-SGD steps (default {DP_DEFAULTS['steps']})"
    )
    dp.add_argument(
        "--dp-clip",
        type=float,
        help=f"per-record gradient clipping norm (default {DP_DEFAULTS['clip']:g})",
    )
    dp.add_argument("--dp-lr", type=float, help=f"learning rate (default {DP_DEFAULTS['lr']:g})")
    p.add_argument("--json", action="store_true", help="print only a JSON report on stdout")
    p.set_defaults(handler=run)
    e = teacher.add_parser(
        "export",
        help="write a capc checkpoint's teachers as ONNX files (for a hospital that does not "
        "fully trust their author)",
        description="ONNX is data, run by onnxruntime; TorchScript and module:factory are "
        "code. Each teacher of the checkpoint (a teacher, an ensemble or a checkpoints file) "
        "becomes one ONNX file mapping (B, *input_shape) float32 to (B, K) scores, with its "
        "stored BatchNorm statistics.",
    )
    e.add_argument("--model", type=Path, required=True, help="the capc checkpoint file")
    e.add_argument(
        "--onnx",
        required=True,
        metavar="OUT",
        help="the ONNX file to write; for several teachers put {i} in it (numbered from 1)",
    )
    e.set_defaults(handler=run_export)


def export_teachers(model: Path, pattern: str) -> list[Path]:
    """Every teacher of the capc checkpoint ``model`` as an ONNX file; the files written.
    ValueError says what is wrong (nothing is written then)."""
    from capc.models.ensemble.files import load_checkpoint
    from capc.models.foreign import sniff
    from capc.models.onnx_export import export_onnx, out_paths, teacher_modules
    from services.common.files import write_atomically

    # Only capc's own checkpoints (weights_only data): exporting traces the module, and a
    # received TorchScript file must not run here either.
    if sniff(model) != "checkpoint":
        raise ValueError(
            f"{model} is not a capc checkpoint: capc teacher export converts capc teacher, "
            "ensemble and checkpoints files (an ONNX file is already ONNX)"
        )
    shape, modules = teacher_modules(load_checkpoint(model))
    paths = out_paths(pattern, len(modules))
    for path in paths:
        if not path.parent.is_dir():
            raise ValueError(f"--onnx: no folder {path.parent}")
    for module, path in zip(modules, paths, strict=True):
        write_atomically(path, lambda tmp, m=module: export_onnx(m, shape, tmp))  # type: ignore[misc]
    return paths


def run_export(args: argparse.Namespace) -> int:
    try:
        paths = export_teachers(args.model, args.onnx)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return REFUSED
    for path in paths:
        print(path)
    return 0


def _load_task(path: Path) -> Any:
    from capc.task_config import TaskError, read_task

    task = read_task(path)
    if task.multi_label or task.encryption is not None:
        raise TaskError(f"{path}: capc teacher fit fits single-label, clear-query tasks")
    return task


def _body(args: argparse.Namespace, shape: tuple[int, ...]) -> Path:
    if args.body is not None:
        return Path(args.body)
    if shape == (1, 28, 28) and SHIPPED_BODY.exists():
        return SHIPPED_BODY
    raise ValueError(
        f"no shipped body takes {'x'.join(map(str, shape))} images: pretrain one "
        "(capc diet pretrain) and pass it with --body FILE"
    )


def dp_settings(args: argparse.Namespace) -> Any:
    """The DP training asked for (a checked :class:`capc.learning.dp_teacher.DpSettings`),
    or None without ``--dp-epsilon``; ValueError says which option is wrong."""
    from capc.learning.dp_teacher import DpSettings

    given = {
        name: getattr(args, f"dp_{name}")
        for name in DP_DEFAULTS
        if getattr(args, f"dp_{name}") is not None
    }
    if args.dp_epsilon is None:
        if given:
            flags = ", ".join(f"--dp-{k}" for k in given)
            raise ValueError(f"{flags} set(s) a DP training: add --dp-epsilon E to train one")
        return None
    settings = DpSettings(args.dp_epsilon, **{**DP_DEFAULTS, **given})
    settings.check()
    return settings


def fit_teachers(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    """Read, check, split, fit and write; the report as a dict."""
    from capc.data.readers import read_records
    from capc.data.schema import TableSchema
    from capc.learning import dp_teacher, hospital
    from capc.models.ensemble import save_checkpoints, save_ensemble
    from capc.privacy.randomness import SecureRandom
    from services.common.files import write_atomically

    task = _load_task(args.task)
    if args.teachers < 1:
        raise ValueError("--teachers must be at least 1")
    dp = dp_settings(args)
    if not args.out.parent.is_dir():
        raise ValueError(f"--out: no folder {args.out.parent}")
    classes = task.class_names
    table = isinstance(task.records, TableSchema) or len(task.input_shape) != 3
    # The body first: a wrong one is refused before minutes of reading.
    body = None if table else _body(args, task.input_shape)
    shared = None if body is None else hospital.body_for(body, task.input_shape, task.outputs)
    records = read_records(
        args.data,
        task.records,
        task.input_shape,
        classes,
        label=args.label,
        labels_csv=args.labels,
        file_column=args.file_column,
        label_column=args.label_column,
    )
    log(f"read {len(records)} records from {records.source}, all checked against {args.task.name}")
    plan = hospital.split(records.y, args.teachers, args.held_out, args.seed)
    card = {
        "data": records.source,
        "records": len(records),
        "task": args.task.name,
        "task_hash": task.config_hash,
    }
    record = None
    name = body.name if body is not None else ""
    if dp is not None:
        # The noise: OS-keyed, never --seed (which fixes only the split and initial weights).
        rng = SecureRandom()
        if shared is None:
            fitted, record = dp_teacher.fit_dp_table(
                records, plan, task.outputs, card, log, dp, rng=rng, seed=args.seed
            )
        else:
            fitted, record = dp_teacher.fit_dp_diet(
                records, plan, shared, name, card, log, dp, rng=rng, seed=args.seed
            )
        kind = "DP-SGD linear heads" if shared else f"DP-SGD {dp_teacher.TABLE_ARCHITECTURE}"
    elif shared is None:
        fitted = hospital.fit_scratch(
            records, plan, task.outputs, card, log, epochs=args.epochs, seed=args.seed
        )
        kind = "scratch mlp"
    else:
        fitted = hospital.fit_diet(records, plan, shared, name, card, log)
        kind = "DIET last layers"
    members = fitted.members
    if isinstance(members, list):
        write_atomically(args.out, lambda tmp: save_checkpoints(tmp, members))
    else:
        write_atomically(args.out, lambda tmp: save_ensemble(tmp, members))
    report: dict[str, Any] = {
        "out": str(args.out),
        "kind": kind,
        "data": records.source,
        "records": len(records),
        "held_out": fitted.held_out,
        "teachers": [
            {"records": n, "accuracy": None if fitted.accuracy is None else fitted.accuracy[t]}
            for t, n in enumerate(fitted.sizes)
        ],
        "majority_vote_accuracy": fitted.majority,
    }
    if record is not None:
        report["dp_training"] = dp_teacher.summary(record)
    return report


def _print(report: dict[str, Any]) -> None:
    print(f"{len(report['teachers'])} teachers ({report['kind']}) written to {report['out']}")
    print(f"held-out records: {report['held_out']} of {report['records']}")
    for t, row in enumerate(report["teachers"]):
        acc = "n/a" if row["accuracy"] is None else f"{row['accuracy']:.1%}"
        print(f"  teacher {t}: {row['records']} records, held-out accuracy {acc}")
    if report["majority_vote_accuracy"] is not None:
        print(f"  majority vote: held-out accuracy {report['majority_vote_accuracy']:.1%}")
    dp = report.get("dp_training")
    if dp is not None:
        print(
            f"DP training: epsilon {dp['epsilon']:.4g} at delta {dp['delta']:g} (mu "
            f"{dp['mu']:.4g}; {dp['steps']} steps, noise multiplier "
            f"{dp['noise_multiplier']:.4g}, clip {dp['clip']:g}), charged once by your "
            "ledger when the teacher is registered; its answers cost nothing more"
        )


def run(args: argparse.Namespace) -> int:
    from capc.data.schema import SchemaError
    from capc.task_config import TaskError

    def log(text: str) -> None:
        if not args.json:
            print(text, file=sys.stderr)

    try:
        report = fit_teachers(args, log)
    except (SchemaError, TaskError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return REFUSED
    if args.json:
        print(json.dumps(report))
    else:
        _print(report)
    return 0
