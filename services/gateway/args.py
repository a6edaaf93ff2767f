"""``capc gateway``'s options: only the standard library is imported here, so ``capc
gateway --help`` answers at once (``services.gateway.main`` runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from capc.cli_handlers import lazy
from services.common.cli_args import add_tls_args

DEFAULT_DB = "gateway.db"
#: services.gateway.tokens.Role's values, and services.common.limits' upload and rate
#: limits: kept here so that registering imports neither (a test checks they agree).
TOKEN_ROLES = ("analyst", "admin", "metrics")
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
MAX_UPLOADS_IN_FLIGHT_BYTES = 16 * MAX_UPLOAD_BYTES
GATEWAY_REQUESTS_PER_MINUTE = 600


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``capc gateway serve`` and ``capc gateway token``; their handlers import
    services.gateway.main only when run."""
    p = sub.add_parser("gateway", help="the REST gateway and its tokens")
    gsub = p.add_subparsers(dest="gateway_command", required=True)

    serve = gsub.add_parser("serve", help="serve the REST API, /metrics and the dashboard")
    serve.add_argument("--student", required=True, help="student party address host:port")
    serve.add_argument("--guardian", required=True, help="guardian address host:port")
    serve.add_argument("--task", default="", help="task name (budget projections, job headers)")
    serve.add_argument("--listen", default="127.0.0.1:8080", help="host:port to serve HTTPS on")
    serve.add_argument("--db", default=DEFAULT_DB, help="token database: SQLite path or URL")
    serve.add_argument("--name", default="gateway", help="this gateway's certificate name")
    serve.add_argument(
        "--hospital",
        default="",
        help="a hospital's own gateway, over its CaPC loop's student party: its admin "
        "views (budget, parties, ledger, loops, privacy audits) show this hospital alone",
    )
    serve.add_argument(
        "--max-upload-mb",
        type=float,
        default=MAX_UPLOAD_BYTES / 2**20,
        help="largest request body (MiB)",
    )
    serve.add_argument(
        "--max-uploads-mb",
        type=float,
        default=MAX_UPLOADS_IN_FLIGHT_BYTES / 2**20,
        help="memory all uploads may hold at once: bodies and parsed queries (MiB; 503 "
        "with Retry-After beyond)",
    )
    serve.add_argument(
        "--rate-limit",
        type=_per_minute,
        default=GATEWAY_REQUESTS_PER_MINUTE,
        metavar="N",
        help="requests each token may make a minute, in bursts of up to N (429 beyond)",
    )
    serve.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        help="HTTPS certificate (PEM, chain included); default: PKI/NAME-https.pem from "
        "`capc pki issue-https`",
    )
    serve.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    add_tls_args(
        serve,
        insecure_help="plain HTTP and plaintext gRPC, no certificates (development only; "
        "bearer tokens then cross the network in clear)",
    )
    serve.set_defaults(handler=lazy("services.gateway.main", "run_serve"))

    token = gsub.add_parser("token", help="create, list or revoke bearer tokens")
    tsub = token.add_subparsers(dest="token_command", required=True)
    create = tsub.add_parser("create", help="create a token; it is printed once")
    create.add_argument("--role", required=True, choices=TOKEN_ROLES, help="what the token may do")
    create.add_argument("--name", default="", help="who holds it (appears in the audit log)")
    create.add_argument("--days", type=float, default=90.0, help="days until it expires")
    create.add_argument("--db", default=DEFAULT_DB, help="the token database")
    create.add_argument("--json", action="store_true", help="print JSON")
    create.set_defaults(handler=lazy("services.gateway.main", "run_token_create"))
    lst = tsub.add_parser("list", help="list tokens (never their secrets)")
    lst.add_argument("--db", default=DEFAULT_DB, help="the token database")
    lst.set_defaults(handler=lazy("services.gateway.main", "run_token_list"))
    revoke = tsub.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id", help="the token's id (token list shows it)")
    revoke.add_argument("--db", default=DEFAULT_DB, help="the token database")
    revoke.set_defaults(handler=lazy("services.gateway.main", "run_token_revoke"))


def _per_minute(text: str) -> int:
    """--rate-limit: a whole number of requests per minute, at least 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"a whole number of requests, at least 1, got {text!r}")
    return n
