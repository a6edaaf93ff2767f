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
from services.common.cli_args import setup_logging
from services.gateway.tokens import TokenError, TokenStore

log = logging.getLogger("capc.gateway")


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
        args.student,
        args.guardian,
        files,
        server_name=args.server_name,
        task=args.task,
        hospital=args.hospital,
    )
    app = create_app(
        backends,
        TokenStore(args.db),
        int(args.max_upload_mb * 1024 * 1024),
        requests_per_minute=args.rate_limit,
        uploads_in_flight_bytes=int(args.max_uploads_mb * 1024 * 1024),
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
