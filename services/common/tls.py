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
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import grpc.aio

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
    # The server pings too: a stream whose peer is cut off (a partition, a host that
    # lost power) ends within 30 s instead of when TCP gives up.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
)
INSECURE_WARNING = (
    "--insecure-dev: plaintext gRPC without certificates. Never use this with real patient data."
)


@dataclass(frozen=True)
class TLSFiles:
    """The CA certificate and this service's own certificate and key.

    The consortium's revocation list is ``crl.pem`` beside ``ca.pem``.
    """

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, directory: Path, name: str) -> TLSFiles:
        """``DIR/ca.pem``, ``DIR/NAME.pem``, ``DIR/NAME.key`` as written by ``capc pki``."""
        return cls(directory / pki.CA_CERT, directory / f"{name}.pem", directory / f"{name}.key")

    @property
    def crl(self) -> Path:
        return self.ca.with_name(pki.CRL_FILE)

    def read(self) -> tuple[bytes, bytes, bytes]:
        try:
            return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()
        except FileNotFoundError as err:
            raise pki.PKIError(
                f"missing TLS file {err.filename}; issue it with `capc pki issue`"
            ) from None


_watchers: dict[tuple[Path, bytes], pki.Revocations] = {}
_watchers_lock = threading.Lock()


def revocations(files: TLSFiles) -> pki.Revocations:
    """The process's one watcher of the CRL beside ``files.ca`` (shared by servers and channels)."""
    ca = files.read()[0]
    key = (files.crl.resolve(), ca)
    with _watchers_lock:
        watcher = _watchers.get(key)
        if watcher is None:
            watcher = _watchers[key] = pki.Revocations(files.crl, ca)
    return watcher


def _own_identity(files: TLSFiles) -> tuple[bytes, bytes, bytes]:
    """This service's files, after checking its certificate: CA, validity, not revoked."""
    ca, cert, key = files.read()
    who = pki.verify(cert, ca)  # refuse to start with an expired or foreign certificate
    revocations(files).check(who.serial, f"this service ({who.name}, {files.cert})")
    return ca, cert, key


def server_credentials(files: TLSFiles) -> grpc.ServerCredentials:
    """Server side of mutual TLS: a client certificate from the consortium CA is required."""
    ca, cert, key = _own_identity(files)
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


class ChannelError(grpc.RpcError):
    """A call refused before it left this process; reads like the RpcError gRPC raises."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class ServerIdentityError(ChannelError, pki.PKIError):
    """The server's certificate is not the one expected: wrong role, revoked, or not verifiable."""

    def __init__(self, details: str) -> None:
        super().__init__(grpc.StatusCode.UNAUTHENTICATED, details)


# The HTTP/2 client preface and an empty SETTINGS frame: a gRPC server that accepted
# our certificate answers with its own SETTINGS; one that did not closes the socket.
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")


def _host_port(target: str) -> tuple[str, int]:
    rest = target
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if rest.startswith(scheme):
            rest = rest[len(scheme) :]
            break
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = tail.removeprefix(":")
    else:
        host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise pki.PKIError(f"cannot check the server at {target!r}: give its address as host:port")
    return host, int(port)


