"""The light client reads every field the gateway's party and budget replies carry.

The client's models (``capc_client.models``) are written apart from the gateway's
schemas, with no import between them; a field the gateway adds (e.g. a party's DP-SGD
trainings, charged once) and the client does not declare would reach ``capcctl`` only
as an untyped extra. This compares the two by name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from services.gateway import schemas

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients"))
from capc_client import models

PAIRS: list[tuple[type[BaseModel], type[BaseModel]]] = [
    (schemas.PartyOut, models.Party),
    (schemas.BudgetOut, models.Budget),
    (schemas.TrainingOut, models.Training),
    (schemas.PartyLedgerOut, models.PartyLedger),
]


@pytest.mark.parametrize(("gateway", "client"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_the_client_declares_every_field_the_gateway_sends(
    gateway: type[BaseModel], client: type[BaseModel]
) -> None:
    missing = sorted(set(gateway.model_fields) - set(client.model_fields))
    assert missing == [], f"capc_client.models.{client.__name__} lacks {missing}"


def test_the_check_can_fail() -> None:
    class Narrow(BaseModel):
        name: str

    assert set(schemas.TrainingOut.model_fields) - set(Narrow.model_fields)
