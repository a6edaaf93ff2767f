"""Services and clients are generic over mechanisms: no mechanism is named outside capc.mechanisms.

Every string literal in the services' and clients' Python code (generated protobuf
modules aside) whose value is exactly a registered mechanism's name is reported with
its file and line. Only whole literals count: "binary data" or a docstring that
mentions GNMax is not a hit, '"binary"' and 'f"binary"' are.
"""

from __future__ import annotations

import ast
from pathlib import Path

from capc.mechanisms import MECHANISMS

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("services", "clients")
EXCLUDED = (ROOT / "services" / "proto",)


def python_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if any(path.is_relative_to(x) for x in EXCLUDED) or ".egg-info" in path.parts:
                continue
            files.append(path)
    return files


def named_mechanisms(source: str, names: frozenset[str]) -> list[tuple[int, str]]:
    """(line, name) of every string literal in ``source`` that is exactly one of ``names``.

    An f-string counts when it has no placeholders and its text is a name.
    """
    tree = ast.parse(source)
    # Literal pieces of an f-string with placeholders (f"{x}binary") are not whole literals.
    pieces = {
        id(part)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for part in node.values
    }
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            if len(parts) == 1 and isinstance(parts[0], ast.Constant):
                value = parts[0].value
                if isinstance(value, str) and value in names:
                    hits.append((node.lineno, value))
        elif isinstance(node, ast.Constant) and id(node) not in pieces:
            raw = node.value
            value = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            if isinstance(value, str) and value in names:
                hits.append((node.lineno, value))
    return sorted(hits)


def test_the_scanner_matches_exact_literals_only() -> None:
    names = frozenset({"binary", "gnmax", "confident-gnmax"})
    source = '''
"""A docstring about binary voting and "gnmax"."""
# a comment naming "gnmax"
a = "binary data"
b = 'gnmax'
c = "confident-gnmax"
d = f"gnmax"
e = f"{a}binary"
f = b"binary"
g = {"name": "BINARY", "binary": 1}
h = """gnmax"""
'''
    assert named_mechanisms(source, names) == [
        (5, "gnmax"),
        (6, "confident-gnmax"),
        (7, "gnmax"),
        (9, "binary"),
        (10, "binary"),
        (11, "gnmax"),
    ]


def test_no_mechanism_is_named_in_services_or_clients() -> None:
    names = frozenset(MECHANISMS)
    assert {"gnmax", "confident-gnmax", "binary", "tau", "powerset"} <= names
    files = python_files()
    assert any(p.name == "hub.py" for p in files) and any("clients" in p.parts for p in files)
    hits = [
        f"{path.relative_to(ROOT)}:{line}: {name!r}"
        for path in files
        for line, name in named_mechanisms(path.read_text(encoding="utf-8"), names)
    ]
    assert not hits, "mechanisms named outside capc.mechanisms:\n" + "\n".join(hits)
