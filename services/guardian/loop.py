"""The CaPC loop at the guardian: which hospital each querier belongs to, enforced.

A hospital that queries the consortium about its own records runs a student party
under a querier certificate of its own (e.g. ``hospital-0-querier``). Its own
teachers must never vote on those queries, and that must not rest on the querier's
word: the guardian operator binds the certificate to its hospital (``capc guardian
--querier hospital-0-querier=hospital-0``), the binding is kept in the ledger
(audited, surviving restarts), and every round of that querier leaves the hospital
out whatever the request says. A querier that claims another hospital, or claims one
without a binding, is refused.

A bound querier's plain tensor queries are its hospital's own records: the answering
hospitals see them in the clear. Such a round must say so (``reveal_records``), and
the guardian writes that the querier sent N of its own records in the clear in round R
to the signed audit log, in the round's reservation transaction.

A querier that claims no hospital cannot be told from a hospital's own querier that
keeps quiet (its hospital would then vote on its own records, shown to everyone in
the clear, unaudited). So a querier's uploaded (clear) queries need a binding that
covers them: ``--querier QUERIER=HOSPITAL``, or ``--outside-querier QUERIER`` (a
student from outside the consortium, whose clear rounds are audited too). Without
one they are refused under the ledger's policy ``refuse``, the default of every new
ledger; ledgers made before the policy existed keep ``allow`` until the operator
says otherwise (``--clear-records-from-unbound``). Recipes (synthetic queries) and
ciphertexts are no records in the clear and need no binding.
"""

from __future__ import annotations

from capc.round.loop import MAX_NAME, Binding, LoopAsk, LoopTerms, loop_terms
from services.common.ledger import Ledger
from services.proto.capc.v1 import guardian_pb2

#: Ledger setting under which a querier's hospital is kept.
QUERIER_KEY = "querier-hospital:"
#: What :data:`QUERIER_KEY` holds for a querier declared outside the consortium.
OUTSIDE = "(outside the consortium)"
#: Ledger setting: what becomes of clear queries from a querier no binding covers.
CLEAR_POLICY_KEY = "clear-records-from-unbound"
#: The policies :data:`CLEAR_POLICY_KEY` may hold.
REFUSE, ALLOW = "refuse", "allow"


def parse_querier(item: str) -> tuple[str, str]:
    """``QUERIER=HOSPITAL`` -> (querier certificate name, hospital party name).

    ValueError saying what to write."""
    querier, eq, hospital = item.partition("=")
    ok = eq and 1 <= len(querier) <= MAX_NAME and 1 <= len(hospital) <= MAX_NAME
    if not ok:
        raise ValueError(
            f"--querier expects QUERIER=HOSPITAL, got {item!r}; e.g. "
            "--querier hospital-0-querier=hospital-0"
        )
    if querier == hospital:
        raise ValueError(f"--querier {item}: a querier certificate is not its hospital's own")
    if querier.strip() != querier or hospital.strip() != hospital:
        raise ValueError(f"--querier {item!r}: names carry no leading or trailing spaces")
    return querier, hospital


def bind_querier(ledger: Ledger, querier: str, hospital: str, *, actor: str) -> None:
    """Keep ``querier`` -> ``hospital`` in the ledger (audited when it changes).

    ValueError unless ``hospital`` is a registered answering party: a binding to a name
    no party has would leave nobody out, and the hospital would vote on its own queries."""
    answerers = sorted(b.name for b in ledger.budgets() if b.role == "answerer")
    if hospital not in answerers:
        raise ValueError(
            f"--querier {querier}={hospital}: {hospital!r} is no registered answering party "
            f"(registered: {', '.join(answerers) or 'none'}); register it first "
            f"(--register {hospital}=EPS:TEACHERS), spelled exactly as its certificate"
        )
    ledger.keep_setting(
        QUERIER_KEY + querier,
        hospital,
        actor=actor,
        action="bind_querier",
        detail={"querier": querier, "hospital": hospital},
    )


