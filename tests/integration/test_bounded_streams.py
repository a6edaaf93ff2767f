"""The guardian holds a bounded amount for any peer: a party that stops reading is left
out rather than buffered for, and oversized relayed frames are refused."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.mpc.validity import VoteRelation
from capc.mpc.votes import one_hot_votes, share_proven_votes
from capc.round.errors import RoundInputError
from capc.task_config import config_hash
from services.common import serde
from services.common.limits import MAX_RELAY_FRAME_BYTES, PARTY_OUTBOX_MESSAGES
from services.guardian.rounds import RoundEngine
from services.proto.capc.v1 import common_pb2, guardian_pb2
from tests.hub_messages import next_work

TASK = {
    "num_classes": 3,
    "input_shape": [2],
    "mechanism": {"name": "gnmax", "sigma": 5.0},
    "quorum": 2,
}


#: What the engine fixture (tests/integration/conftest.py) puts in its ledger.
ENGINE_TASKS = {"t": TASK}
ENGINE_PARTIES = dict.fromkeys(("a", "b", "c"), 100.0)


def test_a_party_that_stops_reading_is_left_out_not_buffered_for(engine: RoundEngine) -> None:
    links = {p: engine.attach(p) for p in ("a", "b", "c")}
    stale = guardian_pb2.HubMessage(cancelled=guardian_pb2.RoundCancelled(round_id=0))
    for _ in range(PARTY_OUTBOX_MESSAGES):
        links["a"].outbox.put_nowait(stale)  # a reads nothing any more
    key = X25519PrivateKey.generate().public_key().public_bytes_raw()
    x = np.zeros((4, 2), dtype="<f4")
    request = guardian_pb2.OpenRoundRequest(
        header=common_pb2.Header(protocol_version=2, task="t", config_hash=config_hash(TASK)),
        round_key="k",
        queries=common_pb2.QueryBatch(
            tensor=common_pb2.Tensor(shape=[4, 2], dtype="float32", data=x.tobytes())
        ),
        student_public_key=key,
    )
    box: dict[str, guardian_pb2.OpenRoundReply] = {}
    opener = threading.Thread(
        target=lambda: box.update(reply=engine.open_round("student", request, b"s" * 16))
    )
    opener.start()
    for p in ("b", "c"):
        msg = next_work(links[p].outbox)
        assert msg is not None
        rid = msg.work.round_id
        votes = one_hot_votes(np.zeros(4, dtype=np.int64), 3).astype(np.int64)
        bits, proof, sealed = share_proven_votes(VoteRelation(3, 1), votes, None, key, rid, p)
        engine.receive_shares(p, serde.shares_to_proto(rid, bits, sealed_seed=sealed, proof=proof))
    opener.join(timeout=10)
    # Without waiting for the share timeout: a was left out when its work found no room.
    assert list(box["reply"].included) == ["b", "c"]
    assert links["a"].outbox.qsize() == PARTY_OUTBOX_MESSAGES


def test_an_oversized_relayed_frame_is_refused_before_it_is_routed(engine: RoundEngine) -> None:
    big = guardian_pb2.RelayFrame(round_id=1, party="a", payload=bytes(MAX_RELAY_FRAME_BYTES + 1))
    with pytest.raises(RoundInputError, match="MAX_RELAY_FRAME_BYTES"):
        engine.relay_to_student("a", big)
    with pytest.raises(RoundInputError, match="MAX_RELAY_FRAME_BYTES"):
        engine.relay_to_party("student", b"s" * 16, big)
