"""gRPC channel and server options for every capc service, and the --insecure-dev warning."""

from __future__ import annotations

from services.common.limits import MAX_MESSAGE_BYTES

# gRPC receives at most 4 MiB by default, far below a round's queries and shares.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # The server pings too: a stream whose peer is cut off (a partition, a host that
    # lost power) ends within 30 s instead of when TCP gives up.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
)
INSECURE_WARNING = (
    "--insecure-dev: plaintext gRPC without certificates. Never use this with real patient data."
)
