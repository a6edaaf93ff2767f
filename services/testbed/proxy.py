"""A TCP relay that adds delay and loss to the connections through it, and counts their bytes.

The kernel on these machines has no ``netem``, so an emulated link is built
from two parts (services.testbed.netlab): ``tc ... tbf`` on a veth pair sets
its rate, and this relay, on the path, sets its latency and loss. Each
direction of each connection is forwarded in order, every chunk held for the
one-way ``delay``; with probability ``loss`` a chunk is held one
retransmission timeout longer (200 ms, Linux's minimum RTO), which is what a
lost segment costs a TCP stream. Bytes are counted both ways, so a benchmark
can report what a query costs on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from dataclasses import dataclass, field

#: What a lost segment adds: Linux's minimum retransmission timeout.
RETRANSMIT_S = 0.2
CHUNK = 64 * 1024


@dataclass
class LinkProxy:
    """Accept on ``listen`` (host, port 0 picks one), forward to ``target`` (host, port)."""

    listen: tuple[str, int]
    target: tuple[str, int]
    delay: float = 0.0
    loss: float = 0.0
    seed: int = 0
    #: Bytes forwarded towards the target and back.
    bytes_up: int = 0
    bytes_down: int = 0
    port: int = 0
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _thread: threading.Thread | None = None
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not 0 <= self.loss < 1:
            raise ValueError(f"loss is a probability in [0, 1), got {self.loss}")
        if self.delay < 0:
            raise ValueError(f"delay must be >= 0 s, got {self.delay}")
        self._rng = random.Random(self.seed)

    def start(self) -> LinkProxy:
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return self

    def reset_counters(self) -> None:
        self.bytes_up = self.bytes_down = 0

    @property
    def bytes_total(self) -> int:
        return self.bytes_up + self.bytes_down

    @property
    def address(self) -> str:
        return f"{self.listen[0]}:{self.port}"

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen[0], self.listen[1])
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for task in (
            self._pipe(reader, up_writer, up=True),
            self._pipe(up_reader, writer, up=False),
        ):
            t = asyncio.ensure_future(task)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool
    ) -> None:
        # Chunks wait in order for their due time: delay keeps the byte stream's order.
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                at, data = await due.get()
                if not data:
                    break
                wait = at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
                if up:
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)

        sender = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(CHUNK):
                hold = self.delay + (RETRANSMIT_S if self._rng.random() < self.loss else 0.0)
                await due.put((time.monotonic() + hold, data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            await due.put((0.0, b""))
            with contextlib.suppress(Exception):
                await sender
            with contextlib.suppress(Exception):
                writer.close()

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            tasks = list(self._tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread is not None:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> LinkProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
