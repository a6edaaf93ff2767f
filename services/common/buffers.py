"""Bridges between threads and asyncio tasks: a bounded, closable buffer and a signal.

Every queue between a network stream and the code behind it is one of these,
so no peer can make a service hold more than ``capacity`` items for it: a
producer that gets ahead waits (and gRPC's flow control then holds the
sender back) or, where waiting is wrong, is refused with :class:`queue.Full`.
Threads use :meth:`put` and :meth:`get`; coroutines on an event loop use
:meth:`aput` and :meth:`aget`, which wait without holding a thread.

:meth:`finish` ends the buffer after its last item: getters take what is
left, then get None. :meth:`close` ends it now: every waiting and later
:meth:`get` returns None at once (pending items are dropped: the stream they
were for is gone). After either, puts are ignored.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class BoundedBuffer(Generic[T]):
    """At most ``capacity`` items, first in first out; safe across threads and event loops."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a buffer holds at least one item, got capacity {capacity}")
        self.capacity = capacity
        self._items: deque[T] = deque()
        self._closed = False
        self._finished = False
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        # Coroutines waiting for a change, each with the loop to wake it on.
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    # -- both sides ---------------------------------------------------------------
    def _notify(self) -> None:
        """Wake every waiter; call with the lock held."""
        self._changed.notify_all()
        waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_wake, future)

    def _take(self) -> tuple[bool, T | None]:
        """(True, item) when an item or the end is there; call with the lock held."""
        if self._closed:
            return True, None
        if self._items:
            item = self._items.popleft()
            self._notify()
            return True, item
        return self._finished, None

    def _add(self, item: T) -> bool:
        """True when ``item`` went in (or the buffer is ended); call with the lock held."""
        if self._closed or self._finished:
            return True
        if len(self._items) >= self.capacity:
            return False
        self._items.append(item)
        self._notify()
        return True

    def finish(self) -> None:
        """No more items: getters take what is left, then see None; later puts are dropped."""
        with self._lock:
            self._finished = True
            self._notify()

    def close(self) -> None:
        """End the buffer now: pending items are dropped, getters see None, puts are dropped."""
        with self._lock:
            self._closed = True
            self._items.clear()
            self._notify()

    @property
    def closed(self) -> bool:
        return self._closed

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    # -- threads ------------------------------------------------------------------
    def put(self, item: T, timeout: float | None = None) -> None:
        """Add ``item``, waiting up to ``timeout`` s for room; raises queue.Full after that."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not self._add(item):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise queue.Full
                self._changed.wait(left)

    def put_nowait(self, item: T) -> None:
        """Add ``item`` or raise queue.Full at once."""
        with self._lock:
            if not self._add(item):
                raise queue.Full

    def get(self, timeout: float | None = None) -> T | None:
        """The next item, or None once closed; raises queue.Empty after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                done, item = self._take()
                if done:
                    return item
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise queue.Empty
                self._changed.wait(left)

    def get_nowait(self) -> T | None:
        return self.get(timeout=0)

    # -- coroutines -----------------------------------------------------------------
    async def _changed_async(self) -> None:
        """Wait for the next change; registered under the lock by the caller's check."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.append((loop, future))
        self._lock.release()
        try:
            await future
        finally:
            self._lock.acquire()

    async def aput(self, item: T) -> None:
        """Add ``item``, waiting on the event loop (no thread held) for room."""
        self._lock.acquire()
        try:
            while not self._add(item):
                await self._changed_async()
        finally:
            self._lock.release()

    async def aget(self) -> T | None:
        """The next item, or None once closed, waiting on the event loop."""
        self._lock.acquire()
        try:
            while True:
                done, item = self._take()
                if done:
                    return item
                await self._changed_async()
        finally:
            self._lock.release()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Signal:
    """A one-way flag that threads wait on with :meth:`wait` and coroutines with
    :meth:`wait_async` (no thread held while waiting)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def set(self) -> None:
        with self._lock:
            self._event.set()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_wake, future)

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    async def wait_async(self, timeout: float | None = None) -> bool:
        """True once set; False if ``timeout`` s pass first."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._event.is_set():
                return True
            self._waiters.append((loop, future))
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            with self._lock:
                if (loop, future) in self._waiters:
                    self._waiters.remove((loop, future))
            return self._event.is_set()
        return True
