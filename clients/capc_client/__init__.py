"""A typed client for the capc gateway's REST API, and the ``capcctl`` command.

It depends on httpx and pydantic only, so analysts install it without torch::

    from capc_client import Client
    client = Client("https://gateway.example", token="capc_...")
    job = client.submit_recipe("mix", count=1024)
    job = client.wait(job.id)
"""

from capc_client.models import (
    AuditPage,
    Budget,
    BudgetList,
    Dispute,
    History,
    Job,
    LedgerPage,
    Party,
    PartyLedger,
    StudentModel,
)
from capc_client.sdk import ApiError, Client

__all__ = [
    "ApiError",
    "AuditPage",
    "Budget",
    "BudgetList",
    "Client",
    "Dispute",
    "History",
    "Job",
    "LedgerPage",
    "Party",
    "PartyLedger",
    "StudentModel",
]