def server_certificate(
    target: str, files: TLSFiles, server_name: str | None, role: str, timeout: float = 10.0
) -> tuple[bytes, pki.Identity]:
    """Fetch and check the certificate the server at ``target`` presents.

    The TLS handshake checks it against the consortium CA and the name dialled
    (``server_name`` or the target's host); then its role must be ``role`` and
    it must not be revoked. Raises :class:`ServerIdentityError`, or :class:`ChannelError`
    (UNAVAILABLE) when the server cannot be reached.
    """
    host, port = _host_port(target)
    name = server_name or host
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=files.read()[0].decode())
    context.load_cert_chain(files.cert, files.key)
    context.set_alpn_protocols(["h2"])
    shook = False
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=name) as conn,
        ):
            shook = True
            der = conn.getpeercert(binary_form=True)
            conn.sendall(_H2_HELLO)
            answered = bool(conn.recv(9))
    except ssl.SSLCertVerificationError as err:
        raise ServerIdentityError(
            f"the server at {target} presents a certificate that fails verification against "
            f"{files.ca} for the name {name!r} ({err.verify_message}): it is not the {role} "
            f"this consortium's CA certified{'' if server_name else '; if you dial it by another name, pass --server-name'}"
        ) from None
    except (ssl.SSLError, OSError) as err:
        if not shook:
            raise ChannelError(
                grpc.StatusCode.UNAVAILABLE, f"cannot reach the {role} at {target}: {err}"
            ) from None
        answered = False
    if not answered or der is None:
        raise ServerIdentityError(
            f"the {role} at {target} closed the connection after the TLS handshake: it did not "
            f"accept this service's certificate {files.cert}. Is it issued by the CA that server "
            "trusts, and still valid? (`capc pki issue` from the consortium CA)"
        )
    pem = ssl.DER_cert_to_PEM_cert(der).encode()
    try:
        who = pki.identity(pem)
    except pki.PKIError as err:
        raise ServerIdentityError(f"the server at {target}: {err}") from None
    if who.role != role:
        raise ServerIdentityError(
            f"the server at {target} presents the certificate of {who.name!r} with role "
            f"{who.role}, but a {role} was expected: check that {target} is the {role}'s address"
        )
    try:
        revocations(files).check(who.serial, f"the {role} at {target} ({who.name})")
    except pki.PKIError as err:
        raise ServerIdentityError(str(err)) from None
    return pem, who


