"""The CaPC loop's rule for one round: whose teachers it leaves out, and whether (and
how) the querier's own records may go to the answering hospitals in the clear.

Pure: the guardian reads the querier's binding from its ledger and the round request
from the wire, and asks :func:`loop_terms`; docs/privacy.md and
services/guardian/loop.py say why each refusal exists (a hospital's own teachers must
never vote on its own records, and records leave in the clear only by an explicit,
audited choice)."""

from __future__ import annotations

from dataclasses import dataclass

from capc.round.errors import RoundRequestError

#: Longest certificate or person name kept in an audit entry.
MAX_NAME = 128


@dataclass(frozen=True)
class Binding:
    """What the guardian's operator said of a querier: ``hospital`` it is bound to (None:
    not bound), or ``outside`` the consortium; ``refuse_unbound_clear``: the ledger's
    policy for clear queries of a querier no binding covers."""

    hospital: str | None = None
    outside: bool = False
    refuse_unbound_clear: bool = True


@dataclass(frozen=True)
class LoopAsk:
    """What a round request says: the ``hospital`` the querier claims ('' for none),
    whether its queries are records in the clear (uploaded tensors, not recipes or
    ciphertexts), whether it chose to reveal them, and who chose (a person's name)."""

    hospital: str = ""
    clear: bool = False
    reveal: bool = False
    revealed_by: str = ""


@dataclass(frozen=True)
class LoopTerms:
    """What the loop adds to one round: parties left out whatever the request says, and
    the audit detail of records sent in the clear (None: none were)."""

    left_out: frozenset[str]
    disclosure: dict[str, object] | None


def loop_terms(querier: str, binding: Binding, ask: LoopAsk, batch: int) -> LoopTerms:
    """The loop's terms for ``querier``'s round of ``batch`` queries; RoundRequestError
    when it claims a hospital it is not bound to, or its clear records would leave
    without an explicit, audited choice."""
    bound, outside, claim = binding.hospital, binding.outside, ask.hospital
    if claim and outside:
        raise RoundRequestError(
            f"querier {querier} says it belongs to hospital {claim}, but the guardian "
            "declared it a student from outside the consortium (--outside-querier); fix the "
            "student's --hospital, or have the operator bind it with --querier"
        )
    if claim and bound is None:
        raise RoundRequestError(
            f"querier {querier} says it belongs to hospital {claim}, but the guardian has "
            f"not bound it: the guardian operator must start it with --querier "
            f"{querier}={claim}, so that {claim}'s teachers are left out of its rounds"
        )
    if claim and claim != bound:
        raise RoundRequestError(
            f"querier {querier} says it belongs to hospital {claim}; the guardian bound it "
            f"to {bound}. Its rounds leave {bound} out; fix the student's --hospital"
        )
    if ask.clear and bound is not None and not ask.reveal:
        raise RoundRequestError(
            f"querier {querier} queries for hospital {bound}: its uploaded queries are "
            "that hospital's own records, and this round would show them to the "
            "answering hospitals in the clear. Send them only by an explicit, audited "
            "choice (reveal_records_to_answerers), or use an encrypted task "
            "(docs/encrypted.md) so they leave only as ciphertexts"
        )
    if ask.clear and bound is None and not outside and binding.refuse_unbound_clear:
        raise RoundRequestError(
            f"querier {querier} sends uploaded queries in the clear, but no binding covers "
            "it: they may be a hospital's own records, which its own teachers would vote on "
            "and every answering hospital would see. The guardian operator must say whose "
            f"they are: --querier {querier}=HOSPITAL (a hospital's own student, left out of "
            f"its rounds) or --outside-querier {querier} (a student from outside the "
            "consortium, its clear rounds audited). Recipe queries and encrypted tasks "
            "need neither"
        )
    disclosure: dict[str, object] | None = None
    if ask.clear and (ask.reveal or outside):
        disclosure = {"querier": querier, "hospital": bound or claim or None, "records": batch}
        if outside:
            disclosure["outside"] = True
        if ask.reveal and ask.revealed_by:
            # The person who chose, as the student party names them (the gateway's token
            # holder): the querier's certificate alone names a service, not a person.
            disclosure["revealed_by"] = ask.revealed_by[:MAX_NAME]
    return LoopTerms(frozenset() if bound is None else frozenset({bound}), disclosure)


__all__ = ["MAX_NAME", "Binding", "LoopAsk", "LoopTerms", "loop_terms"]
