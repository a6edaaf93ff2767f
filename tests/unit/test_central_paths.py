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
#: Float noise draws: numpy's, torch's and the standard library's Gaussian (and other
#: continuous) samplers.
FLOAT_NOISE = (
    "normal",
    "standard_normal",
    "randn",
    "randn_like",
    "normal_",
    "gauss",
    "normalvariate",
    "laplace",
    "gumbel",
    "logistic",
)
#: Modules that label and draw float noise for something else, and why.
NOT_A_LABELS_NOISE = {"capc/learning/dp_sgd.py": "DP-SGD's gradient noise"}
#: Calls that reach an attribute by its name as a string.
BY_NAME = ("getattr", "attrgetter", "methodcaller")


#: This project's packages: a bare name imported from them is its own function (the
#: ledger's ``decide``), never a mechanism's method or a library's sampler.
OURS = ("capc", "services", "clients", "experiments", "tests")


def foreign(tree: ast.AST, names: tuple[str, ...]) -> dict[str, str]:
    """Local name -> imported name, for each of ``names`` imported bare from a library
    (``from numpy.random import normal as n``)."""
    return {
        a.asname or a.name: a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.level == 0
        and (node.module or "").split(".")[0] not in OURS
        for a in node.names
        if a.name in names
    }


def calls(tree: ast.AST, names: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, name) of every use of a method or function named in ``names``: an attribute
    called or passed on (``f = mech.oracle``), a library's function imported bare and
    called (``from numpy.random import normal``), or a name reached by string
    (``getattr(mech, "oracle")``)."""
    bare = foreign(tree, names)
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            found.append((node.lineno, node.col_offset, node.attr))
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in bare:
                found.append((node.lineno, node.col_offset, bare[f.id]))
            elif (f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")) in BY_NAME:
                found += [
                    (a.lineno, a.col_offset, a.value)
                    for a in node.args
                    if isinstance(a, ast.Constant) and a.value in names
                ]
    return [(line, name) for line, _, name in sorted(found)]


def imported(node: ast.AST, module: str) -> list[str]:
    """The dotted names an import statement in ``module`` (a/b/c.py) brings in, a relative
    import resolved against the module's package."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.removesuffix(".py").split("/")[: -node.level]
        base = ".".join([*package, *([base] if base else [])])
    return [base, *(f"{base}.{a.name}" for a in node.names)] if base else []


def labels(tree: ast.AST, module: str = "") -> bool:
    """Whether a module imports a labelling module (at any depth)."""
    for node in ast.walk(tree):
        names = imported(node, module)
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
        if name not in NOT_A_LABELS_NOISE and labels(tree, name)
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


def test_the_checks_see_the_evasions_a_hand_loop_could_take() -> None:
    # A bound method passed on, a getattr by name, a relative import of a labelling
    # module, and float noise from torch, the standard library or a bare import.
    evasive = ast.parse(
        "import random\n"
        "import torch\n"
        "from numpy.random import normal\n"
        "from ..mechanisms import from_config\n"
        "def label(mech, hist):\n"
        "    release = mech.oracle\n"
        "    pick = getattr(mech, 'decide')\n"
        "    eta = torch.randn_like(hist) + random.gauss(0.0, 1.0) + normal(0.0, 1.0)\n"
        "    return release(hist, {'eta2': eta}, 16), pick(hist, {'eta2': eta})\n"
    )
    files = [("capc/learning/evasive.py", evasive)]
    assert oracle_callers(files) == [
        "capc/learning/evasive.py:6 calls .oracle(",
        "capc/learning/evasive.py:7 calls .decide(",
    ]
    assert float_noise(files) == [
        "capc/learning/evasive.py:8 draws .randn_like( in a labelling module",
        "capc/learning/evasive.py:8 draws .gauss( in a labelling module",
        "capc/learning/evasive.py:8 draws .normal( in a labelling module",
    ]
    # The project's own functions of those names (the ledger's admission rule) are not.
    ours = ast.parse("from capc.round.reservations import decide\ndecide(1)\n")
    assert oracle_callers([("capc/round/x.py", ours)]) == []