class PinnedChannel(grpc.Channel):
    """A mutual-TLS channel to a server whose certificate was checked first.

    gRPC's Python API does not show a client the server's certificate, so before
    the first call this channel fetches it over a separate TLS handshake
    (:func:`server_certificate`: CA, name, role, revocation) and then trusts
    exactly that certificate, pinned as the channel's only root: every
    connection gRPC makes afterwards, reconnections included, must present it.
    A changed CRL is checked against the pinned certificate before the next
    call; a call that fails UNAVAILABLE (server gone, or a new certificate)
    makes the next call check the server again.
    """

    def __init__(
        self,
        target: str,
        files: TLSFiles,
        server_name: str | None,
        role: str,
        options: list[tuple[str, Any]],
    ) -> None:
        if role not in pki.ROLES:
            raise pki.PKIError(f"role must be one of {', '.join(pki.ROLES)}, got {role!r}")
        _, self._cert, self._key = _own_identity(files)
        self._target = target
        self._files = files
        self._server_name = server_name
        self.role = role
        self._options = options
        self._revocations = revocations(files)
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._server: pki.Identity | None = None
        self._generation = -1
        self._stale = False
        self._closed = False

    @property
    def server(self) -> pki.Identity | None:
        """Whom the channel is pinned to (None before the first call)."""
        return self._server

    def _probe(self, deadline: float | None, wait: bool) -> tuple[bytes, pki.Identity]:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            try:
                return server_certificate(
                    self._target,
                    self._files,
                    self._server_name,
                    self.role,
                    timeout=10.0 if left is None else max(0.01, min(10.0, left)),
                )
            except ChannelError as err:
                # wait_for_ready: a server that is not up yet is waited for, as gRPC would.
                if not wait or err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                if left is not None and left <= 0:
                    raise ChannelError(
                        grpc.StatusCode.DEADLINE_EXCEEDED, f"{err.details()} (waited for it)"
                    ) from None
                time.sleep(0.2)

    def connect(self, timeout: float | None = None, wait: bool = False) -> grpc.Channel:
        """The channel to the checked server, checking it first when needed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._revocations.refresh()
        retired: grpc.Channel | None = None
        try:
            with self._lock:
                if self._closed:
                    raise ValueError("Cannot invoke RPC on closed channel!")
                current, server = self._channel, self._server
                if current is not None and server is not None and not self._stale:
                    if self._generation != self._revocations.generation:
                        try:
                            self._revocations.check(
                                server.serial, f"the {self.role} at {self._target}"
                            )
                        except pki.PKIError as err:
                            retired = self._take()
                            raise ServerIdentityError(str(err)) from None
                        self._generation = self._revocations.generation
                    return current
                generation = self._revocations.generation
                pem, who = self._probe(deadline, wait)
                retired = self._take()
                creds = grpc.ssl_channel_credentials(
                    root_certificates=pem, private_key=self._key, certificate_chain=self._cert
                )
                channel = grpc.secure_channel(self._target, creds, options=self._options)
                self._channel, self._server = channel, who
                self._generation, self._stale = generation, False
                return channel
        finally:
            # Closed outside the lock: closing cancels calls whose callbacks may need it.
            if retired is not None:
                retired.close()

    def revoked(self) -> str | None:
        """Why the server this channel is pinned to is no longer trusted (its certificate
        was revoked since it was checked), or None. For a long-lived stream, whose one
        call never passes :meth:`connect` again."""
        self._revocations.refresh()
        server = self._server
        if server is None:
            return None
        try:
            self._revocations.check(server.serial, f"the {self.role} at {self._target}")
        except pki.PKIError as err:
            return str(err)
        return None

    def _take(self) -> grpc.Channel | None:
        channel, self._channel, self._server = self._channel, None, None
        return channel

    def failed(self, code: grpc.StatusCode | None) -> None:
        """A call ended with ``code``: after UNAVAILABLE the server is checked again."""
        if code == grpc.StatusCode.UNAVAILABLE:
            # A plain store, no lock: this runs in gRPC's callback threads.
            self._stale = True

    def _multi(
        self, kind: str, method: str, serializer: Any, deserializer: Any, registered: bool
    ) -> Any:
        return _LazyCallable(self, kind, method, serializer, deserializer, registered)

    def unary_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool = False,
    ) -> grpc.UnaryUnaryMultiCallable[Any, Any]:
        return cast(
            "grpc.UnaryUnaryMultiCallable[Any, Any]",
            self._multi(
                "unary_unary", method, request_serializer, response_deserializer, _registered_method
            ),
        )

    def unary_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool = False,
    ) -> grpc.UnaryStreamMultiCallable[Any, Any]:
        return cast(
            "grpc.UnaryStreamMultiCallable[Any, Any]",
            self._multi(
                "unary_stream",
                method,
                request_serializer,
                response_deserializer,
                _registered_method,
            ),
        )

    def stream_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool = False,
    ) -> grpc.StreamUnaryMultiCallable[Any, Any]:
        return cast(
            "grpc.StreamUnaryMultiCallable[Any, Any]",
            self._multi(
                "stream_unary",
                method,
                request_serializer,
                response_deserializer,
                _registered_method,
            ),
        )

    def stream_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool = False,
    ) -> grpc.StreamStreamMultiCallable[Any, Any]:
        return cast(
            "grpc.StreamStreamMultiCallable[Any, Any]",
            self._multi(
                "stream_stream",
                method,
                request_serializer,
                response_deserializer,
                _registered_method,
            ),
        )

    def subscribe(
        self, callback: Callable[[grpc.ChannelConnectivity], None], try_to_connect: bool = False
    ) -> None:
        self.connect().subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        with self._lock:
            channel = self._channel
        if channel is not None:
            channel.unsubscribe(callback)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channel = self._take()
        if channel is not None:
            channel.close()

    def __enter__(self) -> PinnedChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _LazyCallable:
    """A multi-callable of a :class:`PinnedChannel`: the checked channel is found at call time."""

    def __init__(
        self,
        owner: PinnedChannel,
        kind: str,
        method: str,
        serializer: Any,
        deserializer: Any,
        registered: bool,
    ) -> None:
        self._owner = owner
        self._kind = kind
        self._method = method
        self._serializer = serializer
        self._deserializer = deserializer
        self._registered = registered

    def _invoke(self, how: str, request: Any, timeout: float | None, **kwargs: Any) -> Any:
        start = time.monotonic()
        channel = self._owner.connect(timeout, bool(kwargs.get("wait_for_ready")))
        if timeout is not None:
            # the server check came out of the caller's time
            timeout = max(0.001, timeout - (time.monotonic() - start))
        multi = getattr(channel, self._kind)(
            self._method,
            request_serializer=self._serializer,
            response_deserializer=self._deserializer,
            _registered_method=self._registered,
        )
        try:
            out = getattr(multi, how)(request, timeout=timeout, **kwargs)
        except grpc.RpcError as err:
            self._owner.failed(err.code() if isinstance(err, grpc.Call) else None)
            raise
        if isinstance(out, grpc.Future):
            out.add_done_callback(lambda f: self._owner.failed(_code_of(f)))
        return out

    def __call__(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        return self._invoke("__call__", request, timeout, **kwargs)

    def with_call(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        return self._invoke("with_call", request, timeout, **kwargs)

    def future(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        return self._invoke("future", request, timeout, **kwargs)


def _code_of(call: Any) -> grpc.StatusCode | None:
    try:
        code = call.code()
    except Exception:  # a cancelled future has no code to report
        return None
    return code if isinstance(code, grpc.StatusCode) else None


def secure_channel(
    target: str, files: TLSFiles | None, server_name: str | None = None, *, role: str
) -> grpc.Channel:
    """A channel to the ``role`` server at ``target``; ``files=None`` means plaintext
    (``--insecure-dev`` only, where nothing is checked).

    With TLS the server's certificate must come from the consortium CA, name
    ``server_name`` (or the target's host), carry ``role`` and not be revoked;
    a call to any other server fails with :class:`ServerIdentityError`.
    """
    options = list(CHANNEL_OPTIONS)
    if files is None:
        log.warning(INSECURE_WARNING)
        return grpc.insecure_channel(target, options=options)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))  # type: ignore[arg-type]
    return PinnedChannel(target, files, server_name, role, list(options))


def peer_identity(context: grpc.ServicerContext) -> pki.Identity | None:
    """The caller's identity from its TLS certificate, or None on a plaintext channel."""
    pems = list(context.auth_context().get("x509_pem_cert", []))
    if not pems:
        return None
    first = pems[0]
    return pki.identity(first if isinstance(first, bytes) else bytes(first))


class PeerRevokedError(grpc.RpcError):
    """Raised into a handler's request stream when the caller's certificate is revoked mid-stream."""


# Checks one call at its start; returns what re-checks it on every later message
# (None: the caller is fine now) or aborts the call.
_Check = Callable[[grpc.ServicerContext], Callable[[], str | None]]


def _watch_requests(
    requests: Iterator[Any], context: grpc.ServicerContext, still: Callable[[], str | None]
) -> Iterator[Any]:
    for message in requests:
        why = still()
        if why is not None:
            # Often read on a servicer's own thread, where abort() cannot end the call:
            # the status is set here and the servicer sees its stream break.
            context.set_code(grpc.StatusCode.UNAUTHENTICATED)
            context.set_details(why)
            raise PeerRevokedError(why)
        yield message


def _watch_responses(
    responses: Iterator[Any], context: grpc.ServicerContext, still: Callable[[], str | None]
) -> Iterator[Any]:
    try:
        for message in responses:
            why = still()
            if why is not None:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
            yield message
    except PeerRevokedError as err:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, str(err))
    finally:
        close = getattr(responses, "close", None)
        if close is not None:
            close()


