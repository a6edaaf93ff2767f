"""The order in which ``make test`` deals test files to its workers: longest first.

``make test`` runs ``pytest -n 3 --dist loadfile --no-loadscope-reorder``: xdist hands
whole files to three workers in collection order. Its own order (most tests first) left
the end-to-end files, which hold few tests and take the longest, for last, and one
worker then waited alone on them. Dealt longest first, the workers finish together.

``FILE_SECONDS`` holds what each file took in a full run; ``make durations`` measures
it again (``python -m tests.file_seconds REPORT.xml`` reads a JUnit report). A stale
number only changes the order, never a result.

Usage::

    python -m tests.file_seconds .durations.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeVar

ROOT = Path(__file__).resolve().parent.parent
#: Seconds each test file took, by its path from the repository root.
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
#: What a file missing from FILE_SECONDS is taken to cost: a new file is usually small.
UNKNOWN_FILE_S = 5.0


class HasNodeId(Protocol):
    @property
    def nodeid(self) -> str: ...


Item = TypeVar("Item", bound=HasNodeId)


def measured() -> dict[str, float]:
    """Seconds per test file, as last measured; empty where nothing was."""
    if not FILE_SECONDS.exists():
        return {}
    return {str(k): float(v) for k, v in json.loads(FILE_SECONDS.read_text()).items()}


def longest_first(items: Sequence[Item], seconds: dict[str, float]) -> list[Item]:
    """``items`` with the files that take longest first. The sort is stable: a file's
    tests keep their order and stay together, as ``--dist loadfile`` needs."""
    return sorted(items, key=lambda item: -seconds.get(file_of(item.nodeid), UNKNOWN_FILE_S))


def file_of(nodeid: str) -> str:
    """The file of a pytest node id (``tests/unit/test_x.py::test_y[1]``)."""
    return nodeid.split("::", 1)[0]


def from_junit(report: Path, root: Path = ROOT) -> dict[str, float]:
    """Seconds per test file in a JUnit report pytest wrote (each case's time holds its
    set-up and tear-down, so a module's fixtures count towards its file)."""
    totals: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        path = _path_of(case.get("classname", ""), root)
        if path is None:
            raise ValueError(f"{report}: no test file for the case class {case.get('classname')!r}")
        totals[path] = totals.get(path, 0.0) + float(case.get("time", "0"))
    return {k: round(v, 1) for k, v in sorted(totals.items())}


def _path_of(classname: str, root: Path) -> str | None:
    """``tests.e2e.test_x`` or ``tests.e2e.test_x.TestY`` -> ``tests/e2e/test_x.py``."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = Path(*parts[:end]).with_suffix(".py")
        if (root / path).is_file():
            return path.as_posix()
    return None


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.file_seconds REPORT.xml", file=sys.stderr)
        return 2
    seconds = from_junit(Path(argv[0]))
    FILE_SECONDS.write_text(json.dumps(seconds, indent=1) + "\n")
    print(f"{FILE_SECONDS.relative_to(ROOT)}: {len(seconds)} files, {sum(seconds.values()):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
