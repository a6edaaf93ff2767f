"""Mutual TLS for every gRPC service, and the role check on every call.

Servers require a client certificate issued by the consortium CA; the
caller's identity is its certificate's subject and its role the one bound in
the certificate (see :mod:`services.common.pki`). :class:`RoleInterceptor`
refuses any RPC whose method does not list the caller's role, before the
servicer runs. Plaintext exists only behind ``--insecure-dev``, which logs a
warning on every start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from services.common import pki
from services.common.limits import MAX_MESSAGE_BYTES

log = logging.getLogger("capc.tls")

# gRPC receives at most 4 MiB by default, far below a round's queries and shares.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
)
INSECURE_WARNING = (
    "--insecure-dev: plaintext gRPC without certificates. Never use this with real patient data."
)


@dataclass(frozen=True)
class TLSFiles:
    """The CA certificate and this service's own certificate and key."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, directory: Path, name: str) -> TLSFiles:
        """``DIR/ca.pem``, ``DIR/NAME.pem``, ``DIR/NAME.key`` as written by ``capc pki``."""
        return cls(directory / pki.CA_CERT, directory / f"{name}.pem", directory / f"{name}.key")

    def read(self) -> tuple[bytes, bytes, bytes]:
        try:
            return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()
        except FileNotFoundError as err:
            raise pki.PKIError(
                f"missing TLS file {err.filename}; issue it with `capc pki issue`"
            ) from None


def server_credentials(files: TLSFiles) -> grpc.ServerCredentials:
    """Server side of mutual TLS: a client certificate from the consortium CA is required."""
    ca, cert, key = files.read()
    pki.verify(cert, ca)  # refuse to start with an expired or foreign certificate
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def channel_credentials(files: TLSFiles) -> grpc.ChannelCredentials:
    """Client side of mutual TLS."""
    ca, cert, key = files.read()
    pki.verify(cert, ca)
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def secure_channel(
    target: str, files: TLSFiles | None, server_name: str | None = None
) -> grpc.Channel:
    """A channel to ``target``; ``files=None`` means plaintext (``--insecure-dev`` only)."""
    options = list(CHANNEL_OPTIONS)
    if files is None:
        log.warning(INSECURE_WARNING)
        return grpc.insecure_channel(target, options=options)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))  # type: ignore[arg-type]
    return grpc.secure_channel(target, channel_credentials(files), options=options)


def peer_identity(context: grpc.ServicerContext) -> pki.Identity | None:
    """The caller's identity from its TLS certificate, or None on a plaintext channel."""
    pems = list(context.auth_context().get("x509_pem_cert", []))
    if not pems:
        return None
    first = pems[0]
    return pki.identity(first if isinstance(first, bytes) else bytes(first))


def _wrap(
    handler: grpc.RpcMethodHandler[Any, Any], check: Callable[[grpc.ServicerContext], None]
) -> grpc.RpcMethodHandler[Any, Any]:
    def guard(behaviour: Callable[..., Any]) -> Callable[..., Any]:
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            check(context)
            return behaviour(request, context)

        return run

    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(
            guard(handler.unary_unary), handler.request_deserializer, handler.response_serializer
        )
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            guard(handler.unary_stream), handler.request_deserializer, handler.response_serializer
        )
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(
            guard(handler.stream_unary), handler.request_deserializer, handler.response_serializer
        )
    assert handler.stream_stream is not None
    return grpc.stream_stream_rpc_method_handler(
        guard(handler.stream_stream), handler.request_deserializer, handler.response_serializer
    )


class RoleInterceptor(grpc.ServerInterceptor):
    """Allows an RPC only to the roles ``policy[method]`` names; every other method is refused.

    ``policy`` maps full method names ("/capc.v1.GuardianHub/OpenRound") to
    roles. Methods outside ``open_methods`` (the health service) and outside
    the policy are refused with PERMISSION_DENIED. With ``insecure=True``
    (development only) the check is skipped.
    """

    def __init__(
        self,
        policy: Mapping[str, Iterable[str]],
        insecure: bool = False,
        open_methods: Iterable[str] = ("/grpc.health.v1.Health/",),
    ) -> None:
        self._policy = {m: frozenset(r) for m, r in policy.items()}
        self._insecure = insecure
        self._open = tuple(open_methods)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(details)
        method = details.method
        if handler is None or self._insecure or method.startswith(self._open):
            return handler
        allowed = self._policy.get(method, frozenset())

        def check(context: grpc.ServicerContext) -> None:
            try:
                who = peer_identity(context)
            except pki.PKIError as err:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, str(err))
            if who is None:
                context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "a client certificate from the consortium CA is required",
                )
            assert who is not None
            if who.role not in allowed:
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{who.name} has role {who.role}; {method} is for {', '.join(sorted(allowed)) or 'no role'}",
                )

        return _wrap(handler, check)
