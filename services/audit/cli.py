"""The ``capc audit`` command group; each command runs in a module of its own
(``services.audit.verify``, ``services.audit.run``), imported only when it runs: this
module imports the standard library alone, so ``capc audit --help`` answers at once."""

from __future__ import annotations

import argparse
from pathlib import Path

from services.common.cli_args import lazy


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``capc audit verify`` and ``capc audit run``."""
    p = sub.add_parser(
        "audit", help="check the consortium's audit logs; empirical privacy audits (canaries)"
    )
    commands = p.add_subparsers(dest="audit_command", required=True)
    _add_verify(commands)
    _add_run(commands)


def _add_verify(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``audit verify`` (services.audit.verify runs it)."""
    p = sub.add_parser(
        "verify",
        help="check the guardian's audit log against its signing key and the heads the "
        "hospitals kept; names the first bad entry",
    )
    p.add_argument("--ledger", required=True, help="the guardian's ledger (path or URL)")
    p.add_argument(
        "--party-ledger",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="a hospital's own ledger, with the heads it was shown (repeatable)",
    )
    p.add_argument(
        "--public-key", default=None, metavar="HEX", help="the guardian's audit key (Ed25519, hex)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=lazy("services.audit.verify", "run"))


def _add_run(asub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``audit run`` (services.audit.run runs it)."""
    r = asub.add_parser(
        "run", help="audit a local networked consortium (guardian, hospitals, student)"
    )
    r.add_argument(
        "--dir", type=Path, default=Path("audit-consortium"), help="keys, models and databases"
    )
    r.add_argument("--parties", type=int, default=3, help="hospitals (default %(default)s)")
    r.add_argument(
        "--hospital",
        type=int,
        action="append",
        help="index of a hospital whose data gets canaries (repeatable; default 0)",
    )
    r.add_argument("--canaries", type=int, default=100, help="canaries per audited hospital")
    r.add_argument("--queries", type=int, default=200, help="held-out queries beside the canaries")
    r.add_argument("--batch", type=int, default=100, help="queries per round")
    r.add_argument("--epsilon", type=float, default=1e6, help="each hospital's epsilon cap")
    r.add_argument("--teacher-epochs", type=int, default=8, help="training epochs per teacher")
    r.add_argument("--student-epochs", type=int, default=5, help="training epochs of the student")
    r.add_argument("--seed", type=int, default=0, help="the auditor's canaries and query order")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument(
        "--serve", action="store_true", help="then start the gateway and stay up (Ctrl-C stops)"
    )
    r.set_defaults(handler=lazy("services.audit.run", "run"))
