"""The committed gRPC code is exactly what the .proto files generate."""

from __future__ import annotations

from services.proto import generate


def test_generated_code_matches_the_protos() -> None:
    drifted = generate.drift()
    assert drifted == [], f"regenerate with `python -m services.proto.generate`: {drifted}"


def test_every_message_has_a_header_where_the_issue_demands_it() -> None:
    from google.protobuf.message import Message

    from services.proto.capc.v1 import guardian_pb2, student_pb2

    requests: list[type[Message]] = [
        guardian_pb2.PartyMessage,
        guardian_pb2.HubMessage,
        guardian_pb2.OpenRoundRequest,
        guardian_pb2.MpcFrame,
        guardian_pb2.ListPartiesRequest,
        guardian_pb2.ListLedgerRequest,
        guardian_pb2.ListAuditRequest,
        guardian_pb2.BudgetHistoryRequest,
        student_pb2.CreateJobRequest,
        student_pb2.WatchJobRequest,
        student_pb2.GetResultsRequest,
    ]
    for msg in requests:
        assert "header" in msg.DESCRIPTOR.fields_by_name, msg.DESCRIPTOR.full_name
