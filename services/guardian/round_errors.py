"""The guardian's one refusal of its own: a second stream under a connected party's
identity. Every other refusal is the round core's (:mod:`capc.round.errors`), mapped
to a status by :mod:`services.guardian.status`."""

from __future__ import annotations


class DuplicateLinkError(RuntimeError):
    """The party is connected already: a second stream under its identity is refused."""

    def __init__(self, name: str, connected_from: str) -> None:
        super().__init__(f"{name} is already connected from {connected_from or 'elsewhere'}")
        self.name = name
        self.connected_from = connected_from


__all__ = ["DuplicateLinkError"]
