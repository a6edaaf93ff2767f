"""``capc task init``: a task file from a sample of the data (or flags) and the consortium's size.

The records and classes come from a folder of images in class subfolders,
a CSV/Parquet sample with ``--label``, or ``--image CxHxW --classes ...``.
The mechanism is GNMax with the smallest sigma for which ``--queries``
queries fit each hospital's cap, solved by the ledger's own accountant at
its delta (:mod:`capc.privacy.sizing`); a sigma that leaves labels mostly
noise is refused with what to change. The file is checked by
:meth:`TaskConfig.parse` before it is written, and written atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: Exit status of a refused configuration or unreadable sample (argparse's for bad usage).
REFUSED = 2


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from capc.privacy.accountants import ACCOUNTANTS, DEFAULT_ACCOUNTANT

    task = sub.add_parser("task", help="write task files").add_subparsers(
        dest="task_command", required=True
    )
    p = task.add_parser(
        "init",
        help="write a task file (JSON) from a sample of the data or flags",
        description="Propose a task's records, classes and GNMax noise for a consortium. "
        "Images: --data FOLDER (one subfolder of PNG/JPEG files per class) or --image CxHxW "
        "--classes a,b,...; tables: --data FILE.csv|.parquet --label COLUMN.",
    )
    p.add_argument(
        "--data", type=Path, help="a folder of class subfolders, or a CSV/Parquet sample"
    )
    p.add_argument(
        "--image", metavar="CxHxW", help="image shape, e.g. 1x28x28 (overrides --data's)"
    )
    p.add_argument("--classes", help="class names, comma-separated (with --image)")
    p.add_argument(
        "--range",
        default="0,1",
        metavar="LOW,HIGH",
        help="images' value range (default 0,1; a negative one as --range=-1,1)",
    )
    p.add_argument("--label", help="a table's label column: its values are the classes")
    p.add_argument(
        "--drop", action="append", default=[], metavar="COL", help="leave a column out (repeat)"
    )
    p.add_argument("--hospitals", type=int, required=True, help="answering parties")
    p.add_argument(
        "--teachers-per-hospital", type=int, required=True, help="teachers each hospital votes with"
    )
    p.add_argument("--quorum", type=int, help="hospitals a round needs (default: all)")
    p.add_argument("--epsilon", type=float, default=10.0, help="each hospital's cap (default 10)")
    p.add_argument("--delta", type=float, default=1e-5, help="the ledger's delta (default 1e-5)")
    p.add_argument(
        "--accountant",
        choices=list(ACCOUNTANTS),
        default=DEFAULT_ACCOUNTANT,
        help=f"the ledger's accountant (default {DEFAULT_ACCOUNTANT}, the guardian's)",
    )
    p.add_argument(
        "--queries", type=int, default=1024, help="queries each cap must fit (default 1024)"
    )
    p.add_argument("--out", type=Path, help="the task file to write (required without --json)")
    p.add_argument("--json", action="store_true", help="print only the task's JSON on stdout")
    p.set_defaults(handler=run)


def _shape(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(s.isdigit() for s in parts):
        raise ValueError(f"--image must be CxHxW, e.g. 1x28x28, got {text!r}")
    c, h, w = (int(s) for s in parts)
    return c, h, w


def _range(text: str) -> tuple[float, float]:
    parts = text.split(",")
    if len(parts) != 2:
        raise ValueError(f"--range must be LOW,HIGH, got {text!r}")
    return float(parts[0]), float(parts[1])


def _records(args: argparse.Namespace) -> tuple[Any, tuple[str, ...], list[str]]:
    """(schema, classes, notes) from --data or the flags."""
    from capc.data import infer
    from capc.data.schema import ImageSchema

    notes: list[str] = []
    if args.data is not None and not args.data.is_dir():
        if args.label is None:
            raise ValueError("a table sample needs --label COLUMN (the column of the classes)")
        proposal = infer.table(args.data, args.label, args.drop)
        return proposal.records, proposal.classes, proposal.notes
    low_high = _range(args.range)
    classes: tuple[str, ...] | None = None
    schema = None
    if args.data is not None:
        proposal = infer.image_folder(args.data, low_high)
        schema, classes, notes = proposal.records, proposal.classes, proposal.notes
    if args.image is not None:
        schema = ImageSchema(*_shape(args.image), *low_high)
    if args.classes is not None:
        classes = tuple(c.strip() for c in args.classes.split(","))
    if schema is None or classes is None:
        raise ValueError("give --data (a folder or a table sample), or --image and --classes")
    return schema, classes, notes


def build_task(args: argparse.Namespace) -> tuple[dict[str, Any], list[str], list[str]]:
    """(task configuration, notes for the user, the plan's explanation)."""
    from capc.privacy.sizing import plan_gnmax
    from services.common.task import TaskConfig, config_hash

    schema, classes, notes = _records(args)
    quorum = args.hospitals if args.quorum is None else args.quorum
    plan = plan_gnmax(
        classes=len(classes),
        hospitals=args.hospitals,
        teachers_per_hospital=args.teachers_per_hospital,
        quorum=quorum,
        epsilon=args.epsilon,
        delta=args.delta,
        queries=args.queries,
        accountant=args.accountant,
    )
    config: dict[str, Any] = {
        "num_classes": len(classes),
        "input_shape": list(schema.input_shape),
        "mechanism": plan.mechanism(),
        "quorum": quorum,
        "records": schema.to_dict(),
        "classes": list(classes),
    }
    name = args.out.stem if args.out is not None else "task"
    TaskConfig.parse(name, config, config_hash(config))  # what every party will run
    return config, notes, plan.explain()


def _describe(records: dict[str, Any]) -> str:
    if records["kind"] == "image":
        low, high = records["range"]
        c, h, w = records["channels"], records["height"], records["width"]
        return f"images {c}x{h}x{w}, values in [{low:g}, {high:g}]"
    features = records["features"]
    numeric = sum("levels" not in f for f in features)
    return (
        f"table rows of {len(features)} features ({numeric} numeric with public ranges, "
        f"{len(features) - numeric} categorical), label column {records.get('label')!r}"
    )


def run(args: argparse.Namespace) -> int:
    from capc.data.schema import SchemaError
    from services.common.files import write_atomically
    from services.common.task import TaskError

    if args.out is None and not args.json:
        print("error: --out FILE is required (or --json to print the task)", file=sys.stderr)
        return REFUSED
    try:
        config, notes, why = build_task(args)
    except (SchemaError, TaskError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return REFUSED
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    text = json.dumps(config, indent=2) + "\n"
    if args.out is not None:

        def write(tmp: Path) -> None:
            tmp.write_text(text, encoding="utf-8")
            tmp.chmod(0o644)  # a task file is public: every party reads it

        write_atomically(args.out, write)
    if args.json:
        sys.stdout.write(text)
        return 0
    print(f"records: {_describe(config['records'])}")
    print(f"classes ({len(config['classes'])}): {', '.join(config['classes'])}")
    print(f"mechanism: {json.dumps(config['mechanism'])}, quorum {config['quorum']}")
    for line in why:
        print(f"  {line}")
    print(f"wrote {args.out}; register it with `capc guardian --task NAME={args.out}`")
    return 0
