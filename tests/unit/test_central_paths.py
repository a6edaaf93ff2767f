"""Central mode has one path (issue 55): every central labelling goes through
:mod:`capc.round.central`, the only module outside the mechanisms that calls a
mechanism's ``oracle`` or ``decide``, and no module that labels draws float numpy
noise: a label's noise is the mechanism's own draw (``draw_noise``, exact samplers)."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Where labelling code lives (benchmarks time the mechanisms themselves).
SCANNED = ("capc", "experiments", "services", "clients")
#: The one central path, and the mechanisms' own definitions (``super().decide``).
ORACLE_HOMES = ("capc/round/central.py", "capc/mechanisms/")
#: Modules that label: those importing one of these.
LABELLING = ("capc.mechanisms", "capc.round.central", "capc.learning.pate", "capc.labeldp.pate_fm")
#: Float noise draws.
FLOAT_NOISE = ("normal", "standard_normal", "randn", "normal_")
#: Modules that label and draw float noise for something else, and why.
NOT_A_LABELS_NOISE = {"capc/learning/dp_sgd.py": "DP-SGD's gradient noise"}


def calls(tree: ast.AST, names: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, name) of every call of a method or function attribute named in ``names``."""
    return [
        (node.lineno, node.func.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in names
    ]


def labels(tree: ast.AST) -> bool:
    """Whether a module imports a labelling module (at any depth)."""
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        if any(n == m or n.startswith(m + ".") for n in names for m in LABELLING):
            return True
    return False


@cache
def sources() -> list[tuple[str, ast.AST]]:
    return [
        (path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), filename=str(path)))
        for folder in SCANNED
        for path in sorted((ROOT / folder).rglob("*.py"))
    ]


def oracle_callers(files: Sequence[tuple[str, ast.AST]]) -> list[str]:
    return [
        f"{name}:{line} calls .{attr}("
        for name, tree in files
        if not name.startswith(ORACLE_HOMES)
        for line, attr in calls(tree, ("oracle", "decide"))
    ]


def float_noise(files: Sequence[tuple[str, ast.AST]]) -> list[str]:
    return [
        f"{name}:{line} draws .{attr}( in a labelling module"
        for name, tree in files
        if name not in NOT_A_LABELS_NOISE and labels(tree)
        for line, attr in calls(tree, FLOAT_NOISE)
    ]


def test_only_the_central_driver_calls_a_mechanisms_oracle_or_decide() -> None:
    assert oracle_callers(sources()) == []


def test_no_labelling_module_draws_float_numpy_noise() -> None:
    assert float_noise(sources()) == []


def test_the_checks_see_a_hand_loop_and_its_float_noise() -> None:
    # The checks can fail: the hand loops this issue removed are found.
    hand_loop = ast.parse(
        "from capc.mechanisms import from_config\n"
        "def label(mech, hist, rng):\n"
        "    noise = {'eta2': rng.normal(0.0, 1.0, hist.shape)}\n"
        "    return mech.decide(hist, noise), mech.oracle(hist, noise, 16)\n"
    )
    files = [("experiments/hand_loop.py", hand_loop)]
    assert oracle_callers(files) == [
        "experiments/hand_loop.py:4 calls .decide(",
        "experiments/hand_loop.py:4 calls .oracle(",
    ]
    assert float_noise(files) == ["experiments/hand_loop.py:3 draws .normal( in a labelling module"]
    # A module that labels nothing may draw what it likes (data generators, probes).
    assert (
        float_noise([("capc/data/x.py", ast.parse("import numpy\nnumpy.random.normal()\n"))]) == []
    )
    assert oracle_callers([("capc/round/central.py", hand_loop)]) == []
