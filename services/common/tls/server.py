"""Server side of mutual TLS: credentials that require a consortium client certificate,
and the interceptor that checks each caller's role and revocation."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grpc

from services.common.tls.aio import AsyncRoleInterceptor
from services.common.tls.files import TLSFiles
from services.common.tls.interceptors import RoleInterceptor
from services.common.tls.revocation import own_identity, revocations


def server_credentials(files: TLSFiles) -> grpc.ServerCredentials:
    """Server side of mutual TLS: a client certificate from the consortium CA is required."""
    ca, cert, key = own_identity(files)
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def server_interceptor(
    policy: Mapping[str, Iterable[str]], files: TLSFiles | None
) -> RoleInterceptor:
    """The role policy and the revocation check for a server; ``files=None`` is --insecure-dev."""
    if files is None:
        return RoleInterceptor(policy, insecure=True)
    return RoleInterceptor(policy, revocations=revocations(files))


def async_server_interceptor(
    policy: Mapping[str, Iterable[str]], files: TLSFiles | None
) -> AsyncRoleInterceptor:
    """:func:`server_interceptor` for an asyncio (grpc.aio) server."""
    return AsyncRoleInterceptor(server_interceptor(policy, files))
