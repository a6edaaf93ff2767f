"""docs/architecture.md walks one query through at most 20 modules (issue 42), each
of which exists, in the process the table says."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MOST = 20
#: Where each process's code lives: a module listed under a process must be its own
#: or the library's (capc/, which every process shares).
HOMES = {
    "analyst": ("clients/",),
    "gateway": ("services/gateway/",),
    "student": ("services/student/", "capc/"),
    "guardian": ("services/guardian/", "services/common/ledger/", "capc/"),
    "hospital": ("services/answerer/", "services/common/serde/", "capc/"),
    "every hop": ("services/common/serde/",),
    "both": ("capc/",),
}


def walk() -> list[tuple[str, str]]:
    """(process, module) of each row of the walk's table."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("### One query, module by module", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| \d+ \| ([^|]+) \| `([^`]+)` \|", section, flags=re.M)
    return [(process.strip(), module) for process, module in rows]


def test_the_walk_names_at_most_twenty_modules_that_exist_where_it_says() -> None:
    rows = walk()
    modules = [m for _, m in rows]
    assert 10 <= len(rows) <= MOST, rows
    assert len(set(modules)) == len(modules), "a module is named twice"
    for process, module in rows:
        assert (ROOT / module).is_file(), f"{module} does not exist"
        assert process in HOMES, f"unknown process {process!r}"
        assert module.startswith(HOMES[process]), f"{module} is not {process}'s code"
