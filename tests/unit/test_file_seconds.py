"""The order ``make test`` deals files in: every measured file exists, the JUnit reader
sums a file's cases, and the sort keeps each file's tests together, longest first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.file_seconds import ROOT, UNKNOWN_FILE_S, from_junit, longest_first, measured

MAKEFILE = ROOT / "Makefile"


@dataclass(frozen=True)
class Node:
    nodeid: str


def test_every_measured_file_exists() -> None:
    seconds = measured()
    assert seconds, "tests/file_seconds.json is missing or empty: run `make durations`"
    missing = [path for path in seconds if not (ROOT / path).is_file()]
    assert not missing, f"stale entries in tests/file_seconds.json: {missing}; run `make durations`"


def test_make_test_deals_files_in_collection_order() -> None:
    """Without --no-loadscope-reorder xdist re-sorts the files by their number of tests."""
    text = MAKEFILE.read_text()
    lines = [line for line in text.splitlines() if "pytest" in line and "--dist loadfile" in line]
    assert lines and all("--no-loadscope-reorder" in line for line in lines), lines


def test_longest_first_keeps_files_together() -> None:
    items = [
        Node("tests/unit/a.py::t1"),
        Node("tests/unit/a.py::t2"),
        Node("tests/e2e/b.py::t1"),
        Node("tests/unit/new.py::t1"),
        Node("tests/e2e/c.py::t1"),
        Node("tests/e2e/c.py::t2[x]"),
        Node("tests/e2e/c.py::t3"),
    ]
    seconds = {"tests/unit/a.py": 1.0, "tests/e2e/b.py": 40.0, "tests/e2e/c.py": 300.0}
    order = [node.nodeid for node in longest_first(items, seconds)]
    assert order == [
        "tests/e2e/c.py::t1",
        "tests/e2e/c.py::t2[x]",
        "tests/e2e/c.py::t3",
        "tests/e2e/b.py::t1",
        "tests/unit/new.py::t1",  # unknown: UNKNOWN_FILE_S, above a.py's 1 s
        "tests/unit/a.py::t1",
        "tests/unit/a.py::t2",
    ]
    assert UNKNOWN_FILE_S > 1.0


def test_junit_times_are_summed_per_file(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.unit.test_file_seconds" name="a" time="1.25"/>'
        '<testcase classname="tests.unit.test_file_seconds" name="b" time="0.5"/>'
        '<testcase classname="tests.e2e.test_demo.TestDemo" name="c" time="30"/>'
        "</testsuite></testsuites>"
    )
    assert from_junit(report) == {
        "tests/e2e/test_demo.py": 30.0,
        "tests/unit/test_file_seconds.py": 1.8,
    }


def test_a_case_of_no_file_is_refused(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite><testcase classname="tests.gone" name="a" time="1"/>'
        "</testsuite></testsuites>"
    )
    with pytest.raises(ValueError, match=r"tests\.gone"):
        from_junit(report)
