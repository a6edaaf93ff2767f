"""A :class:`capc.mpc.channel.Channel` over a bidirectional gRPC stream.

The 2PC code is transport-agnostic; here its frames ride ``MpcFrame``
messages of the ``Compute`` stream. A reader moves incoming messages into a
bounded buffer so ``recv`` can honour a timeout, which a blocking gRPC
iterator cannot. Both directions are bounded (MPC_STREAM_BUFFER_FRAMES
frames of at most MAX_MPC_FRAME_BYTES): a peer that sends faster than this
side computes is held back by gRPC's flow control, and a frame larger than
the protocol allows is refused on arrival and ends the stream. A threaded
client reads with :meth:`attach`; the guardian's asyncio server with
:meth:`pump_async` and :meth:`outgoing_async`, which hold no thread.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator

from capc.mpc.channel import ProtocolError
from services.common.buffers import BoundedBuffer
from services.common.limits import (
    MAX_MPC_FRAME_BYTES,
    MPC_STREAM_BUFFER_FRAMES,
    STREAM_SEND_TIMEOUT_S,
)
from services.proto.capc.v1 import common_pb2, guardian_pb2


class FrameTooLargeError(ProtocolError):
    """The peer sent a 2PC frame larger than MAX_MPC_FRAME_BYTES; the stream is ended."""


class StreamChannel:
    """Frames out through :meth:`outgoing`, frames in from ``incoming``."""

    def __init__(
        self,
        header: common_pb2.Header,
        round_id: int = 0,
        send_timeout: float = STREAM_SEND_TIMEOUT_S,
    ) -> None:
        self._header = header
        self._round = round_id
        self._send_timeout = send_timeout
        self._out: BoundedBuffer[bytes] = BoundedBuffer(MPC_STREAM_BUFFER_FRAMES)
        self._in: BoundedBuffer[bytes] = BoundedBuffer(MPC_STREAM_BUFFER_FRAMES)
        self._error: BaseException | None = None
        #: Why this side refused the peer's stream (too large a frame), or None.
        self.refused: str | None = None
        self.ended = threading.Event()

    @property
    def error(self) -> BaseException | None:
        """Why the incoming stream ended, if it broke or was refused."""
        return self._error

    def accept(self, msg: guardian_pb2.MpcFrame) -> bytes | None:
        """The frame a message carries, or None (and the stream refused) when it is too large."""
        size = len(msg.frame)
        if size > MAX_MPC_FRAME_BYTES:
            self.refused = (
                f"a 2PC frame of {size} bytes exceeds the limit of {MAX_MPC_FRAME_BYTES} bytes "
                "(MAX_MPC_FRAME_BYTES): the stream is closed. capc splits its messages into "
                "smaller frames; check that both ends run capc"
            )
            self._error = FrameTooLargeError(self.refused)
            return None
        return bytes(msg.frame)

    def finished(self, error: BaseException | None = None) -> None:
        """The incoming stream ended (with ``error`` if it broke)."""
        if error is not None and self._error is None:
            self._error = error
        self._in.finish()
        self.ended.set()

    def attach(self, incoming: Iterable[guardian_pb2.MpcFrame]) -> None:
        """Start reading the other side's messages on a thread of their own."""

        def pump() -> None:
            try:
                for msg in incoming:
                    frame = self.accept(msg)
                    if frame is None or self._in.closed:
                        return
                    self._in.put(frame)  # waits while the buffer is full
            except BaseException as err:  # the stream broke: recv reports it
                self._error = err
            finally:
                self.finished()

        threading.Thread(target=pump, name="capc-mpc-stream", daemon=True).start()

    async def pump_async(
        self,
        incoming: AsyncIterator[guardian_pb2.MpcFrame],
        on_first: Callable[[], None] | None = None,
    ) -> None:
        """Read the other side's messages on the event loop (an asyncio server's stream);
        ``on_first`` runs once the first frame is buffered."""
        try:
            async for msg in incoming:
                frame = self.accept(msg)
                if frame is None or self._in.closed:
                    return
                await self._in.aput(frame)  # waits while the buffer is full
                if on_first is not None:
                    on_first()
                    on_first = None
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # the stream broke: recv reports it
            self._error = err
        finally:
            self.finished()

    async def outgoing_async(self) -> AsyncIterator[guardian_pb2.MpcFrame]:
        """Messages for an asyncio server's response stream."""
        while (item := await self._out.aget()) is not None:
            yield self.message(item)

    def outgoing(self) -> Iterator[guardian_pb2.MpcFrame]:
        """Messages to hand to gRPC (request iterator or response generator)."""
        while True:
            item = self._out.get()
            if item is None:
                return
            yield self.message(item)

    def message(self, frame: bytes) -> guardian_pb2.MpcFrame:
        return guardian_pb2.MpcFrame(header=self._header, round_id=self._round, frame=frame)

    def send(self, frame: bytes) -> None:
        try:
            self._out.put(frame, timeout=self._send_timeout)
        except queue.Full:
            raise ProtocolError(
                f"the other party took no 2PC frame for {self._send_timeout:g} s; is it still "
                "reading?"
            ) from None

    def recv(self, timeout: float | None = None) -> bytes:
        try:
            item = self._in.get(timeout=timeout)
        except queue.Empty:
            raise ProtocolError(
                f"the other party sent nothing for {timeout} s; is it still running?"
            ) from None
        if item is None:
            reason = f": {self._error}" if self._error else ""
            raise ProtocolError(f"the 2PC stream closed before the round finished{reason}")
        return item

    def close(self) -> None:
        """End the outgoing stream once what is queued has gone out."""
        self._out.finish()

    def stop_reading(self) -> None:
        """Drop what the peer sent and stop buffering more: the session is over."""
        self._in.close()
