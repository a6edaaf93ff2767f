"""A :class:`capc.mpc.channel.Channel` over a bidirectional gRPC stream.

The 2PC code is transport-agnostic; here its frames ride ``MpcFrame``
messages of the ``Compute`` stream. A reader thread moves incoming messages
into a queue so ``recv`` can honour a timeout, which a blocking gRPC iterator
cannot.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator

from capc.mpc.channel import ProtocolError
from services.proto.capc.v1 import common_pb2, guardian_pb2

_CLOSED = object()


class StreamChannel:
    """Frames out through :meth:`outgoing`, frames in from ``incoming``."""

    def __init__(self, header: common_pb2.Header, round_id: int = 0) -> None:
        self._header = header
        self._round = round_id
        self._out: queue.Queue[object] = queue.Queue()
        self._in: queue.Queue[object] = queue.Queue()
        self._error: BaseException | None = None
        self.ended = threading.Event()

    def attach(self, incoming: Iterable[guardian_pb2.MpcFrame]) -> None:
        """Start reading the other side's messages."""

        def pump() -> None:
            try:
                for msg in incoming:
                    self._in.put(bytes(msg.frame))
            except BaseException as err:  # the stream broke: recv reports it
                self._error = err
            finally:
                self._in.put(_CLOSED)
                self.ended.set()

        threading.Thread(target=pump, name="capc-mpc-stream", daemon=True).start()

    def outgoing(self) -> Iterator[guardian_pb2.MpcFrame]:
        """Messages to hand to gRPC (request iterator or response generator)."""
        while True:
            item = self._out.get()
            if item is _CLOSED:
                return
            assert isinstance(item, bytes)
            yield guardian_pb2.MpcFrame(header=self._header, round_id=self._round, frame=item)

    def send(self, frame: bytes) -> None:
        self._out.put(frame)

    def recv(self, timeout: float | None = None) -> bytes:
        try:
            item = self._in.get(timeout=timeout)
        except queue.Empty:
            raise ProtocolError(
                f"the other party sent nothing for {timeout} s; is it still running?"
            ) from None
        if item is _CLOSED:
            self._in.put(_CLOSED)
            reason = f": {self._error}" if self._error else ""
            raise ProtocolError(f"the 2PC stream closed before the round finished{reason}")
        assert isinstance(item, bytes)
        return item

    def close(self) -> None:
        """End the outgoing stream."""
        self._out.put(_CLOSED)
