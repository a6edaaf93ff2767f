"""One name, one meaning: no two modules of capc define different public objects under
the same top-level name (a reader who sees ``one_hot`` or ``ConfidentGNMax`` must not have
to check which module it came from). Re-exports of one object are fine; so are the few
names in ALLOWED, each a convention that is looked up by name."""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Names several modules define on purpose, each with why.
ALLOWED: dict[str, str] = {
    # Every CLI module registers its subcommand through ``add_parser(subparsers)``;
    # services/cli.py and capc/learning/__main__.py call it by that name on whichever
    # module a command names.
    "add_parser": "CLI subcommand registration, called by name on each command's module",
    # A subcommand's handler / an experiment's driver: ``capc privacy`` and
    # ``capc learning diet run`` call their module's ``run``, like services.audit.run.
    "run": "a command's handler, reached through its module (privacy.cli.run, diet.run)",
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def public_definitions(package: Path, root: Path) -> dict[str, list[str]]:
    """Top-level public def/class name -> the modules (dotted) that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        if path.name == "__main__.py":  # importing it would run the command
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            if isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
            ) and not node.name.startswith("_"):
                found[node.name].append(module_name(path, root))
    return found


def clashes(package: Path, root: Path) -> dict[str, list[str]]:
    """Names bound to more than one distinct object across ``package``'s modules."""
    out: dict[str, list[str]] = {}
    for name, modules in public_definitions(package, root).items():
        if len(modules) < 2:
            continue
        objects = {id(getattr(importlib.import_module(m), name)) for m in modules}
        if len(objects) > 1:
            out[name] = sorted(modules)
    return out


def test_no_public_name_means_two_things_in_capc() -> None:
    found = clashes(ROOT / "capc", ROOT)
    unexpected = {n: m for n, m in found.items() if n not in ALLOWED}
    assert unexpected == {}, "rename one of each (issue 42: one home per concept)"


def test_every_allowed_name_still_clashes() -> None:
    # an entry whose clash is gone is dead weight that would hide a new one
    assert set(ALLOWED) <= set(clashes(ROOT / "capc", ROOT))


def test_the_check_sees_a_clash_and_forgives_a_reexport(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "clashpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def one_hot(x):\n    return x\n\nclass Spec:\n    pass\n")
    (pkg / "b.py").write_text("def one_hot(x):\n    return -x\n")
    # a later rebinding to a's object is a re-export, not a second meaning
    (pkg / "c.py").write_text("class Spec:\n    pass\n\nfrom clashpkg.a import Spec\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert clashes(pkg, tmp_path) == {"one_hot": ["clashpkg.a", "clashpkg.b"]}
