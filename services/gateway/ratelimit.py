"""Admission limits for the gateway: a token bucket in memory for each token (or, for
the open /healthz, each client address), and one memory budget for every request body
held at once.

A bucket holds up to ``per_minute`` requests and refills at ``per_minute`` a minute, so
a token may burst a minute's worth and then goes at the steady rate. Buckets are keyed
by verified token ids, so a forged token cannot drain someone else's, and their number
is bounded by the tokens an admin created; full buckets are dropped now and then, as a
full bucket and no bucket behave alike.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: Buckets kept before the full ones are swept out.
_SWEEP_AT = 1024


class TokenBuckets:
    """``take(key)``: 0.0 when a request may go ahead (it is counted), else the seconds
    until one may (it is not counted)."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute < 1:
            raise ValueError(f"a rate limit is at least 1 request a minute, got {per_minute}")
        self.per_minute = per_minute
        self._capacity = float(per_minute)
        self._per_second = per_minute / 60.0
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        with self._lock:
            now = self._clock()
            level, at = self._buckets.get(key, (self._capacity, now))
            level = min(self._capacity, level + (now - at) * self._per_second)
            if level >= 1.0:
                self._buckets[key] = (level - 1.0, now)
                wait = 0.0
            else:
                self._buckets[key] = (level, now)
                wait = (1.0 - level) / self._per_second
            if len(self._buckets) > _SWEEP_AT:
                self._sweep(now)
            return wait

    def _sweep(self, now: float) -> None:
        for key, (level, at) in list(self._buckets.items()):
            if level + (now - at) * self._per_second >= self._capacity:
                del self._buckets[key]


class MemoryBudget:
    """Bytes every request in flight may hold together: ``take(n)`` reserves ``n`` bytes
    if they fit (True) or reserves nothing (False); ``give(n)`` returns them. Shared by
    all requests, so concurrent uploads are bounded by their sum, not one by one."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a memory budget is at least 1 byte, got {limit}")
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Bytes reserved now."""
        return self._held

    def take(self, n: int) -> bool:
        if n < 0:
            raise ValueError(f"cannot reserve {n} bytes")
        with self._lock:
            if self._held + n > self.limit:
                return False
            self._held += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            if n < 0 or n > self._held:
                raise ValueError(f"returning {n} bytes, but {self._held} are held")
            self._held -= n