def declare_outside(ledger: Ledger, querier: str, *, actor: str) -> None:
    """Keep ``querier`` as a student from outside the consortium (audited when it
    changes): its clear queries are allowed, each round of them audited."""
    if not 1 <= len(querier) <= MAX_NAME or querier.strip() != querier:
        raise ValueError(f"--outside-querier {querier!r}: a certificate name, no spaces around")
    if querier in {b.name for b in ledger.budgets() if b.role == "answerer"}:
        raise ValueError(
            f"--outside-querier {querier}: {querier!r} is a registered answering party, not "
            "a student"
        )
    ledger.keep_setting(
        QUERIER_KEY + querier,
        OUTSIDE,
        actor=actor,
        action="declare_outside_querier",
        detail={"querier": querier},
    )


def hospital_of(ledger: Ledger, querier: str) -> str | None:
    """The hospital the guardian bound ``querier`` to, or None."""
    bound = ledger.setting(QUERIER_KEY + querier)
    return None if bound == OUTSIDE else bound


def is_outside(ledger: Ledger, querier: str) -> bool:
    """Whether the operator declared ``querier`` a student from outside the consortium."""
    return ledger.setting(QUERIER_KEY + querier) == OUTSIDE


def keep_clear_policy(ledger: Ledger, policy: str | None, fresh: bool, *, actor: str) -> str:
    """Set the ledger's policy for clear queries no binding covers: ``policy`` when
    given; else, when the ledger holds none, :data:`REFUSE` for a ``fresh`` ledger (no
    party, no round yet) and :data:`ALLOW` for an older one (as it behaved). Returns it."""
    held = ledger.setting(CLEAR_POLICY_KEY)
    chosen = policy or held or (REFUSE if fresh else ALLOW)
    if chosen not in (REFUSE, ALLOW):
        raise ValueError(f"--clear-records-from-unbound: {chosen!r} is not refuse or allow")
    ledger.keep_setting(
        CLEAR_POLICY_KEY,
        chosen,
        actor=actor,
        action="clear_records_policy",
        detail={"policy": chosen},
    )
    return chosen


def clear_policy(ledger: Ledger) -> str:
    """The ledger's policy for clear queries no binding covers (:data:`ALLOW` when it
    holds none: a ledger the guardian's start-up has not set, as before the policy)."""
    return ledger.setting(CLEAR_POLICY_KEY) or ALLOW


def bound_queriers(ledger: Ledger) -> dict[str, str]:
    """Every querier the guardian bound to a hospital, {querier: hospital}: the CaPC
    loops an admin sees, whichever gateway (student party) each runs over."""
    from sqlalchemy import select

    from services.common.ledger.tables import settings

    query = select(settings.c.key, settings.c.value).where(
        settings.c.key.startswith(QUERIER_KEY, autoescape=True)
    )
    with ledger.engine.connect() as conn:
        rows = conn.execute(query).all()
    return {str(key)[len(QUERIER_KEY) :]: str(value) for key, value in sorted(rows)}


def terms_for(
    ledger: Ledger, querier: str, request: guardian_pb2.OpenRoundRequest, batch: int
) -> LoopTerms:
    """The loop's terms for ``querier``'s round of ``batch`` queries
    (:func:`capc.round.loop.loop_terms`, from its binding in ``ledger`` and what
    ``request`` says)."""
    held = ledger.setting(QUERIER_KEY + querier)
    outside = held == OUTSIDE
    clear = request.queries.WhichOneof("source") == "tensor"
    # The policy is read only where it can matter: clear queries no binding covers.
    refuse = clear_policy(ledger) == REFUSE if clear and held is None else True
    binding = Binding(None if outside else held, outside, refuse_unbound_clear=refuse)
    ask = LoopAsk(request.hospital, clear, request.reveal_records, request.revealed_by)
    return loop_terms(querier, binding, ask, batch)
