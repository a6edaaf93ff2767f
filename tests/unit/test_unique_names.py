"""One concept, one home: a public class or function is defined once across capc,
services and the client. Two definitions of one name are either one concept written
twice (move it to one home) or two concepts under one name (rename one); only the
deliberate mirrors below may keep a name twice."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("capc", "services", "clients/capc_client")
#: Names every entry point or router module defines by convention.
CONVENTIONS = frozenset({"run", "main", "add_parser", "build_parser"})
#: The client shares nothing with the server: its records mirror the gateway's replies
#: by name on purpose (tests/unit/test_client_drift.py checks that they agree).
CLIENT_MIRRORS = "clients/capc_client/models.py"
#: Deliberate: each database keeps its own SQLAlchemy declarative base.
DELIBERATE = {
    "Base": {
        "services/gateway/tokens.py",
        "services/common/ledger/models.py",
        "services/student/store.py",
    },
}
#: Known duplicates not yet given one home: this list may only shrink.
KNOWN = {
    "Report",
    "audit",
    "load",
    "query_recipe",
    "serve",
    "verify",
}


def definitions() -> dict[str, list[str]]:
    """Public top-level class and function name -> the files defining it."""
    found: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")) or "/migrations/" in rel:
                continue
            for node in ast.parse(path.read_text()).body:
                if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if not node.name.startswith("_"):
                    found[node.name].append(rel)
    return found


def duplicates() -> dict[str, list[str]]:
    out = {}
    for name, files in definitions().items():
        if name in CONVENTIONS:
            continue
        rest = [f for f in files if f != CLIENT_MIRRORS and f not in DELIBERATE.get(name, ())]
        if len(rest) > 1:
            out[name] = files
    return out


def test_every_public_name_has_one_home() -> None:
    found = duplicates()
    new = {n: f for n, f in found.items() if n not in KNOWN}
    assert new == {}, f"defined more than once: {new}; give each concept one home"


def test_the_known_list_only_shrinks() -> None:
    """A name fixed since is taken off KNOWN, so it cannot come back unnoticed."""
    assert sorted(KNOWN - set(duplicates())) == []
