"""``capc health``: the container healthcheck for every role.

    capc health --grpc HOST:PORT --service capc.v1.GuardianHub --pki /pki --name guardian
    capc health --file /var/lib/capc/connected --max-age 30     # an answering party
    capc health --http http://127.0.0.1:8080/healthz            # the gateway

Exit 0 when healthy, 1 otherwise, with the reason on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common import pki, tls
from services.common.cli_args import add_tls_args


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
        choices=pki.ROLES,
        default=None,
        help="role the server's certificate must carry (default: the role of --name's "
        "certificate, as a service checks itself)",
    )
    add_tls_args(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.file is not None:
            age = time.time() - float(args.file.read_text().strip())
            if age > args.max_age:
                raise RuntimeError(f"status is {age:.0f} s old (limit {args.max_age:g} s)")
        elif args.http is not None:
            with urllib.request.urlopen(args.http, timeout=5) as response:
                if response.status != 200:
                    raise RuntimeError(f"{args.http} answered {response.status}")
        else:
            files = None if args.insecure_dev else tls.TLSFiles.in_dir(args.pki, args.name)
            role = args.server_role
            if role is None:
                role = "guardian" if files is None else pki.identity(files.cert.read_bytes()).role
            channel = tls.secure_channel(args.grpc, files, args.server_name, role=role)
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=5
            )
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                raise RuntimeError(f"{args.grpc} is {reply.status}")
    except (
        OSError,
        ValueError,
        RuntimeError,
        grpc.RpcError,
        urllib.error.URLError,
        pki.PKIError,
    ) as err:
        print(f"unhealthy: {err}", file=sys.stderr)
        return 1
    return 0
