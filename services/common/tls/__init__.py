"""Mutual TLS for every gRPC service, and the role check on every call.

Servers require a client certificate issued by the consortium CA; the
caller's identity is its certificate's subject and its role the one bound in
the certificate (see :mod:`services.common.pki`). :class:`RoleInterceptor`
refuses any RPC whose method does not list the caller's role, before the
servicer runs. Plaintext exists only behind ``--insecure-dev``, which logs a
warning on every start.

One job per module: :mod:`.options` (gRPC options), :mod:`.files` (where the
certificates are), :mod:`.revocation` (the CRL watchers and this service's own
certificate), :mod:`.server` (server credentials and interceptor),
:mod:`.identity` (the server's certificate and the caller's identity),
:mod:`.channel` (the pinned client channel), :mod:`.interceptors` and :mod:`.aio`
(the role and revocation checks on a thread-pool and an asyncio server).
"""

from services.common.tls.aio import AsyncRoleInterceptor
from services.common.tls.channel import PinnedChannel, secure_channel
from services.common.tls.files import TLSFiles
from services.common.tls.identity import (
    ChannelError,
    ServerIdentityError,
    peer_identity,
    server_certificate,
)
from services.common.tls.interceptors import PeerRevokedError, RoleInterceptor
from services.common.tls.options import CHANNEL_OPTIONS, INSECURE_WARNING, SERVER_OPTIONS
from services.common.tls.revocation import revocations
from services.common.tls.server import (
    async_server_interceptor,
    server_credentials,
    server_interceptor,
)

__all__ = [
    "CHANNEL_OPTIONS",
    "INSECURE_WARNING",
    "SERVER_OPTIONS",
    "AsyncRoleInterceptor",
    "ChannelError",
    "PeerRevokedError",
    "PinnedChannel",
    "RoleInterceptor",
    "ServerIdentityError",
    "TLSFiles",
    "async_server_interceptor",
    "peer_identity",
    "revocations",
    "secure_channel",
    "server_certificate",
    "server_credentials",
    "server_interceptor",
]
