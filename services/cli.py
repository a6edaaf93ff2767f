"""The ``capc`` command: one entry point, one subcommand per role or tool."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from capc.labeldp import cli as labeldp_cli
from capc.learning import cli as diet_cli
from capc.privacy import cli as privacy_cli
from services import demo, local, task_cli, teacher_cli
from services.answerer import main as answerer_main
from services.audit import cli as audit_cli
from services.common import health, pki
from services.gateway import main as gateway_main
from services.guardian import main as guardian_main
from services.student import main as student_main


def build_parser() -> argparse.ArgumentParser:
    """The full ``capc`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="capc", description="Confidential and private collaborative learning"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    privacy_cli.add_parser(sub)
    diet_cli.add_parser(sub)
    labeldp_cli.add_parser(sub)
    demo.add_parser(sub)
    pki.add_parser(sub)
    guardian_main.add_parser(sub)
    answerer_main.add_parser(sub)
    local.add_parser(sub)
    student_main.add_parser(sub)
    gateway_main.add_parser(sub)
    health.add_parser(sub)
    audit_cli.add_parser(sub)
    task_cli.add_parser(sub)
    teacher_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
