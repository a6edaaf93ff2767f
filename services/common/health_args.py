"""``capc health``'s options: only the standard library is imported here, so ``capc health
--help`` answers at once (``services.common.health`` runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from capc.cli_handlers import lazy
from services.common.cli_args import ROLE_NAMES, add_tls_args


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``capc health``; its handler imports services.common.health only when run."""
    p = sub.add_parser("health", help="container healthcheck (gRPC, status file or HTTP)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--grpc", help="host:port of a capc gRPC service")
    what.add_argument("--file", type=Path, help="an answering party's --status-file")
    what.add_argument("--http", help="a URL that answers 200 when healthy")
    p.add_argument("--service", default="", help="gRPC health service name")
    p.add_argument("--name", default="guardian", help="certificate to dial with")
    p.add_argument("--max-age", type=float, default=30.0, help="seconds (with --file)")
    p.add_argument(
        "--server-role",
        choices=ROLE_NAMES,
        default=None,
        help="role the server's certificate must carry (default: the role of --name's "
        "certificate, as a service checks itself)",
    )
    p.add_argument(
        "--ca",
        type=Path,
        default=None,
        help="CA certificate an https:// URL must verify against (default: the system's)",
    )
    add_tls_args(p)
    p.set_defaults(handler=lazy("services.common.health", "run"))
