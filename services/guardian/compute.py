"""The guardian's 2PC: each student session's rounds ready for their garbled circuit, and
the garbler that runs them over the session (:meth:`RoundEngine.serve_compute`)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from capc.mpc.channel import Channel
from capc.mpc.session import GarblerSession

if TYPE_CHECKING:
    from services.guardian.rounds import RoundEngine

log = logging.getLogger("capc.guardian.rounds")


class GarbleQueue:
    """Rounds ready for their 2PC per (querier, session id), run in the order they got ready."""

    def __init__(self, engine: RoundEngine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, bytes], queue.Queue[int]] = {}

    def _queue(self, querier: str, session_id: bytes) -> queue.Queue[int]:
        with self._lock:
            return self._queues.setdefault((querier, session_id), queue.Queue())

    def ready(self, querier: str, session_id: bytes, round_id: int) -> None:
        """Round ``round_id`` of this student session waits for its 2PC."""
        self._queue(querier, session_id).put(round_id)

    def serve(
        self,
        querier: str,
        channel: Channel,
        session_id: bytes,
        ended: Callable[[], bool],
        idle_timeout: float,
    ) -> int:
        """Garble every round of this session as it gets ready; returns rounds done, when
        the student ends its stream (``ended``) or stays idle for ``idle_timeout`` s."""
        session = GarblerSession(channel, session_id, timeout=self._engine.share_timeout + 60)
        session.setup()
        ready = self._queue(querier, session_id)
        done = 0
        farewell: str | None = None
        idle_since = time.monotonic()
        try:
            while True:
                try:
                    round_id = ready.get(timeout=0.25)
                except queue.Empty:
                    if ended():
                        # Rounds awaiting their vote check end with the student's reason.
                        farewell = session.parting_words()
                        return done
                    if time.monotonic() - idle_since > idle_timeout:
                        return done
                    continue
                self._compute(session, round_id)
                done += 1
                idle_since = time.monotonic()
        except Exception as err:
            session.abort(str(err))
            raise
        finally:
            self._end(querier, session_id, farewell)

    def _compute(self, session: GarblerSession, round_id: int) -> None:
        """Garble one round: the ledger marks it released right before the first garbled
        input leaves; a 2PC that breaks settles it at once."""
        engine = self._engine
        with engine.step() as core:
            rnd = core.to_compute(round_id)
            # The core's source serves every session and open(): its draws are taken
            # under the engine's lock, each round's noise its own.
            noise = core.draw_noise(rnd)

        def release() -> None:
            with engine.step() as core:
                core.release(round_id)

        start = time.perf_counter()
        try:
            spec, inputs = engine.core.garbler_inputs(rnd, noise)
            out = session.run_round(round_id, spec.circuit(), inputs, rnd.batch, on_release=release)
            with engine.step() as core:
                done = core.computed(round_id, spec, out)
        except BaseException as err:
            with engine.step() as core:
                core.settle(round_id, f"the 2PC broke: {err}")
            raise
        log.info(
            "round %d: %d of %d answered by %d parties in %.2f s",
            round_id,
            done.answered,
            done.batch,
            len(done.parties),
            time.perf_counter() - start,
        )

    def _end(self, querier: str, session_id: bytes, farewell: str | None) -> None:
        """The session ended: rounds still waiting for it can never run, so settle them
        now; ``farewell``: the reason the student gave, if it aborted the session."""
        with self._lock:
            ready = self._queues.pop((querier, session_id), None)
        with self._engine.step() as core:
            core.end_session(querier, session_id, farewell or "the student's 2PC session ended")
            while ready is not None and not ready.empty():
                why = "the student's 2PC session ended before the round was computed"
                core.settle(ready.get_nowait(), why)


__all__ = ["GarbleQueue"]