def _wrap(
    handler: grpc.RpcMethodHandler[Any, Any], check: _Check
) -> grpc.RpcMethodHandler[Any, Any]:
    streaming_in = handler.request_streaming
    streaming_out = handler.response_streaming

    def guard(behaviour: Callable[..., Any]) -> Callable[..., Any]:
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            still = check(context)
            if streaming_in:
                request = _watch_requests(request, context, still)
            if streaming_out:
                return _watch_responses(behaviour(request, context), context, still)
            try:
                return behaviour(request, context)
            except PeerRevokedError as err:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, str(err))

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
    if handler.stream_stream is None:
        raise TypeError(f"a gRPC method handler with no behaviour: {handler!r}")
    return grpc.stream_stream_rpc_method_handler(
        guard(handler.stream_stream), handler.request_deserializer, handler.response_serializer
    )


class RoleInterceptor(grpc.ServerInterceptor):
    """Allows an RPC only to the roles ``policy[method]`` names; every other method is refused.

    ``policy`` maps full method names ("/capc.v1.GuardianHub/OpenRound") to
    roles. Methods outside ``open_methods`` (the health service) and outside
    the policy are refused with PERMISSION_DENIED. With ``revocations``, a
    caller whose certificate is revoked is refused on every method, open ones
    included, and a stream is cut at its next message once the revocation
    reaches this service. With ``insecure=True`` (development only) nothing is
    checked.
    """

    def __init__(
        self,
        policy: Mapping[str, Iterable[str]],
        insecure: bool = False,
        open_methods: Iterable[str] = ("/grpc.health.v1.Health/",),
        revocations: pki.Revocations | None = None,
    ) -> None:
        self._policy = {m: frozenset(r) for m, r in policy.items()}
        self._insecure = insecure
        self._open = tuple(open_methods)
        self._revocations = revocations

    def _checker(self, method: str) -> _Check | None:
        """What checks a call of ``method`` (raising :class:`_RefusalError`), or None: nothing to check."""
        is_open = method.startswith(self._open)
        if self._insecure or (is_open and self._revocations is None):
            return None
        allowed = self._policy.get(method, frozenset())
        revocations = self._revocations

        def check(context: grpc.ServicerContext) -> Callable[[], str | None]:
            try:
                who = peer_identity(context)
            except pki.PKIError as err:
                raise _RefusalError(grpc.StatusCode.UNAUTHENTICATED, str(err)) from None
            if who is None:
                if is_open:
                    return lambda: None
                raise _RefusalError(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "a client certificate from the consortium CA is required",
                )

            def still() -> str | None:
                if revocations is None:
                    return None
                try:
                    revocations.check(who.serial, who.name)
                except pki.PKIError as err:
                    return str(err)
                return None

            why = still()
            if why is not None:
                log.warning("refused %s (%s) on %s: %s", who.name, context.peer(), method, why)
                raise _RefusalError(grpc.StatusCode.UNAUTHENTICATED, why)
            if not is_open and who.role not in allowed:
                raise _RefusalError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{who.name} has role {who.role}; {method} is for {', '.join(sorted(allowed)) or 'no role'}",
                )
            return still

        return check

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(details)
        check = self._checker(details.method)
        if handler is None or check is None:
            return handler

        def checked(context: grpc.ServicerContext) -> Callable[[], str | None]:
            try:
                return check(context)
            except _RefusalError as refusal:
                context.abort(refusal.code, refusal.details)

        return _wrap(handler, checked)


