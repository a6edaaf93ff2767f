"""``capc task init``: a task file from a sample of the data (or flags) and the consortium's size.

The records and classes come from a folder of images in class subfolders,
a CSV/Parquet sample with ``--label``, or ``--image CxHxW --classes ...``.
The mechanism is GNMax with the smallest sigma for which ``--queries``
queries fit each hospital's cap, solved by the ledger's own accountant at
its delta (:mod:`capc.planning.sizing`); a sigma that leaves labels mostly
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
#: How far a range taken from one hospital's sample is widened on each side, as a share
#: of its span, unless --widen says otherwise: one hospital's sample rarely spans the
#: values the others hold.
WIDEN = 0.5


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
    p.add_argument(
        "--range-of",
        action="append",
        default=[],
        metavar="COL=LOW,HIGH",
        help="a numeric column's PUBLIC range (a data dictionary's), used as it is instead of "
        "the sample's; repeat per column, e.g. --range-of 'mean radius=0,40'",
    )
    p.add_argument(
        "--widen",
        type=float,
        default=WIDEN,
        metavar="SHARE",
        help="a range taken from the sample is widened by this share of its span on each "
        f"side (default {WIDEN:g}; 0 keeps the sample's), so that the other hospitals' "
        "rows fit it; a non-negative column stays non-negative",
    )
    p.add_argument(
        "--records-per-hospital",
        type=int,
        default=None,
        metavar="N",
        help="labelled records of the smallest hospital (default: a table sample's rows): "
        "the advice then fits its size, e.g. DP-trained teachers where splitting it into "
        "many teachers cannot work",
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


def public_ranges(items: list[str]) -> dict[str, tuple[float, float]]:
    """``--range-of COL=LOW,HIGH`` pairs as {column: (low, high)}; ValueError naming a bad one."""
    out: dict[str, tuple[float, float]] = {}
    for item in items:
        name, sep, bounds = item.rpartition("=")
        try:
            low, high = _range(bounds)
        except ValueError:
            sep = ""
        if not sep or not name.strip() or not low < high:
            raise ValueError(f"--range-of takes COL=LOW,HIGH with LOW < HIGH, got {item!r}")
        out[name.strip()] = (low, high)
    return out


def widened(low: float, high: float, share: float) -> tuple[float, float]:
    """[low, high] widened by ``share`` of its span on each side, rounded outward; a
    range that does not cross 0 is not made to (a non-negative feature stays so)."""
    from capc.data.infer import round_outward

    span = high - low
    lo, hi = low - share * span, high + share * span
    if low >= 0:
        lo = max(lo, 0.0)
    if high <= 0:
        hi = min(hi, 0.0)
    return round_outward(lo, hi)


def shared_table(
    schema: Any, ranges: dict[str, tuple[float, float]], share: float
) -> tuple[Any, list[str]]:
    """A table schema whose numeric ranges the consortium can share: ``ranges`` (public,
    as given) where named, else the sample's widened by ``share``; and what to tell the
    user. ValueError for a named column the sample lacks or that is not numeric."""
    from dataclasses import replace

    from capc.data.schema import NumericFeature

    numeric = {f.name for f in schema.features if isinstance(f, NumericFeature)}
    unknown = sorted(set(ranges) - numeric)
    if unknown:
        raise ValueError(
            f"--range-of names {', '.join(map(repr, unknown))}, not a numeric column of the "
            f"sample (its numeric columns: {', '.join(sorted(numeric))})"
        )
    features = []
    from_sample = []
    for f in schema.features:
        if isinstance(f, NumericFeature):
            if f.name in ranges:
                f = NumericFeature(f.name, *ranges[f.name])
            else:
                from_sample.append(f.name)
                if share > 0:
                    f = NumericFeature(f.name, *widened(f.low, f.high, share))
        features.append(f)
    notes = []
    if from_sample:
        how = (
            f"widened by {share:g} of its span on each side"
            if share > 0
            else "not widened (--widen 0)"
        )
        notes.append(
            f"{len(from_sample)} numeric range(s) come from this one sample, {how}: another "
            "hospital's rows outside them are refused when it packs or fits its data. "
            "Before sharing the task file, replace them by PUBLIC ranges the consortium "
            "agrees on (--range-of 'COL=LOW,HIGH', e.g. from a data dictionary): "
            + ", ".join(from_sample[:5])
            + (" ..." if len(from_sample) > 5 else "")
        )
    return replace(schema, features=tuple(features)), notes


def _records(args: argparse.Namespace) -> tuple[Any, tuple[str, ...], list[str]]:
    """(schema, classes, notes) from --data or the flags."""
    from capc.data import infer
    from capc.data.schema import ImageSchema

    notes: list[str] = []
    if args.data is not None and not args.data.is_dir():
        if args.label is None:
            raise ValueError("a table sample needs --label COLUMN (the column of the classes)")
        if not args.widen >= 0:
            raise ValueError(f"--widen takes a share >= 0, got {args.widen:g}")
        proposal = infer.table(args.data, args.label, args.drop)
        schema, shared = shared_table(proposal.records, public_ranges(args.range_of), args.widen)
        # infer's note that the ranges are the sample's gives way to what was done.
        kept = [n for n in proposal.notes if "ranges in the task file are the sample's" not in n]
        return schema, proposal.classes, [*kept, *shared]
    if args.range_of:
        raise ValueError("--range-of applies to a table sample (--data FILE.csv --label COL)")
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
    from capc.planning.sizing import plan_gnmax
    from capc.task_config import TaskConfig, config_hash

    schema, classes, notes = _records(args)
    quorum = args.hospitals if args.quorum is None else args.quorum
    records = args.records_per_hospital
    if records is None and args.data is not None and not args.data.is_dir():
        from capc.data.readers import read_frame

        # The sample is one hospital's records: its size is the best guess at theirs.
        records = len(read_frame(args.data))
    plan = plan_gnmax(
        classes=len(classes),
        hospitals=args.hospitals,
        teachers_per_hospital=args.teachers_per_hospital,
        quorum=quorum,
        epsilon=args.epsilon,
        delta=args.delta,
        queries=args.queries,
        accountant=args.accountant,
        records_per_hospital=records,
    )
    notes += plan.size_notes()
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
    from capc.task_config import TaskError
    from services.common.files import write_atomically

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
