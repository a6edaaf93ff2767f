"""A deviating hospital for the availability tests (the light consortium is services.testbed.light)."""

from __future__ import annotations

import queue
import secrets
import threading

import grpc
import numpy as np

from capc.mpc.sealing import OVERHEAD
from services.common import protocol, serde
from services.proto.capc.v1 import guardian_pb2
from services.testbed.light import LightConsortium


class DeviatingParty:
    """An answering party that speaks the protocol over its own certificate but sends
    sealed seeds that open for nobody (random bytes of the right length)."""

    def __init__(self, c: LightConsortium, name: str) -> None:
        self.rounds: list[int] = []
        self._out: queue.Queue[guardian_pb2.PartyMessage | None] = queue.Queue()
        # A stream opens with the party's Register: one teacher, the cap it sets itself.
        self._out.put(
            guardian_pb2.PartyMessage(
                header=protocol.header(),
                register=guardian_pb2.Register(
                    teachers=[guardian_pb2.TeacherInfo(architecture="mlp")], epsilon_cap=c.cap
                ),
            )
        )
        self._responses = c.stub(name).Connect(iter(self._out.get, None))
        first = next(self._responses)
        if first.WhichOneof("body") != "registered":
            raise RuntimeError(f"{name} was not registered: {first}")
        width = c.task_config.vote_width

        def answer() -> None:
            try:
                for msg in self._responses:
                    if msg.WhichOneof("body") != "work":
                        continue
                    batch = msg.work.queries.tensor.shape[0]
                    share = np.zeros((batch, width), dtype=np.uint64)
                    self._out.put(
                        guardian_pb2.PartyMessage(
                            header=protocol.header(msg.header.task),
                            shares=serde.shares_to_proto(
                                msg.work.round_id,
                                share,
                                sealed_seed=secrets.token_bytes(OVERHEAD + 16),
                            ),
                        )
                    )
                    self.rounds.append(msg.work.round_id)
            except grpc.RpcError:
                pass

        threading.Thread(target=answer, daemon=True).start()

    def leave(self) -> None:
        self._out.put(None)
        self._responses.cancel()
