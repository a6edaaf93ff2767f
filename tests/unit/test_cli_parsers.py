"""The ``capc`` and ``capcctl`` parsers: light to build, every option explained."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.commands import cli

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients"))
from capc_client import cli as capcctl  # noqa: E402

#: Modules ``capc --help`` must not import: each takes a second or more to load.
HEAVY = ("torch", "grpc", "tenseal", "sklearn")


def _imported(argv: list[str]) -> set[str]:
    """Top-level packages ``python -X importtime -m services.commands.cli ARGV`` imports."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "services.commands.cli", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    names = set()
    for line in out.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


@pytest.mark.parametrize("argv", [["--help"], [], ["no-such-command"]])
def test_top_level_help_imports_nothing_heavy(argv: list[str]) -> None:
    imported = _imported(argv)
    assert "argparse" in imported  # the importtime output was read
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


def test_building_one_subcommand_imports_only_its_module() -> None:
    code = (
        "import sys; from services.commands.cli import build_parser; build_parser(only='');"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse._SubParsersAction]:  # type: ignore[type-arg]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield action


def test_registry_matches_the_modules() -> None:
    """`capc --help` shows the registry's help: the same as each module registers."""
    (sub,) = _subparsers(cli.build_parser())
    registered = {a.dest: a.help for a in sub._choices_actions}
    assert registered == {c.name: c.help for c in cli.COMMANDS}


def _walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    """Every (command path, action) of ``parser`` and its subparsers, recursively."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _walk(child, f"{path} {name}")
        else:
            yield path, action


@pytest.mark.parametrize(
    "name,parser", [("capc", cli.build_parser()), ("capcctl", capcctl.build_parser())]
)
def test_every_option_has_help(name: str, parser: argparse.ArgumentParser) -> None:
    missing = [
        f"{path}: {'/'.join(action.option_strings) or action.dest}"
        for path, action in _walk(parser, name)
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert not missing, "options without help:\n" + "\n".join(missing)


#: Subcommands whose options are registered by a module of the standard library alone
#: (services/*/args.py): their --help imports nothing heavy. The rest import their own
#: module only (diet and labeldp still import theirs).
LIGHT = (
    "privacy",
    "guardian",
    "answerer",
    "health",
    "gateway",
    "student",
    "pki",
    "audit",
    "demo",
    "up",
)


@pytest.mark.parametrize("name", LIGHT)
def test_light_subcommand_help_imports_nothing_heavy(name: str) -> None:
    imported = _imported([name, "--help"])
    assert "argparse" in imported
    assert not imported & {*HEAVY, "numpy"}, sorted(imported & {*HEAVY, "numpy"})


def test_light_registrations_agree_with_the_modules() -> None:
    from capc.mechanisms import MECHANISMS
    from capc.planning import args as privacy_args
    from capc.privacy.accountants import ACCOUNTANTS, DEFAULT_ACCOUNTANT
    from capc.privacy.conversion import Conversion
    from services.common import cli_args, limits, pki, pki_args
    from services.gateway import args as gateway_args
    from services.gateway.tokens import Role
    from services.guardian import args as guardian_args

    assert tuple(ACCOUNTANTS) == cli_args.ACCOUNTANT_NAMES
    assert tuple(MECHANISMS) == privacy_args.MECHANISM_NAMES
    assert tuple(c.value for c in Conversion) == privacy_args.CONVERSIONS
    assert cli_args.DEFAULT_ACCOUNTANT_NAME == DEFAULT_ACCOUNTANT
    assert cli_args.ROLE_NAMES == pki.ROLES
    assert tuple(pki.REASONS) == pki_args.REVOKE_REASONS
    assert guardian_args.ROUND_TIMEOUT_S == limits.ROUND_TIMEOUT_S
    assert tuple(r.value for r in Role) == gateway_args.TOKEN_ROLES
    assert gateway_args.MAX_UPLOAD_BYTES == limits.MAX_UPLOAD_BYTES
    assert gateway_args.MAX_UPLOADS_IN_FLIGHT_BYTES == limits.MAX_UPLOADS_IN_FLIGHT_BYTES
    assert gateway_args.GATEWAY_REQUESTS_PER_MINUTE == limits.GATEWAY_REQUESTS_PER_MINUTE


def test_a_lazy_handler_runs_its_module_function() -> None:
    parser = cli.build_parser(only="health")
    args = parser.parse_args(["health", "--file", "/nonexistent/status"])
    assert args.handler.__qualname__ == "services.common.health.run"
    assert args.handler(args) == 1
