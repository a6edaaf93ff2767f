"""Emulated network links on this machine: network namespaces, veth pairs and ``tbf``.

Each :class:`Link` is a network namespace joined to the host's namespace by
a veth pair with a /30 of its own, taken from a private /24 that no
interface here uses; processes run inside a namespace with
:meth:`NetLab.prefix`. ``tc qdisc ... tbf`` on both ends of the pair sets
the link's rate; taking the host's end down partitions the namespace and
bringing it up heals it. The kernel here has no ``netem``, so delay and
loss come from a relay on the path (services.testbed.proxy). Traffic stays
on the addresses the lab creates, and everything it made is removed when it
closes. Needs root and iproute2; :func:`unavailable` says why not.
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import shutil
import subprocess
from dataclasses import dataclass, field

RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_SCALE = {"bit": 1, "kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000}


class NetLabError(RuntimeError):
    """An ``ip`` or ``tc`` command failed; the text has its output."""


def unavailable() -> str | None:
    """Why namespaces cannot be made here (not root, no ip or tc), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    return None


def rate_bits(rate: str) -> int:
    """'100mbit' -> 100_000_000 bits/s."""
    m = RATE.match(rate.strip().lower())
    if m is None:
        raise ValueError(
            f"a rate is a number and bit, kbit, mbit or gbit (e.g. 100mbit), got {rate!r}"
        )
    return int(float(m.group(1)) * _SCALE[m.group(2)])


def parse_link(spec: str) -> tuple[int, float]:
    """'100mbit:20ms' -> (bits/s, one-way delay in s)."""
    rate, _, delay = spec.partition(":")
    seconds = 0.0
    if delay:
        m = re.match(r"^(\d+(?:\.\d+)?)(ms|s)$", delay.strip())
        if m is None:
            raise ValueError(f"a delay is a number and ms or s (e.g. 20ms), got {delay!r}")
        seconds = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    return rate_bits(rate), seconds


def _run(*cmd: str) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise NetLabError(f"`{' '.join(cmd)}` failed: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


@dataclass
class Link:
    """A namespace ``ns`` behind veth ``host_if`` (``host_addr``, in the host's namespace)
    and ``ns_if`` (``ns_addr``, inside ``ns``)."""

    ns: str
    host_if: str
    ns_if: str
    host_addr: str
    ns_addr: str


@dataclass
class NetLab:
    """Namespaces and links made for one test or benchmark run; a context manager."""

    links: list[Link] = field(default_factory=list)
    tag: str = field(default_factory=lambda: f"{random.getrandbits(24):06x}")
    _subnet: ipaddress.IPv4Network | None = None

    def __enter__(self) -> NetLab:
        reason = unavailable()
        if reason is not None:
            raise NetLabError(reason)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _free_subnet(self) -> ipaddress.IPv4Network:
        """A 10.x.y.0/24 that no interface on this machine has an address in."""
        if self._subnet is None:
            used = [
                ipaddress.ip_interface(a).network
                for a in re.findall(r"inet (\S+)", _run("ip", "-4", "addr", "show"))
            ]
            rng = random.Random(self.tag)
            for _ in range(1000):
                net = ipaddress.IPv4Network(f"10.{rng.randint(64, 254)}.{rng.randint(0, 254)}.0/24")
                if not any(net.overlaps(u) for u in used):
                    self._subnet = net
                    return net
            raise NetLabError("no free private /24 for the lab's links")
        return self._subnet

    def add(self) -> Link:
        """A new namespace joined to this one by a veth pair; its default route leads here."""
        i = len(self.links)
        if i >= 63:
            raise NetLabError("a lab holds at most 63 links")
        base = self._free_subnet().network_address + 4 * i
        host_addr, ns_addr = str(base + 1), str(base + 2)
        link = Link(
            f"capc-{self.tag}-{i}", f"cx{self.tag}h{i}", f"cx{self.tag}n{i}", host_addr, ns_addr
        )
        _run("ip", "netns", "add", link.ns)
        self.links.append(link)
        _run("ip", "link", "add", link.host_if, "type", "veth", "peer", "name", link.ns_if)
        _run("ip", "link", "set", link.ns_if, "netns", link.ns)
        _run("ip", "addr", "add", f"{host_addr}/30", "dev", link.host_if)
        _run("ip", "link", "set", link.host_if, "up")
        inside = ("ip", "netns", "exec", link.ns)
        _run(*inside, "ip", "addr", "add", f"{ns_addr}/30", "dev", link.ns_if)
        _run(*inside, "ip", "link", "set", link.ns_if, "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        _run(*inside, "ip", "route", "add", "default", "via", host_addr)
        return link

    @staticmethod
    def prefix(link: Link) -> list[str]:
        """The command prefix that runs a process inside ``link``'s namespace."""
        return ["ip", "netns", "exec", link.ns]

    def shape(self, link: Link, rate: str | int) -> None:
        """Hold both directions of ``link`` to ``rate`` ('100mbit', or bits/s) with tbf."""
        bits = rate if isinstance(rate, int) else rate_bits(rate)
        # A burst of 10 ms at the rate (at least 16 KiB, tbf needs one MTU and more).
        burst = max(16 * 1024, bits // 8 // 100)
        args = ("root", "tbf", "rate", f"{bits}bit", "burst", str(burst), "latency", "200ms")
        _run("tc", "qdisc", "replace", "dev", link.host_if, *args)
        _run("ip", "netns", "exec", link.ns, "tc", "qdisc", "replace", "dev", link.ns_if, *args)

    def partition(self, link: Link) -> None:
        """Cut ``link``: nothing passes either way until :meth:`heal`."""
        _run("ip", "link", "set", link.host_if, "down")

    def heal(self, link: Link) -> None:
        _run("ip", "link", "set", link.host_if, "up")
        # Bringing the interface down dropped its routes; the address route comes back
        # with it, the namespace's default route never left.

    def close(self) -> None:
        """Remove every namespace (its veth pair goes with it)."""
        for link in self.links:
            subprocess.run(["ip", "netns", "del", link.ns], capture_output=True, check=False)
            subprocess.run(["ip", "link", "del", link.host_if], capture_output=True, check=False)
        self.links.clear()
