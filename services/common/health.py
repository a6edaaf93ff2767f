"""``capc health``: the container healthcheck for every role.

    capc health --grpc HOST:PORT --service capc.v1.GuardianHub --pki /pki --name guardian
    capc health --file /var/lib/capc/connected --max-age 30     # an answering party
    capc health --http https://127.0.0.1:8080/healthz --ca /pki/ca.pem --server-name gateway

Exit 0 when healthy, 1 otherwise, with the reason on stderr. The checks themselves
(:func:`check_grpc`, :func:`check_file`, :func:`check_http`) are also how the local
harness (services.harness) knows that a process it started is ready.
"""

from __future__ import annotations

import argparse
import http.client
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common import pki, tls

#: What a failed check raises: the service is not up yet, is gone, or answers unhealthy.
UNHEALTHY: tuple[type[Exception], ...] = (
    OSError,
    ValueError,
    RuntimeError,
    grpc.RpcError,
    urllib.error.URLError,
    pki.PKIError,
    http.client.HTTPException,
)


def run(args: argparse.Namespace) -> int:
    try:
        if args.file is not None:
            check_file(args.file, args.max_age)
        elif args.http is not None:
            check_http(args.http, args.ca, args.server_name)
        else:
            files = None if args.insecure_dev else tls.TLSFiles.in_dir(args.pki, args.name)
            role = args.server_role
            if role is None:
                role = "guardian" if files is None else pki.identity(files.cert.read_bytes()).role
            check_grpc(args.grpc, files, args.server_name, role, args.service)
    except UNHEALTHY as err:
        print(f"unhealthy: {err}", file=sys.stderr)
        return 1
    return 0


def check_file(path: Path, max_age: float) -> None:
    """Returns when ``path`` (an answering party's --status-file) holds a time at most
    ``max_age`` seconds old; raises one of UNHEALTHY otherwise (no file: not connected)."""
    age = time.time() - float(path.read_text().strip())
    if age > max_age:
        raise RuntimeError(f"status is {age:.0f} s old (limit {max_age:g} s)")


def check_http(url: str, ca: Path | None, server_name: str | None) -> None:
    """Returns when ``url`` answers 200; raises one of UNHEALTHY otherwise."""
    status = _http_status(url, ca, server_name)
    if status != 200:
        raise RuntimeError(f"{url} answered {status}")


def check_grpc(
    target: str, files: tls.TLSFiles | None, server_name: str | None, role: str, service: str
) -> None:
    """Returns when the gRPC health service at ``target`` (whose certificate must carry
    ``role``; ``files=None``: plaintext, --insecure-dev) says ``service`` is SERVING;
    raises one of UNHEALTHY otherwise."""
    channel = tls.secure_channel(target, files, server_name, role=role)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    finally:
        channel.close()
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        raise RuntimeError(f"{target} is {reply.status}")


class _NamedHTTPS(http.client.HTTPSConnection):
    """HTTPS to an address, verifying the certificate for ``name``: a container checks
    itself at 127.0.0.1 against a certificate that names the host clients use."""

    def __init__(self, host: str, port: int, name: str, context: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=5, context=context)
        self._name, self._tls = name, context

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self._name)


def _http_status(url: str, ca: Path | None, server_name: str | None) -> int:
    """The status ``url`` answers with; https:// verifies the certificate, never skips it."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "http":
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as err:
            return err.code
    if parts.scheme != "https" or parts.hostname is None:
        raise ValueError(f"--http takes an http:// or https:// URL, got {url!r}")
    context = ssl.create_default_context(cafile=None if ca is None else str(ca))
    name = server_name or parts.hostname
    conn = _NamedHTTPS(parts.hostname, parts.port or 443, name, context)
    try:
        conn.request("GET", parts.path or "/")
        return conn.getresponse().status
    finally:
        conn.close()
