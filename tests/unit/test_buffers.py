"""The bounded buffer between threads and coroutines: it never holds more than its capacity."""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import pytest

from services.common.buffers import BoundedBuffer


def test_a_full_buffer_refuses_or_waits_and_never_grows() -> None:
    buf: BoundedBuffer[int] = BoundedBuffer(2)
    buf.put(1)
    buf.put_nowait(2)
    with pytest.raises(queue.Full):
        buf.put_nowait(3)
    with pytest.raises(queue.Full):
        buf.put(3, timeout=0.05)
    assert buf.qsize() == 2
    # A waiting producer gets in as soon as a consumer makes room.
    threading.Timer(0.1, buf.get).start()
    buf.put(3, timeout=5)
    assert [buf.get(), buf.get()] == [2, 3]
    with pytest.raises(queue.Empty):
        buf.get(timeout=0.05)


def test_finish_drains_then_ends_and_close_ends_at_once() -> None:
    buf: BoundedBuffer[str] = BoundedBuffer(4)
    buf.put("a")
    buf.put("b")
    buf.finish()
    buf.put("dropped")
    assert [buf.get(), buf.get(), buf.get(), buf.get()] == ["a", "b", None, None]
    other: BoundedBuffer[str] = BoundedBuffer(1)
    other.put("x")
    blocked: list[BaseException] = []

    def producer() -> None:
        try:
            other.put("y")  # waits for room ...
        except BaseException as err:
            blocked.append(err)

    t = threading.Thread(target=producer)
    t.start()
    time.sleep(0.05)
    other.close()  # ... and is released, its item dropped, when the buffer closes
    t.join(timeout=5)
    assert not t.is_alive() and not blocked
    assert other.get() is None and other.closed


def test_coroutines_wait_without_a_thread_and_meet_threads() -> None:
    buf: BoundedBuffer[int] = BoundedBuffer(1)

    async def main() -> list[int | None]:
        got: list[int | None] = []

        async def consumer() -> None:
            while True:
                item = await buf.aget()
                got.append(item)
                if item is None:
                    return

        task = asyncio.create_task(consumer())

        # A thread produces into the coroutine, waiting for room each time.
        def produce() -> None:
            for i in range(5):
                buf.put(i)

        producer = threading.Thread(target=produce)
        producer.start()
        await asyncio.to_thread(producer.join)
        await buf.aput(5)
        buf.finish()
        await asyncio.wait_for(task, 5)
        return got

    assert asyncio.run(main()) == [0, 1, 2, 3, 4, 5, None]


def test_a_cancelled_waiter_leaves_the_buffer_usable() -> None:
    buf: BoundedBuffer[int] = BoundedBuffer(1)

    async def main() -> int | None:
        waiter = asyncio.create_task(buf.aget())
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        buf.put(7)
        return await asyncio.wait_for(buf.aget(), 5)

    assert asyncio.run(main()) == 7


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least one"):
        BoundedBuffer(0)
