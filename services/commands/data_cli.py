"""``capc data pack``: a hospital's records, in any format ``capc teacher fit`` reads, as
one NPZ that ``capc up --test-data/--reference-data/--own-data`` and ``capcctl loop run
--records`` take.

Every record is checked against the task (:mod:`capc.data.readers`); a bad one is an
error naming its file and row (exit status 2) and no output is left. The NPZ holds
``x`` (N, *input_shape) float32 and, unless ``--unlabelled``, ``y`` (N,) int64 class
indices into the task's classes. Only the standard library is imported here: the
handler imports numpy and pandas when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: Exit status of refused data or options (as capc teacher fit).
REFUSED = 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``capc data pack``."""
    data = sub.add_parser("data", help="pack a hospital's records into an NPZ").add_subparsers(
        dest="data_command", required=True
    )
    p = data.add_parser(
        "pack",
        help="check records against a task and write them as one NPZ (x, y)",
        description="Reads what capc teacher fit reads; every record is checked against the "
        "task, a bad one is named (file, row or field) and nothing is written.",
    )
    p.add_argument("--task", type=Path, required=True, help="the task file (capc task init)")
    p.add_argument(
        "--data",
        type=Path,
        required=True,
        help="a folder of class subfolders of PNG/JPEG images (with --unlabelled: any folder "
        "of images, flat too); a folder of DICOM files (with --labels); a .csv or .parquet "
        "table; or an .npz",
    )
    p.add_argument(
        "--labels",
        type=Path,
        help="DICOM: a CSV with a file column (paths relative to --data) and a label column",
    )
    p.add_argument("--file-column", default="file", help="--labels' file column (default file)")
    p.add_argument("--label-column", default="label", help="--labels' label column (default label)")
    p.add_argument(
        "--label", help="a table's label column (default: the task's records.label, else 'label')"
    )
    p.add_argument(
        "--unlabelled",
        action="store_true",
        help="records only (no y): for capcctl loop run --records or a reference batch",
    )
    p.add_argument("--out", type=Path, required=True, help="the .npz file to write")
    p.add_argument("--json", action="store_true", help="print only a JSON report on stdout")
    p.set_defaults(handler=run)


def load_task(path: Path) -> Any:
    """The task file as a TaskConfig; TaskError if unreadable or not single-label."""
    from capc.task_config import TaskError, read_task

    task = read_task(path)
    if task.multi_label:
        raise TaskError(f"{path}: capc data pack packs single-label records")
    return task


def pack(args: argparse.Namespace) -> dict[str, Any]:
    """Read, check and write atomically; the report (count, shape, classes) as a dict."""
    import numpy as np

    from capc.data.readers import read_records, read_unlabelled
    from services.common.files import write_atomically

    task = load_task(args.task)
    if args.out.suffix.lower() != ".npz":
        raise ValueError(f"--out: {args.out} must end in .npz")
    if not args.out.parent.is_dir():
        raise ValueError(f"--out: no folder {args.out.parent}")
    classes = list(task.class_names)
    arrays: dict[str, Any]
    if args.unlabelled:
        arrays = {"x": read_unlabelled(args.data, task.records, task.input_shape)}
        counts = None
    else:
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
        arrays = {"x": records.x.astype(np.float32), "y": records.y.astype(np.int64)}
        counts = np.bincount(records.y, minlength=len(classes))
    # np.savez appends .npz to a name without it: write to a file object instead.
    write_atomically(args.out, lambda tmp: _savez(tmp, arrays))
    x = arrays["x"]
    return {
        "out": str(args.out),
        "records": len(x),
        "shape": list(x.shape),
        "labelled": counts is not None,
        "classes": None
        if counts is None
        else {name: int(n) for name, n in zip(classes, counts, strict=True)},
    }


def _savez(path: Path, arrays: dict[str, Any]) -> None:
    import numpy as np

    with path.open("wb") as f:
        np.savez(f, allow_pickle=False, **arrays)


def _print(report: dict[str, Any]) -> None:
    shape = "x".join(map(str, report["shape"][1:]))
    print(f"{report['records']} records of {shape} written to {report['out']}")
    if report["classes"] is None:
        print("  unlabelled (x only)")
    else:
        print("  classes: " + ", ".join(f"{k} {v}" for k, v in report["classes"].items()))


def run(args: argparse.Namespace) -> int:
    """``capc data pack``; exit status 2 on a bad record or option."""
    from capc.data.schema import SchemaError
    from capc.task_config import TaskError

    try:
        report = pack(args)
    except (SchemaError, TaskError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return REFUSED
    if args.json:
        print(json.dumps(report))
    else:
        _print(report)
    return 0
