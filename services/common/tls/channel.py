"""Client side of mutual TLS: a channel pinned to the one server certificate it checked."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import grpc

from services.common import pki
from services.common.tls.files import TLSFiles
from services.common.tls.identity import ChannelError, ServerIdentityError, server_certificate
from services.common.tls.options import CHANNEL_OPTIONS, INSECURE_WARNING
from services.common.tls.revocation import own_identity, revocations

log = logging.getLogger("capc.tls")


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
        _, self._cert, self._key = own_identity(files)
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
