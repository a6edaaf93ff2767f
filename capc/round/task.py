"""What the round core needs to know of a task (``capc.task_config.TaskConfig`` has it)."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class MechanismTask:
    """A :class:`RoundTask` that is a mechanism and a quorum only: no personalization, so
    every vote weighs 1 and the shares carry the mechanism's vote grid (what a central
    driver runs, :mod:`capc.round.central`)."""

    name: str
    mechanism: Mechanism
    quorum: int = 1

    @property
    def personalization(self) -> Personalization | None:
        return None

    @property
    def weighting(self) -> bool:
        return False

    @property
    def vote_width(self) -> int:
        return self.mechanism.vote_width

    @property
    def weight_bits(self) -> int:
        return 0

    @property
    def frac_bits(self) -> int:
        return self.mechanism.vote_grid_bits

    def circuit_spec(
        self, voters: int, vote_total: float | None = None, vote_parties: int = 0
    ) -> CircuitSpec:
        return self.mechanism.circuit(float(voters), vote_total, self.frac_bits, vote_parties)


__all__ = ["MechanismTask", "RoundTask"]
