"""The client shares no code with the server, so its records can drift from what the
gateway returns. Each client model is checked against the gateway schema it mirrors:
every field the client requires, the gateway sends, with the same optionality; and the
privacy-audit record agrees across all of its shapes (ledger record, protobuf message,
gateway reply, client model)."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from capc_client import models as client
from pydantic import BaseModel

from services.common.ledger import PrivacyAudit as LedgerPrivacyAudit
from services.gateway import schemas as gateway
from services.proto.capc.v1 import guardian_pb2

#: Client model -> the gateway schema it mirrors.
MIRRORS: dict[type[BaseModel], type[BaseModel]] = {
    client.Mechanism: gateway.MechanismOut,
    client.Job: gateway.JobOut,
    client.StudentModel: gateway.ModelOut,
    client.Loop: gateway.LoopOut,
    client.PartyLedger: gateway.PartyLedgerOut,
    client.Prediction: gateway.PredictOut,
    client.Training: gateway.TrainingOut,
    client.Party: gateway.PartyOut,
    client.Budget: gateway.BudgetOut,
    client.BudgetList: gateway.BudgetList,
    client.HistoryPoint: gateway.HistoryPoint,
    client.HistorySeries: gateway.HistorySeries,
    client.History: gateway.History,
    client.LedgerEntry: gateway.LedgerEntryOut,
    client.LedgerPage: gateway.LedgerPage,
    client.AuditEntry: gateway.AuditEntryOut,
    client.AuditHead: gateway.AuditHeadOut,
    client.PrivacyAudit: gateway.PrivacyAuditOut,
    client.Dispute: gateway.DisputeOut,
    client.AuditPage: gateway.AuditPage,
}


def _optional(annotation: object) -> bool:
    return type(None) in typing.get_args(annotation) or annotation is None


@pytest.mark.parametrize("mine", list(MIRRORS), ids=lambda m: m.__name__)
def test_every_field_the_client_needs_the_gateway_sends(mine: type[BaseModel]) -> None:
    theirs = MIRRORS[mine].model_fields
    for name, field in mine.model_fields.items():
        if not field.is_required():
            continue  # a newer client field with a default reads an older gateway
        assert name in theirs, f"{mine.__name__}.{name}: the gateway does not send it"
        # A field the gateway may send as null must be optional in the client.
        if _optional(theirs[name].annotation):
            assert _optional(field.annotation), f"{mine.__name__}.{name} may be null"


def test_every_client_model_of_a_gateway_reply_is_checked() -> None:
    models = {
        m
        for m in vars(client).values()
        if isinstance(m, type) and issubclass(m, BaseModel) and m.__module__ == client.__name__
    }
    models.discard(client._Model)
    assert models == set(MIRRORS)


def test_the_privacy_audit_record_agrees_in_all_its_shapes() -> None:
    ledger = {f.name: f.type for f in dataclasses.fields(LedgerPrivacyAudit)}
    proto = guardian_pb2.PrivacyAudit.DESCRIPTOR.fields_by_name
    reply = gateway.PrivacyAuditOut.model_fields
    mine = client.PrivacyAudit.model_fields
    assert set(ledger) == set(proto) == set(reply) == set(mine)
    for name in ledger:
        nullable = "None" in str(ledger[name])
        # A nullable value needs presence on the wire (proto3 `optional`), else an absent
        # value would arrive as 0.
        if nullable:
            assert proto[name].has_presence, name
        assert _optional(reply[name].annotation) == nullable, name
        assert _optional(mine[name].annotation) == nullable, name