class AsyncRoleInterceptor(grpc.aio.ServerInterceptor):
    """:class:`RoleInterceptor`'s checks for an asyncio server, whose handlers are coroutines."""

    def __init__(self, roles: RoleInterceptor) -> None:
        self._roles = roles

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        check = self._roles._checker(details.method)
        if handler is None or check is None:
            return handler
        return _wrap_async(handler, check)


class _RefusalError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _wrap_async(
    handler: grpc.RpcMethodHandler[Any, Any], check: _Check
) -> grpc.RpcMethodHandler[Any, Any]:
    streaming_in = handler.request_streaming
    streaming_out = handler.response_streaming
    behaviour: Any = (
        handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    )
    if behaviour is None:
        raise TypeError(f"a gRPC method handler with no behaviour: {handler!r}")

    async def start(context: Any) -> Callable[[], str | None]:
        try:
            return check(context)
        except _RefusalError as refusal:
            await context.abort(refusal.code, refusal.details)
        raise AssertionError("unreachable")

    async def watch(
        requests: AsyncIterator[Any], context: Any, still: Callable[[], str | None]
    ) -> AsyncIterator[Any]:
        async for message in requests:
            why = still()
            if why is not None:
                # Read by the servicer's own task: the status is set here, its stream breaks.
                context.set_code(grpc.StatusCode.UNAUTHENTICATED)
                context.set_details(why)
                raise PeerRevokedError(why)
            yield message

    async def unary(request: Any, context: Any) -> Any:
        still = await start(context)
        if streaming_in:
            request = watch(request, context, still)
        try:
            return await behaviour(request, context)
        except PeerRevokedError as err:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(err))

    async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
        still = await start(context)
        if streaming_in:
            request = watch(request, context, still)
        responses = behaviour(request, context)
        try:
            async for message in responses:
                why = still()
                if why is not None:
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
                yield message
        except PeerRevokedError as err:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(err))
        finally:
            await responses.aclose()

    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(streaming_in, streaming_out)]
    return make(
        streaming if streaming_out else unary,
        handler.request_deserializer,
        handler.response_serializer,
    )
