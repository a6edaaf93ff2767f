"""What the guardian's round engine puts on a party's stream, read as the party reads it."""

from __future__ import annotations

from services.common.buffers import BoundedBuffer
from services.proto.capc.v1 import guardian_pb2


def next_work(
    outbox: BoundedBuffer[guardian_pb2.HubMessage], timeout: float = 5.0
) -> guardian_pb2.HubMessage:
    """The next work on a party's ``outbox``: a task's definition, sent on the stream before
    the first work naming the task, and settlements of earlier rounds are passed over."""
    while True:
        msg = outbox.get(timeout=timeout)
        if msg is None:
            raise AssertionError("the stream ended before any work")
        if msg.HasField("work"):
            return msg
