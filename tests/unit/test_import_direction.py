"""Dependencies point inwards: services -> capc, and the client shares nothing with
the server. Every import statement is read, including those inside functions, so a
lazy import cannot slip a transport into the library."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: package folder -> top-level modules it may never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "capc": ("grpc", "google", "services", "capc_client", "fastapi", "starlette", "httpx"),
    "clients/capc_client": ("capc", "services", "grpc", "google"),
}


def imported(path: Path) -> list[tuple[int, str]]:
    """Every (line, top-level module) that ``path`` imports, at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.args[0].value.split(".")[0]))
    return out


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, module in imported(path)
        if module in forbidden
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_outside_its_layer(package: str) -> None:
    assert violations(package, FORBIDDEN[package]) == []


def test_the_check_sees_a_lazy_import_inside_a_function(tmp_path: Path) -> None:
    # the check can fail: a transport imported inside a function is found
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import importlib\n"
        "def f():\n"
        "    import grpc\n"
        "    from services.guardian import rounds\n"
        "    return importlib.import_module('google.protobuf')\n"
    )
    assert [m for _, m in imported(bad)] == ["importlib", "grpc", "services", "google"]


def test_the_guardian_round_engine_stays_an_adapter() -> None:
    """The protocol's rules live in capc.round; the guardian's engine keeps only links,
    locks, waits and conversions (issue 42: at most 400 lines, no rule of its own)."""
    engine = ROOT / "services" / "guardian" / "rounds.py"
    lines = len(engine.read_text().splitlines())
    assert lines <= 400, f"{engine.relative_to(ROOT)} has {lines} lines; move rules to capc.round"
    assert not [m for _, m in imported(engine) if m in ("sqlalchemy", "numpy")]


#: The four roles; each is a process of its own and shares only services.common and capc.
ROLES = ("answerer", "gateway", "guardian", "student")


def role_imports(path: Path) -> list[tuple[int, str]]:
    """(line, role) of every import of a role's package in ``path``, at any depth
    (type-only imports included: a type of another role is a coupling too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        found: list[tuple[int, str]] = []
        if isinstance(node, ast.Import):
            found = [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found = [(node.lineno, node.module)]
        for line, name in found:
            parts = name.split(".")
            if parts[0] == "services" and len(parts) > 1 and parts[1] in ROLES:
                out.append((line, parts[1]))
    return out


@pytest.mark.parametrize("role", ROLES)
def test_a_role_never_imports_another_role(role: str) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports services.{other}"
        for path in sorted((ROOT / "services" / role).rglob("*.py"))
        for line, other in role_imports(path)
        if other != role
    ]
    assert bad == []


def test_services_common_imports_no_role() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports services.{role}"
        for path in sorted((ROOT / "services" / "common").rglob("*.py"))
        for line, role in role_imports(path)
    ]
    assert bad == []


def test_the_role_check_sees_a_type_only_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from services.student.store import Job\n"
        "import services.guardian.rounds\n"
    )
    assert sorted(role_imports(bad)) == [(3, "student"), (4, "guardian")]


#: Inside capc: a package -> the capc packages it may never import (the accounting is
#: below the mechanisms; planning, which needs both, is its own package).
INNER_FORBIDDEN: dict[str, tuple[str, ...]] = {
    "capc/privacy": ("capc.mechanisms", "capc.planning", "capc.round"),
    "capc/mechanisms": ("capc.planning", "capc.round"),
}


def inner_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in ``path``, full dotted names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


@pytest.mark.parametrize("package", sorted(INNER_FORBIDDEN))
def test_a_capc_package_imports_no_package_above_it(package: str) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, module in inner_imports(path)
        if any(module == f or module.startswith(f + ".") for f in INNER_FORBIDDEN[package])
    ]
    assert bad == []


def module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` (a top-level folder) it imports, at any depth
    (lazy imports inside functions included: they close a circle all the same)."""
    names = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in sorted((ROOT / package).rglob("*.py"))
    }
    return {
        name: {m for _, m in inner_imports(path) if m in names and m != name}
        for name, path in names.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than
    one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part: list[str] = []
            while not part or part[-1] != node:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", ["experiments"])
def test_no_import_circle_in_a_package(package: str) -> None:
    assert circles(module_graph(package)) == []


def test_the_circle_check_sees_a_lazy_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
