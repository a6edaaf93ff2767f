"""``capc gateway``: serve the REST gateway, or manage its bearer tokens.

capc gateway serve --student HOST:PORT --guardian HOST:PORT --task NAME --pki DIR
    [--tls-cert FILE --tls-key FILE] [--rate-limit N]
capc gateway token create --role analyst|admin|metrics [--name NAME] [--days 90]
capc gateway token list | revoke ID
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from services.common import pki, tls
from services.common.cli_args import add_tls_args, setup_logging
from services.common.limits import GATEWAY_REQUESTS_PER_MINUTE, MAX_UPLOAD_BYTES
from services.gateway.tokens import Role, TokenError, TokenStore

DEFAULT_DB = "gateway.db"
log = logging.getLogger("capc.gateway")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
        "--max-upload-mb",
        type=float,
        default=MAX_UPLOAD_BYTES / 2**20,
        help="largest request body (MiB)",
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
    serve.set_defaults(handler=run_serve)

    token = gsub.add_parser("token", help="create, list or revoke bearer tokens")
    tsub = token.add_subparsers(dest="token_command", required=True)
    create = tsub.add_parser("create", help="create a token; it is printed once")
    create.add_argument(
        "--role", required=True, choices=[r.value for r in Role], help="what the token may do"
    )
    create.add_argument("--name", default="", help="who holds it (appears in the audit log)")
    create.add_argument("--days", type=float, default=90.0, help="days until it expires")
    create.add_argument("--db", default=DEFAULT_DB, help="the token database")
    create.add_argument("--json", action="store_true", help="print JSON")
    create.set_defaults(handler=run_token_create)
    lst = tsub.add_parser("list", help="list tokens (never their secrets)")
    lst.add_argument("--db", default=DEFAULT_DB, help="the token database")
    lst.set_defaults(handler=run_token_list)
    revoke = tsub.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id", help="the token's id (token list shows it)")
    revoke.add_argument("--db", default=DEFAULT_DB, help="the token database")
    revoke.set_defaults(handler=run_token_revoke)


def _per_minute(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"a whole number of requests, at least 1, got {text!r}")
    return n


def run_token_create(args: argparse.Namespace) -> int:
    try:
        token, info = TokenStore(args.db).create(args.role, args.name, args.days)
    except TokenError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"token": token, **info.__dict__}))
    else:
        print(token)
        print(
            f"# {info.role} token {info.id} for {info.name}, expires {info.expires_at}; "
            "it is not shown again",
            file=sys.stderr,
        )
    return 0


def run_token_list(args: argparse.Namespace) -> int:
    for info in TokenStore(args.db).tokens():
        print(json.dumps(info.__dict__))
    return 0


def run_token_revoke(args: argparse.Namespace) -> int:
    try:
        TokenStore(args.db).revoke(args.id)
    except TokenError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"revoked {args.id}")
    return 0


INSECURE_HTTP_WARNING = (
    "--insecure-dev: plain HTTP; bearer tokens, uploads and budgets cross the network "
    "unencrypted. Never use this with real patient data."
)


def https_files(args: argparse.Namespace) -> tuple[Path, Path] | None:
    """The certificate and key to serve HTTPS with, checked; None under --insecure-dev."""
    supplied = args.tls_cert is not None or args.tls_key is not None
    if args.insecure_dev:
        if supplied:
            raise ValueError(
                "--insecure-dev serves plain HTTP: drop --tls-cert/--tls-key, or drop "
                "--insecure-dev to serve HTTPS"
            )
        return None
    if supplied:
        if args.tls_cert is None or args.tls_key is None:
            raise ValueError("--tls-cert and --tls-key go together: pass both")
        cert, key = args.tls_cert, args.tls_key
    else:
        cert, key = pki.https_paths(args.pki, args.name)
        if not cert.exists():
            raise pki.PKIError(
                f"no HTTPS certificate at {cert}: issue one with `capc pki issue-https "
                f"--dir {args.pki} --name {args.name} --host GATEWAY_DNS_NAME`, pass "
                "--tls-cert/--tls-key, or serve plain HTTP in development with --insecure-dev"
            )
    pki.check_https(cert, key)
    return cert, key


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from services.gateway.app import create_app
    from services.gateway.backends import Backends

    setup_logging()
    try:
        files = None if args.insecure_dev else tls.TLSFiles.in_dir(args.pki, args.name)
        if files is not None:
            files.read()
        https = https_files(args)
        host, _, port = args.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--listen must be host:port, got {args.listen!r}")
    except (OSError, ValueError, pki.PKIError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if https is None:
        log.warning(INSECURE_HTTP_WARNING)
    backends = Backends(
        args.student, args.guardian, files, server_name=args.server_name, task=args.task
    )
    app = create_app(
        backends,
        TokenStore(args.db),
        int(args.max_upload_mb * 1024 * 1024),
        requests_per_minute=args.rate_limit,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=int(port),
        log_level="info",
        access_log=False,
        ssl_certfile=None if https is None else str(https[0]),
        ssl_keyfile=None if https is None else str(https[1]),
    )
    server = uvicorn.Server(config)
    scheme = "http" if https is None else "https"
    print(f"gateway serving on {scheme}://{host}:{port} (dashboard at /dashboard)", flush=True)
    server.run()
    backends.close()
    return 0
