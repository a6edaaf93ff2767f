"""The same 2PC code over a real mutual-TLS gRPC stream: garbler in the server, evaluator in the client."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np

from capc.mechanisms import from_config
from capc.mpc.mechanism_circuits import ConfidentGNMaxCircuit, round_noise
from capc.mpc.session import EvaluatorSession, GarblerSession
from services.common import pki, tls
from services.common.mpc_stream import StreamChannel
from services.common.protocol import PROTOCOL_VERSION
from services.guardian.hub import POLICY
from services.proto.capc.v1 import common_pb2, guardian_pb2, guardian_pb2_grpc

B, K, N = 256, 10, 20
SPEC = ConfidentGNMaxCircuit(K, N, sigma=4.0, threshold=16.0, sigma1=12.0)
#: The mechanism whose circuit SPEC is: its plaintext is the reference.
MECH = from_config({"name": "confident-gnmax", "sigma": 4.0, "threshold": 16.0, "sigma1": 12.0}, K)
HEADER = common_pb2.Header(protocol_version=PROTOCOL_VERSION, task="test")
SESSION = b"s" * 16


def problem() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    hist = MECH.summed_votes(rng.integers(0, 3, (B, N))).astype(np.uint64)
    student = rng.integers(0, 2**64 - 1, (B, K), dtype=np.uint64, endpoint=True)
    eta1 = np.clip(rng.normal(0, SPEC.sigma1, B), -8 * SPEC.sigma1, 8 * SPEC.sigma1)
    eta2 = np.clip(rng.normal(0, SPEC.sigma, (B, K)), -8 * SPEC.sigma, 8 * SPEC.sigma)
    return hist, student, hist - student, eta1, eta2


class Garbling(guardian_pb2_grpc.GuardianHubServicer):
    def __init__(self) -> None:
        self.answered: np.ndarray | None = None

    def Compute(  # noqa: N802 - the method name the .proto gives
        self, request_iterator: Iterator[guardian_pb2.MpcFrame], context: grpc.ServicerContext
    ) -> Iterator[guardian_pb2.MpcFrame]:
        _, _, guardian, eta1, eta2 = problem()
        chan = StreamChannel(HEADER)
        chan.attach(request_iterator)
        session = GarblerSession(chan, SESSION, timeout=60)

        def work() -> None:
            try:
                session.setup()
                out = session.run_round(
                    1, SPEC.circuit(), SPEC.garbler_inputs(guardian, eta2, eta1), B
                )
                self.answered = out["answered"][:, 0]
            finally:
                chan.close()

        threading.Thread(target=work, daemon=True).start()
        yield from chan.outgoing()


def test_confident_gnmax_over_mutual_tls(tmp_path: Path) -> None:
    pki.init_ca(tmp_path, dev=True)
    pki.issue(tmp_path, "guardian", "guardian", dev=True)
    pki.issue(tmp_path, "student", "student", dev=True)
    servicer = Garbling()
    server = grpc.server(
        futures.ThreadPoolExecutor(4),
        interceptors=[tls.RoleInterceptor(POLICY)],
        options=list(tls.SERVER_OPTIONS),
    )
    guardian_pb2_grpc.add_GuardianHubServicer_to_server(servicer, server)
    port = server.add_secure_port(
        "127.0.0.1:0", tls.server_credentials(tls.TLSFiles.in_dir(tmp_path, "guardian"))
    )
    server.start()
    try:
        hist, student, _, eta1, eta2 = problem()
        stub = guardian_pb2_grpc.GuardianHubStub(
            tls.secure_channel(
                f"127.0.0.1:{port}",
                tls.TLSFiles.in_dir(tmp_path, "student"),
                "localhost",
                role="guardian",
            )
        )
        chan = StreamChannel(HEADER)
        responses = stub.Compute(chan.outgoing(), timeout=120)
        chan.attach(responses)
        session = EvaluatorSession(chan, SESSION, timeout=60)
        session.setup()
        out = session.run_round(1, SPEC.circuit(), SPEC.evaluator_inputs(student), B)
        chan.close()
        labels, answered = MECH.decide(
            hist.astype(np.float64), {"eta1": round_noise(eta1), "eta2": round_noise(eta2)}
        )
        np.testing.assert_array_equal(SPEC.decode(out), labels)
        assert 0 < answered.sum() < B
        for _ in range(100):
            if servicer.answered is not None:
                break
            time.sleep(0.05)
        assert servicer.answered is not None
        np.testing.assert_array_equal(servicer.answered.astype(bool), answered)
    finally:
        server.stop(1).wait()
