"""The ``capc audit`` command group; each command lives in a module of its own."""

from __future__ import annotations

import argparse

from services.audit import run, verify


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "audit", help="check the consortium's audit logs; empirical privacy audits (canaries)"
    )
    commands = p.add_subparsers(dest="audit_command", required=True)
    verify.add_parser(commands)
    run.add_parser(commands)
