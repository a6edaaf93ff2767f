"""What a gateway's admin views show: every party on the consortium's gateway; on a
hospital's own gateway (``capc gateway serve --hospital NAME``, over its CaPC loop's
student party) that hospital alone, so that its operator's admin token is an admin's
of its own hospital, not of the consortium.

The guardian's signed audit log stays whole on either: it is one hash chain, which
every member verifies from its first entry, and it records the consortium's own
decisions (registrations, caps, bindings, records revealed), not anyone's data.
"""

from __future__ import annotations

from fastapi import HTTPException

from services.gateway.backends import Backends
from services.proto.capc.v1 import guardian_pb2


def own_party(backends: Backends, party: str | None) -> str | None:
    """The party an admin read may name: any (``party``, None for all) on the
    consortium's gateway; on a hospital's own gateway that hospital (None or its name),
    and a 403 saying so for any other."""
    mine = backends.hospital
    if not mine or party is None or party in ("", mine):
        return mine or party
    raise HTTPException(
        403,
        f"this gateway is {mine}'s own: its admin views show {mine} alone, not "
        f"{party!r}. The consortium's gateway shows every party to its admins",
    )


def shown(backends: Backends, reply: guardian_pb2.ListPartiesReply) -> set[str] | None:
    """The parties a gateway's admin views show (None: every one): a hospital and the
    queriers the guardian bound to it (its loop's student party)."""
    mine = backends.hospital
    if not mine:
        return None
    return {mine} | {q for q, h in reply.bound_queriers.items() if h == mine}
