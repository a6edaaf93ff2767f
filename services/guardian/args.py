"""``capc guardian``'s options: only the standard library is imported here, so ``capc guardian
--help`` answers at once (``services.guardian.main`` runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from capc.cli_handlers import lazy
from services.common.cli_args import ACCOUNTANT_NAMES, DEFAULT_ACCOUNTANT_NAME

#: services.common.limits.ROUND_TIMEOUT_S (a test checks they agree).
ROUND_TIMEOUT_S = 600.0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``capc guardian``; its handler imports services.guardian.main only when run."""
    p = sub.add_parser("guardian", help="run the privacy guardian hub")
    p.add_argument(
        "--db",
        default="guardian.db",
        help="SQLite path or URL, or postgresql://... (default: guardian.db)",
    )
    p.add_argument("--listen", default="0.0.0.0:50051", help="host:port to serve on")
    p.add_argument(
        "--pki",
        type=Path,
        default=None,
        help="directory with ca.pem and NAME.pem/.key (default: pki; "
        "with --insecure-dev, naming it keeps mutual TLS on)",
    )
    p.add_argument("--name", default="guardian", help="certificate name of this guardian")
    p.add_argument(
        "--audit-key",
        type=Path,
        default=None,
        help="Ed25519 key (PEM) that signs the audit log's heads; kept out of the database "
        "(default: PKI/NAME-audit.key, which `capc pki issue --role guardian` writes)",
    )
    p.add_argument(
        "--delta", type=float, default=1e-5, help="delta the ledger accounts at (fixed at creation)"
    )
    p.add_argument(
        "--accountant",
        choices=list(ACCOUNTANT_NAMES),
        help=f"the ledger's accountant, fixed when it is created (default {DEFAULT_ACCOUNTANT_NAME}: "
        "exact Gaussian DP; an existing ledger keeps its own)",
    )
    p.add_argument(
        "--register",
        action="append",
        default=[],
        metavar="PARTY=EPS:TEACHERS",
        help="register an answering party with the guardian's ceiling on its epsilon cap "
        "and the most teachers it may vote with (its vote weight, as the consortium agreed; "
        "repeatable; a changed value is audited). The cap enforced is never above the one "
        "the party sets itself (capc answerer --epsilon-cap); a party that connects with "
        "more teachers than pinned is refused",
    )
    p.add_argument(
        "--task",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="register a task from its JSON configuration (repeatable; idempotent, never changed)",
    )
    p.add_argument(
        "--allowance",
        action="append",
        default=[],
        metavar="QUERIER=EPS",
        help="optional fair share: the most epsilon QUERIER's rounds may charge any one party (repeatable)",
    )
    p.add_argument(
        "--querier",
        action="append",
        default=[],
        metavar="QUERIER=HOSPITAL",
        help="bind a querier certificate to the hospital it belongs to (the CaPC loop): every "
        "round of QUERIER leaves HOSPITAL's teachers out, whatever it asks, and its uploaded "
        "records need an audited choice to travel in the clear; kept in the ledger, "
        "repeatable",
    )
    p.add_argument(
        "--outside-querier",
        action="append",
        default=[],
        metavar="QUERIER",
        help="declare a querier certificate a student from outside the consortium (no "
        "hospital's): its uploaded queries may travel in the clear, each such round "
        "audited; kept in the ledger, repeatable",
    )
    p.add_argument(
        "--clear-records-from-unbound",
        choices=("refuse", "allow"),
        default=None,
        help="uploaded (clear) queries from a querier neither bound to a hospital "
        "(--querier) nor declared outside (--outside-querier): refuse them (the default of "
        "a new ledger: they may be a hospital's own records, sent unaudited with its own "
        "teachers voting) or allow them (what ledgers made before this option do); kept "
        "in the ledger, a change audited",
    )
    p.add_argument(
        "--share-timeout", type=float, default=60.0, help="seconds to wait for parties' shares"
    )
    p.add_argument(
        "--round-timeout",
        type=float,
        default=ROUND_TIMEOUT_S,
        help="seconds a round may stay opened but not computed before it is aborted and its "
        f"reservations returned; must exceed --share-timeout (default {ROUND_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--noise-seed",
        default=None,
        help="TESTS ONLY, needs --insecure-dev: draw noise from a seeded stream so a test can "
        "replay it; a restarted seeded guardian repeats its noise, so never with real data",
    )
    p.add_argument(
        "--migrate", action="store_true", help="only bring the ledger schema up to date, then exit"
    )
    p.add_argument(
        "--insecure-dev",
        action="store_true",
        help="development only: allows --noise-seed; plaintext gRPC without certificates "
        "unless --pki is given",
    )
    p.set_defaults(handler=lazy("services.guardian.main", "run"))
