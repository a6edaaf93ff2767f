"""What the round core needs to know of a task (``services.common.task.TaskConfig`` has it)."""

from __future__ import annotations

from typing import Protocol

from capc.mechanisms import Mechanism, Personalization
from capc.mechanisms.base import CircuitSpec


class RoundTask(Protocol):
    """A task as a round uses it: its mechanism, quorum, vote layout and personalization."""

    @property
    def name(self) -> str: ...

    @property
    def mechanism(self) -> Mechanism: ...

    @property
    def quorum(self) -> int: ...

    @property
    def personalization(self) -> Personalization | None: ...

    @property
    def weighting(self) -> bool:
        """Personalized by vote weights (else, if personalized, by participation)."""
        ...

    @property
    def vote_width(self) -> int:
        """Columns of a party's vote matrix."""
        ...

    @property
    def weight_bits(self) -> int:
        """Fractional bits of a vote weight on the shares' grid."""
        ...

    @property
    def frac_bits(self) -> int:
        """Fractional bits of the shares."""
        ...

    def circuit_spec(
        self, voters: int, vote_total: float | None = None, vote_parties: int = 0
    ) -> CircuitSpec:
        """The round's circuit for ``voters`` teachers whose weights sum to ``vote_total``;
        ``vote_parties``: parties whose one-hot votes the circuit checks one by one."""
        ...


__all__ = ["RoundTask"]
