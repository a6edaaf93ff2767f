"""How a round ended for a party, from what the ledger holds (its own ledger charges
itself the same), and what a round released as the ledger keeps it."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from capc.round.ledger import RoundRecord, RoundState
from capc.round.messages import Settlement


def outcome(answered: ArrayLike) -> dict[str, object]:
    """What a round released, as the ledger keeps it: the answered mask's shape and its
    bits packed least significant first, as hex."""
    mask = np.asarray(answered, dtype=bool)
    return {
        "shape": list(mask.shape),
        "answered": np.packbits(mask.ravel(), bitorder="little").tobytes().hex(),
    }


def settlement(record: RoundRecord | None, party: str) -> Settlement | None:
    """How the round of ``record`` ended for ``party``; None while it is open, unknown,
    or when the ledger holds a reservation for the party still."""
    if record is None or record.state in (RoundState.RESERVED, RoundState.RELEASED):
        return None
    held = record.held.get(party)
    if record.state == RoundState.ABORTED or held is None or not held.charged:
        return Settlement(record.round_id, party, "not_charged")
    if not held.settled:
        return None
    if record.outcome is not None and "answered" in record.outcome:
        answered = bytes.fromhex(str(record.outcome["answered"]))
        return Settlement(record.round_id, party, "charged", answered)
    return Settlement(record.round_id, party, "worst_case")


__all__ = ["outcome", "settlement"]
