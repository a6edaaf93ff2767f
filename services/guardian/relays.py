"""Encrypted-query mode: the frames a student and its rounds' parties send each other
through the guardian, sealed end to end (the guardian forwards them by round and
party and cannot read them)."""

from __future__ import annotations

import threading

from capc.round import GuardianCore, RoundView
from capc.round.errors import RoundInputError
from capc.task_config import TaskConfig
from services.common import protocol
from services.common.buffers import BoundedBuffer
from services.common.limits import MAX_RELAY_FRAME_BYTES, RELAY_BUFFER_FRAMES
from services.guardian.links import Links
from services.proto.capc.v1 import guardian_pb2


def _check_size(frame: guardian_pb2.RelayFrame) -> None:
    if len(frame.payload) > MAX_RELAY_FRAME_BYTES:
        raise RoundInputError(
            f"a relayed frame of {len(frame.payload)} bytes exceeds the limit of "
            f"{MAX_RELAY_FRAME_BYTES} (MAX_RELAY_FRAME_BYTES); send blobs in chunks"
        )


class Relays:
    """Each student session's Relay stream, and the routing of frames by the open rounds
    of ``core`` and the links of ``links``, under the engine's ``lock``."""

    def __init__(self, lock: threading.Lock, core: GuardianCore[TaskConfig], links: Links) -> None:
        self._lock = lock
        self._core = core
        self._links = links
        self._boxes: dict[tuple[str, bytes], BoundedBuffer[guardian_pb2.RelayFrame]] = {}

    def has(self, querier: str, session_id: bytes) -> bool:
        with self._lock:
            return (querier, session_id) in self._boxes

    def open(self, querier: str, session_id: bytes) -> BoundedBuffer[guardian_pb2.RelayFrame]:
        """The student's Relay stream opened: frames from its rounds' parties go here."""
        box: BoundedBuffer[guardian_pb2.RelayFrame] = BoundedBuffer(RELAY_BUFFER_FRAMES)
        with self._lock:
            old = self._boxes.get((querier, session_id))
            self._boxes[(querier, session_id)] = box
        if old is not None:
            old.close()
        return box

    def close(
        self, querier: str, session_id: bytes, box: BoundedBuffer[guardian_pb2.RelayFrame]
    ) -> None:
        """The Relay stream that opened ``box`` ended (a newer stream keeps its own)."""
        with self._lock:
            if self._boxes.get((querier, session_id)) is box:
                del self._boxes[(querier, session_id)]
        box.close()

    def _round(self, round_id: int, party: str) -> RoundView[TaskConfig]:
        with self._lock:
            rnd = self._core.view(round_id)
        left_out = rnd is not None and party in rnd.left_out
        if rnd is None or rnd.ciphertext_hash is None or party not in rnd.included or left_out:
            raise RoundInputError(
                f"round {round_id} is not an open encrypted round with {party or 'no party'}"
            )
        return rnd

    def to_party(
        self, querier: str, session_id: bytes, frame: guardian_pb2.RelayFrame
    ) -> tuple[BoundedBuffer[guardian_pb2.HubMessage], guardian_pb2.HubMessage]:
        """A student's frame for one party of one of its rounds: where it goes and what.

        The caller puts it there, waiting for room: the student is held back while
        the party reads slowly, and nothing piles up in the guardian.
        """
        _check_size(frame)
        rnd = self._round(frame.round_id, frame.party)
        if (rnd.querier, rnd.session_id) != (querier, session_id):
            raise RoundInputError(f"round {frame.round_id} belongs to another student session")
        if frame.hello:
            raise RoundInputError("only answering parties send hellos")
        link = self._links.get(frame.party)
        if link is None:
            raise RoundInputError(f"{frame.party} is not connected")
        return link.outbox, guardian_pb2.HubMessage(
            header=protocol.header(rnd.task.name, rnd.task.config_hash),
            relay=guardian_pb2.RelayFrame(round_id=frame.round_id, payload=frame.payload),
        )

    def to_student(
        self, party: str, frame: guardian_pb2.RelayFrame
    ) -> tuple[BoundedBuffer[guardian_pb2.RelayFrame], guardian_pb2.RelayFrame]:
        """A party's frame for the student of its round, naming the party: where it goes
        and what (the caller puts it there, waiting for room)."""
        _check_size(frame)
        rnd = self._round(frame.round_id, party)
        with self._lock:
            box = self._boxes.get((rnd.querier, rnd.session_id))
        if box is None:
            raise RoundInputError(f"the student of round {frame.round_id} closed its relay")
        return box, guardian_pb2.RelayFrame(
            header=protocol.header(rnd.task.name, rnd.task.config_hash),
            round_id=frame.round_id,
            party=party,
            payload=frame.payload,
            hello=frame.hello,
        )


__all__ = ["Relays"]
