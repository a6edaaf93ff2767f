"""The role check on every call of a (thread-pool) gRPC server, and the cut of a
stream whose caller's certificate is revoked while it runs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import grpc

from services.common import pki
from services.common.tls.identity import peer_identity

log = logging.getLogger("capc.tls")


class PeerRevokedError(grpc.RpcError):
    """Raised into a handler's request stream when the caller's certificate is revoked mid-stream."""


# Checks one call at its start; returns what re-checks it on every later message
# (None: the caller is fine now) or aborts the call.
Check = Callable[[grpc.ServicerContext], Callable[[], str | None]]


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
    handler: grpc.RpcMethodHandler[Any, Any], check: Check
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

    def _checker(self, method: str) -> Check | None:
        """What checks a call of ``method`` (raising :class:`RefusalError`), or None: nothing to check."""
        is_open = method.startswith(self._open)
        if self._insecure or (is_open and self._revocations is None):
            return None
        allowed = self._policy.get(method, frozenset())
        revocations = self._revocations

        def check(context: grpc.ServicerContext) -> Callable[[], str | None]:
            try:
                who = peer_identity(context)
            except pki.PKIError as err:
                raise RefusalError(grpc.StatusCode.UNAUTHENTICATED, str(err)) from None
            if who is None:
                if is_open:
                    return lambda: None
                raise RefusalError(
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
                raise RefusalError(grpc.StatusCode.UNAUTHENTICATED, why)
            if not is_open and who.role not in allowed:
                raise RefusalError(
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
            except RefusalError as refusal:
                context.abort(refusal.code, refusal.details)

        return _wrap(handler, checked)


class RefusalError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
