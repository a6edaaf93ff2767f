"""The guardian's side of the answering parties' own budgets.

Each hospital keeps its own ledger and is the authority on its own cap
(:mod:`services.answerer.budget`). Here the guardian:

- takes the cap a party declares on connecting and never holds a larger one
  for it (:func:`declare`);
- tells the party its own ledger's accounting, audit key and signed audit
  head (:func:`registered`);
- tells the party how each round it voted in ended (:func:`settlement`): from
  the round's answered mask the party computes its own charge, with the same
  mechanism and accountant;
- keeps the party's reports of its own ledger and sets them beside its own
  (:func:`compare`), so that the admin view shows both and flags a divergence.
"""

from __future__ import annotations

import logging
import math
import queue
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from capc.round.settlement import outcome
from capc.round.settlement import settlement as rule
from capc.round.training import GUARDIAN_FIX, Attestation, TrainingCharge
from services.common import protocol, serde
from services.common.buffers import BoundedBuffer
from services.common.ledger import Ledger, PartyBudget
from services.common.ledger.audit import AuditHead
from services.common.protocol import RequestError
from services.guardian.ledger_port import SqlRoundLedger
from services.proto.capc.v1 import guardian_pb2

log = logging.getLogger("capc.guardian.budgets")

#: Relative tolerance within which two ledgers agree (float rounding is ~1e-15).
AGREE_RTOL = 1e-9


def declare(ledger: Ledger, name: str, register: guardian_pb2.Register) -> float:
    """Take the cap party ``name`` declares in its Register; returns the cap the guardian
    now enforces for it (never larger). RequestError when it declares none."""
    cap = register.epsilon_cap
    if not (math.isfinite(cap) and cap > 0):
        raise RequestError(
            f"{name} declared no epsilon cap (got {cap}); every answering party sets its own "
            "cap: start it with `capc answerer --epsilon-cap EPS`"
        )
    # The reason is the hospital's own word, kept with its authenticated declaration.
    return ledger.declare_cap(name, cap, actor=name, reason=register.cap_reason or None)


def attest(ledger: Ledger, name: str, register: guardian_pb2.Register) -> Attestation | None:
    """Charge the DP-SGD training party ``name`` attests in its Register, once per digest
    (audited with its record); the attestation, None when it attests none. RequestError
    when it is malformed, TrainingRefusedError past the party's cap here."""
    if not register.HasField("dp_training"):
        return None
    attested = serde.attestation_from_proto(register.dp_training)
    charge: TrainingCharge = ledger.charge_training(name, attested, actor=name, fix=GUARDIAN_FIX)
    if charge.charged:
        log.info(
            "%s: DP-SGD training charged %.4g eps (%s)", name, charge.epsilon, attested.describe()
        )
    return attested


def registered(ledger: Ledger, name: str) -> guardian_pb2.Registered:
    """The reply to a party's Register."""
    key = ledger.audit_key()
    return serde.registered_to_proto(
        name,
        ledger.budget(name).cap,
        ledger.accounting_json(),
        None if key is None else key[0],
        ledger.audit_head(),
    )


def settlements(
    ledger: Ledger, round_id: int, names: Iterable[str], head: AuditHead | None = None
) -> dict[str, guardian_pb2.RoundSettled]:
    """How round ``round_id`` ended for each of ``names`` (:func:`capc.round.settlement.settlement`)
    that it has ended for, shown with ``head`` (the ledger's current audit head unless
    given, read only when one has ended): one read of the round for all of them, of one
    party's row when there is one name (a heartbeat asking about a round of hundreds)."""
    names = list(names)
    only = names[0] if len(names) == 1 else None
    record = SqlRoundLedger(ledger).round_record(round_id, only)
    if record is None:
        return {}
    ended = [(name, s) for name in names if (s := rule(record, name)) is not None]
    if not ended:
        return {}
    shown = serde.audit_head_to_proto(ledger.audit_head() if head is None else head)
    return {name: serde.settlement_to_proto(s, shown) for name, s in ended}


def settlement_of(
    ledger: Ledger, name: str, round_id: int, head: AuditHead | None = None
) -> guardian_pb2.RoundSettled | None:
    """How round ``round_id`` ended for ``name`` (see :func:`settlements`); None while it
    is open or unknown here."""
    return settlements(ledger, round_id, [name], head).get(name)


def deliver(
    outbox: BoundedBuffer[guardian_pb2.HubMessage], settled: guardian_pb2.RoundSettled
) -> bool:
    """Put ``settled`` in a party's ``outbox``; False when the outbox is full."""
    try:
        outbox.put_nowait(guardian_pb2.HubMessage(header=protocol.header(), settled=settled))
    except queue.Full:
        # A party that reads nothing is told later: its heartbeats name the rounds
        # its ledger still holds open, and each is settled again then.
        return False
    return True


def send_settlements(
    ledger: Ledger,
    name: str,
    outbox: BoundedBuffer[guardian_pb2.HubMessage],
    round_ids: list[int],
) -> int:
    """Put in party ``name``'s ``outbox`` the settlement of each of ``round_ids`` that has ended
    for it (rounds still open, or unknown here, get none); returns how many were sent."""
    sent = 0
    head: AuditHead | None = None  # one read for every round a heartbeat names, if any ended
    for round_id in round_ids:
        record = SqlRoundLedger(ledger).round_record(round_id, name)
        ended = rule(record, name)
        if ended is None:
            continue
        head = ledger.audit_head() if head is None else head
        settled = serde.settlement_to_proto(ended, serde.audit_head_to_proto(head))
        if not deliver(outbox, settled):
            break
        sent += 1
    return sent


def store_report(ledger: Ledger, name: str, report: guardian_pb2.SpendReport) -> None:
    """Keep a party's report of its own ledger; RequestError if it is malformed."""
    ledger.store_report(name, serde.spend_report_from_proto(report))


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


@dataclass(frozen=True)
class Comparison:
    """A party's own ledger beside the guardian's, over the rounds both have settled."""

    state: str
    party_spent: float = 0.0
    through: int = 0
    open_rounds: int = 0
    reported_at: str = ""
    #: The guardian's epsilon minus the party's, through ``through``.
    gap: float = 0.0


def compare(ledger: Ledger, budget: PartyBudget) -> Comparison:
    """ "agree", "diverged", "incomparable" (another accountant or delta) or "unreported"."""
    report = budget.report
    if report is None:
        return Comparison("unreported")
    through = int(_number(report.get("through")))
    seen = Comparison(
        "incomparable",
        _number(report.get("epsilon_spent")),
        through,
        int(_number(report.get("open_rounds"))),
        str(report.get("received_at", "")),
    )
    settled = report.get("settled")
    theirs = np.asarray(settled if isinstance(settled, list) else [], dtype=np.float64)
    if report.get("accounting") != ledger.accounting_json() or theirs.shape != (
        ledger.accounting.size,
    ):
        return seen
    mine = ledger.settled_loss(budget.name, through)
    acct, delta = ledger.accounting, ledger.delta
    gap = acct.spent(mine, delta).epsilon - acct.spent(theirs, delta).epsilon
    agree = bool(np.allclose(mine, theirs, rtol=AGREE_RTOL, atol=1e-12))
    return Comparison(
        "agree" if agree else "diverged",
        seen.party_spent,
        through,
        seen.open_rounds,
        seen.reported_at,
        gap,
    )


__all__ = [
    "Comparison",
    "attest",
    "compare",
    "declare",
    "outcome",
    "registered",
    "send_settlements",
    "settlement_of",
    "store_report",
]
