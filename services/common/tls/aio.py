"""The checks of :class:`~services.common.tls.interceptors.RoleInterceptor` for an
asyncio (grpc.aio) server, whose handlers are coroutines."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from services.common.tls.interceptors import Check, PeerRevokedError, RefusalError, RoleInterceptor


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


def _wrap_async(
    handler: grpc.RpcMethodHandler[Any, Any], check: Check
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
        except RefusalError as refusal:
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
