"""capc's bytes between organisations, counted by a relay in front of the guardian.

Every byte capc moves between organisations goes to or from the guardian (a star):
the hospitals' streams, the student's rounds and 2PC, the gateway's calls. A
zero-delay :class:`services.testbed.proxy.LinkProxy` in front of it, which every
party dials (``LocalConsortium.dial``), counts them both ways, TLS records and
gRPC framing included; mutual TLS runs through it unchanged (the parties still
check the guardian's certificate for ``localhost``). The gateway-to-student REST
is inside one organisation and training is local, so neither crosses it.

The hospitals' heartbeats (one every 10 s each) cross it too, so a window also
holds the heartbeats sent while it was open.
"""

from __future__ import annotations

import time

from services.local import LocalConsortium, free_port
from services.testbed.proxy import LinkProxy

#: What a measured row's ``bytes_sent`` is.
MEASURED = (
    "every byte to and from the guardian (TLS records included) for this method's "
    "labelling jobs, counted by a relay in front of it"
)
#: What ``consortium_setup_bytes`` is.
SETUP = (
    "every byte to and from the guardian from the guardian's start until the first "
    "labelling job (hospitals', student's and gateway's connections, handshakes and "
    "registrations), not in any method's bytes"
)


def count_guardian(c: LocalConsortium) -> LinkProxy:
    """A started counting relay to ``c``'s guardian that every party of ``c`` dials.

    Call it before ``c.start()``: parties started earlier dial the guardian directly.
    """
    if c.procs:
        raise RuntimeError("the relay must be in place before the consortium starts")
    c.port = c.port or free_port()
    relay = LinkProxy((c.listen_host, 0), (c.listen_host, c.port)).start()
    c.dial = relay.address
    return relay


def settled(relay: LinkProxy, quiet_s: float = 0.5, most_s: float = 10.0) -> int:
    """The relay's byte total (both ways) once nothing has moved for ``quiet_s`` seconds,
    or after ``most_s`` seconds whatever moves.

    A job is done for the student before the guardian's last settlement reaches the
    hospitals; waiting for quiet keeps those bytes in the job that caused them.
    """
    deadline = time.monotonic() + most_s
    last = relay.bytes_total
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = relay.bytes_total
        if now == last:
            return now
        last = now
    return last
