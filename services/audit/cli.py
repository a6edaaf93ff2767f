"""The ``capc audit`` command group; each command runs in a module of its own
(``services.audit.verify``, ``services.audit.run``, ``services.audit.record``), imported only when it runs: this
module imports the standard library alone, so ``capc audit --help`` answers at once."""

from __future__ import annotations

import argparse
from pathlib import Path

from capc.cli_handlers import lazy
from services.common.cli_args import add_tls_args


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``capc audit verify``, ``capc audit run`` and ``capc audit record``."""
    p = sub.add_parser(
        "audit", help="check the consortium's audit logs; empirical privacy audits (canaries)"
    )
    commands = p.add_subparsers(dest="audit_command", required=True)
    _add_verify(commands)
    _add_run(commands)
    _add_record(commands)


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


def _add_record(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``audit record`` (services.audit.record runs it)."""
    r = sub.add_parser(
        "record",
        help="record a canary audit's counts with the guardian, as its operator (guardian "
        "certificate) or as the audited hospital (its own certificate)",
    )
    r.add_argument("--guardian", required=True, help="the guardian's address host:port")
    r.add_argument(
        "--name",
        required=True,
        help="the certificate to record with (PKI/NAME.pem): the guardian operator's "
        "(role guardian) or the audited hospital's own (role answerer)",
    )
    r.add_argument("--party", required=True, help="the audited party")
    r.add_argument("--canaries", type=int, required=True, help="canaries planted")
    r.add_argument("--guesses", type=int, required=True, help="canaries the attack guessed")
    r.add_argument("--correct", type=int, required=True, help="guesses that were right")
    r.add_argument("--attack", required=True, help="what the attack saw and did (1-256 chars)")
    r.add_argument("--confidence", type=float, default=0.95, help="the interval's confidence level")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    add_tls_args(r)
    r.set_defaults(handler=lazy("services.audit.record", "run"))
