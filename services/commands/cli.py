"""The ``capc`` command: one entry point, one subcommand per role or tool.

Subcommands are registered by name in :data:`COMMANDS`; a subcommand's module (which
may import torch, gRPC or TenSEAL) is imported only when that subcommand is named, so
``capc --help`` and a mistyped subcommand answer at once. Adding a subcommand is one
line in :data:`COMMANDS`: its name, the module whose ``add_parser(sub)`` registers it,
and the one-line help ``capc --help`` shows (the same text as that ``add_parser``'s).

So that ``capc NAME --help`` answers at once too, that module should import only the
standard library, its handler given as ``lazy("services.x.main", "run")``
(:func:`capc.cli_handlers.lazy`): see ``services/guardian/args.py``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import NamedTuple

from services.common.memory import keep_freed_memory


class Command(NamedTuple):
    """One ``capc`` subcommand: its name, the module registering it, its one-line help."""

    name: str
    module: str
    help: str


#: Every ``capc`` subcommand, in ``capc --help``'s order.
COMMANDS: tuple[Command, ...] = (
    Command(
        "privacy", "capc.planning.args", "plan queries and report privacy cost (no services needed)"
    ),
    Command("diet", "capc.learning.cli", "data-free learning: pretraining and the DIET experiment"),
    Command(
        "labeldp", "capc.labeldp.cli", "label-DP training (ALIBI, randomized response, PATE-FM)"
    ),
    Command(
        "demo",
        "services.commands.demo_args",
        "run a local DIET-CaPC consortium end to end and report",
    ),
    Command("pki", "services.common.pki_args", "consortium certificate authority"),
    Command("guardian", "services.guardian.args", "run the privacy guardian hub"),
    Command("answerer", "services.answerer.args", "run a hospital's answering party"),
    Command(
        "up",
        "services.commands.up_args",
        "run a local consortium (guardian, hospitals, student party, gateway) until "
        "interrupted, and print how to reach it with capcctl",
    ),
    Command("student", "services.student.args", "run the student party (jobs API for the gateway)"),
    Command("gateway", "services.gateway.args", "the REST gateway and its tokens"),
    Command(
        "health", "services.common.health_args", "container healthcheck (gRPC, status file or HTTP)"
    ),
    Command("task", "services.commands.task_cli", "write task files"),
    Command("teacher", "services.commands.teacher_cli", "fit a hospital's teachers"),
    Command("data", "services.commands.data_cli", "pack a hospital's records into an NPZ"),
    Command(
        "audit",
        "services.audit.cli",
        "check the consortium's audit logs; empirical privacy audits (canaries)",
    ),
)


def _register(sub: argparse._SubParsersAction[argparse.ArgumentParser], command: Command) -> None:
    """Register ``command`` fully: import its module and call its ``add_parser``."""
    importlib.import_module(command.module).add_parser(sub)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``capc`` argument parser.

    With ``only`` None every subcommand is registered fully (every module imported);
    otherwise only the subcommand named ``only`` is, and the others by name and help
    alone, so building it imports no other subcommand's module."""
    parser = argparse.ArgumentParser(
        prog="capc", description="Confidential and private collaborative learning"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        if only is None or command.name == only:
            _register(sub, command)
        else:
            sub.add_parser(command.name, help=command.help, add_help=False)
    return parser


def chosen(argv: Sequence[str]) -> str:
    """The subcommand ``argv`` names (its first word not an option), or "" if none."""
    names = {c.name for c in COMMANDS}
    for word in argv:
        if not word.startswith("-"):
            return word if word in names else ""
    return ""


def quiet_library_warnings() -> None:
    """Keep libraries' FutureWarnings (torch's, scikit-learn's: notices to their own
    callers about their next versions) off a user's terminal. capc raises none of its
    own (tests/unit/test_progress_and_warnings.py checks), so nothing meant for the user
    is lost; a user who sets ``-W``/``PYTHONWARNINGS`` keeps what they asked for. A
    filter rather than a module match, because libraries attribute them to their
    caller's line (``stacklevel``), which is capc's."""
    if not sys.warnoptions:
        warnings.filterwarnings("ignore", category=FutureWarning)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand."""
    quiet_library_warnings()
    keep_freed_memory()
    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(only=chosen(words)).parse_args(words)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
