"""The emulated-link pieces: link specs, and the relay's delay, loss and byte counts."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from services.testbed import netlab
from services.testbed.proxy import RETRANSMIT_S, LinkProxy


def test_link_specs_parse_and_bad_ones_are_named() -> None:
    assert netlab.parse_link("100mbit:20ms") == (100_000_000, 0.02)
    assert netlab.parse_link("1.5gbit:1s") == (1_500_000_000, 1.0)
    assert netlab.parse_link("64kbit") == (64_000, 0.0)
    with pytest.raises(ValueError, match="a rate is"):
        netlab.parse_link("fast:20ms")
    with pytest.raises(ValueError, match="a delay is"):
        netlab.parse_link("100mbit:soon")


def echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def round_trip(port: int, payload: bytes) -> float:
    with socket.create_connection(("127.0.0.1", port)) as c:
        start = time.perf_counter()
        c.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += c.recv(65536)
        assert got == payload
        return time.perf_counter() - start


def test_the_relay_delays_each_direction_and_counts_bytes() -> None:
    server, port = echo_server()
    with server, LinkProxy(("127.0.0.1", 0), ("127.0.0.1", port), delay=0.05) as relay:
        took = round_trip(relay.port, b"x" * 1000)
        assert took >= 0.1  # 50 ms each way
        time.sleep(0.05)
        assert relay.bytes_up == relay.bytes_down == 1000 and relay.bytes_total == 2000


def test_a_lost_chunk_costs_a_retransmission_and_order_is_kept() -> None:
    server, port = echo_server()
    with server, LinkProxy(("127.0.0.1", 0), ("127.0.0.1", port), loss=0.999, seed=1) as relay:
        assert round_trip(relay.port, bytes(range(256)) * 40) >= RETRANSMIT_S


def test_the_relay_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="probability"):
        LinkProxy(("127.0.0.1", 0), ("127.0.0.1", 1), loss=1.5)
    with pytest.raises(ValueError, match="delay"):
        LinkProxy(("127.0.0.1", 0), ("127.0.0.1", 1), delay=-1)
