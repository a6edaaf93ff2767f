"""The bound on request bodies: each one's size, and all those held at once."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.ratelimit import MemoryBudget

#: Seconds a request refused for the shared upload budget is told to wait: an upload
#: of the largest size is read and handed on in a few seconds.
UPLOAD_RETRY_S = 5


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes with 413, and any body that would take
    ``budget`` (shared by every request in flight) past its limit with 503 and
    Retry-After, both before they are buffered. Bytes are reserved as they arrive, chunk
    by chunk, and held until the response is sent, so the budget may over-count a
    request that stopped early, never under-count. A declared Content-Length is not
    reserved (a connection declaring the largest body and sending nothing, no token
    needed, would hold the budget for nothing): it is refused early when it does not
    fit the room left now.
    """

    def __init__(self, app: ASGIApp, limit: int, budget: MemoryBudget) -> None:
        self.app, self.limit, self.budget = app, limit, budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        length = headers.get(b"content-length")
        declared = int(length) if length is not None and length.isdigit() else None
        if declared is not None and declared > self.limit:
            await self._refuse(send, 413, self._too_large())
            return
        if declared and self.budget.held + declared > self.budget.limit:
            await self._refuse(send, 503, self._busy(declared))
            return
        held = 0
        seen = 0
        started = False
        # Set when this middleware refuses the body midway: the app may turn the
        # exception into an error of its own (a form parser's 400), which is replaced.
        refusal: tuple[int, str] | None = None

        async def counted() -> Message:
            nonlocal seen, held, refusal
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    refusal = (413, self._too_large())
                    raise _RefusedError
                if seen > held:
                    if not self.budget.take(seen - held):
                        refusal = (503, self._busy(seen - held))
                        raise _RefusedError
                    held = seen
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if refusal is not None:
                if not started:
                    started = True
                    await self._refuse(send, *refusal)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _RefusedError:
            if not started and refusal is not None:
                started = True
                await self._refuse(send, *refusal)
        finally:
            self.budget.give(held)

    def _too_large(self) -> str:
        return (
            f"request body exceeds the gateway's limit of {self.limit} bytes; "
            "split the dataset into several jobs"
        )

    def _busy(self, wanted: int) -> str:
        return busy_detail(self.budget, wanted)

    async def _refuse(self, send: Send, status: int, detail: str) -> None:
        headers = [(b"content-type", b"application/json")]
        if status == 503:
            headers.append((b"retry-after", str(UPLOAD_RETRY_S).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps({"detail": detail}).encode()})


def busy_detail(budget: MemoryBudget, wanted: int) -> str:
    """What a request refused for the shared upload budget is told."""
    return (
        f"the gateway holds {budget.held} bytes of other uploads and takes at most "
        f"{budget.limit} bytes at once (--max-uploads-mb); this request needs {wanted} more. "
        f"Retry in {UPLOAD_RETRY_S} s, or ask the gateway's operator for a larger "
        "--max-uploads-mb"
    )


class _RefusedError(Exception):
    """BodyLimit refused the body it was reading; its response is already chosen."""
