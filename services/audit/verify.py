"""``capc audit verify``: is the guardian's audit log the history the hospitals were shown?

The guardian's log is a hash chain whose every head the guardian signs with
its Ed25519 key (kept out of the database), and each hospital's own ledger
keeps the signed head it was shown with every round it settled. This
command checks, and names the first entry that fails:

1. the guardian's chain: numbering, links, hashes, and every head's
   signature under the trusted key. Someone who rewrites a row and
   recomputes the chain still cannot sign it;
2. each hospital's own chain, and each head it kept: signed by the trusted
   key, and equal to the guardian's entry at that position. A guardian that
   rewrote its history and signed it again, or removed its latest entries,
   disagrees with a head a hospital holds.

The trusted key is ``--public-key``, or else the key the hospitals pinned
when they first connected; the key the guardian's database names is used
only when neither is given (and then said so: whoever can write that
database can replace it).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field

from capc.round.errors import LedgerRefusedError
from services.common.ledger import Ledger
from services.common.ledger.audit import AuditHead, head_signed

#: The setting and the audit action under which a hospital keeps the guardian's key and heads.
PINNED_KEY = "guardian_audit_key"
HEAD_ACTION = "guardian_head"
PAGE = 5000


@dataclass(frozen=True)
class Problem:
    """One failed check: the guardian's entry it concerns (0: none in particular)."""

    seq: int
    text: str


@dataclass
class Report:
    """What :func:`verify` found."""

    entries: int = 0
    heads_checked: int = 0
    key: str = ""
    key_source: str = ""
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def first(self) -> Problem | None:
        """The problem at the earliest guardian entry."""
        numbered = [p for p in self.problems if p.seq > 0]
        if numbered:
            return min(numbered, key=lambda p: p.seq)
        return self.problems[0] if self.problems else None


def _kept_heads(party: Ledger) -> list[tuple[int, AuditHead]]:
    """(round, head) for every guardian head a hospital's ledger kept, oldest first."""
    out: list[tuple[int, AuditHead]] = []
    after = 0
    while True:
        rows = party.audit_rows(after, PAGE)
        if not rows:
            return out
        for row in rows:
            if row.action == HEAD_ACTION:
                d = row.detail
                head = AuditHead(int(str(d["seq"])), str(d["hash"]), str(d["signature"]))
                out.append((int(str(d.get("round", 0))), head))
        after = rows[-1].seq


def _guardian_hash(guardian: Ledger, seq: int) -> str | None:
    rows = guardian.audit_rows(seq - 1, 1)
    return rows[0].hash if rows and rows[0].seq == seq else None


def verify(guardian: Ledger, parties: dict[str, Ledger], public_key: str | None = None) -> Report:
    """Check ``guardian``'s audit log against its key and the heads ``parties`` kept."""
    report = Report()
    recorded = guardian.audit_key()
    pins = {name: p.setting(PINNED_KEY) for name, p in parties.items()}
    pinned = {k for k in pins.values() if k}
    if public_key:
        report.key, report.key_source = public_key.lower(), "given"
    elif len(pinned) == 1:
        report.key, report.key_source = pinned.pop(), "pinned by " + ", ".join(sorted(parties))
    elif len(pinned) > 1:
        report.problems.append(
            Problem(0, f"the hospitals pinned different guardian keys: {pins}; pass --public-key")
        )
        return report
    elif recorded is not None:
        report.key, report.key_source = recorded[0], "named by the guardian's own database"
        report.warnings.append(
            "no independent key: the one the guardian's database names was used; pass "
            "--public-key or a hospital's ledger (--party-ledger) to trust it"
        )
    else:
        report.problems.append(
            Problem(0, "the guardian's ledger has no audit key: its heads were never signed")
        )
        return report
    for name, key in pins.items():
        if key and key != report.key:
            report.problems.append(
                Problem(0, f"{name} pinned guardian key {key}, not the trusted {report.key}")
            )
    if recorded is not None and recorded[0] != report.key:
        report.problems.append(
            Problem(
                0,
                f"the guardian's database names audit key {recorded[0]}, not the trusted "
                f"{report.key}: its log was re-signed with another key",
            )
        )
    report.entries, problem = guardian.check_audit(report.key)
    if problem is not None:
        report.problems.append(Problem(problem.seq, f"guardian {problem}"))
    for name, party in sorted(parties.items()):
        _, own = party.check_audit()
        if own is not None:
            report.problems.append(Problem(0, f"{name}'s own ledger: {own}"))
        last_good = 0
        for round_id, head in _kept_heads(party):
            report.heads_checked += 1
            when = f"round {round_id}" if round_id else "its connection"
            if not head_signed(report.key, head):
                report.problems.append(
                    Problem(0, f"{name} kept a head at {when} that the trusted key did not sign")
                )
                continue
            have = _guardian_hash(guardian, head.seq)
            if have is None:
                report.problems.append(
                    Problem(
                        head.seq,
                        f"guardian audit entry {head.seq}: missing, but {name} was shown it "
                        f"signed at {when}: the log lost its entries after {report.entries}",
                    )
                )
            elif have != head.hash:
                report.problems.append(
                    Problem(
                        head.seq,
                        f"guardian audit entry {head.seq} differs from the signed head {name} "
                        f"kept at {when}: the history was rewritten after entry {last_good} "
                        f"and at or before entry {head.seq}",
                    )
                )
            else:
                last_good = max(last_good, head.seq)
    return report


def run(args: argparse.Namespace) -> int:
    parties: dict[str, Ledger] = {}
    try:
        guardian = Ledger(args.ledger, delta=None, migrate=False)
        for item in args.party_ledger:
            name, _, url = item.partition("=")
            if not name or not url:
                print(f"error: --party-ledger expects NAME=URL, got {item!r}", file=sys.stderr)
                return 2
            parties[name] = Ledger(url, delta=None, migrate=False)
        report = verify(guardian, parties, args.public_key)
    except LedgerRefusedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    first = report.first()
    if args.json:
        body = {
            **asdict(report),
            "ok": report.ok,
            "first": None if first is None else asdict(first),
        }
        print(json.dumps(body, sort_keys=True))
    else:
        for warning in report.warnings:
            print(f"warning: {warning}")
        print(
            f"guardian audit log: {report.entries} entries, key {report.key[:16]}... "
            f"({report.key_source}); {report.heads_checked} heads kept by "
            f"{len(parties)} hospitals checked"
        )
        if first is None:
            print("ok: every entry is signed and every kept head matches")
        else:
            print(f"FIRST BAD ENTRY: {first.text}")
            for problem in report.problems:
                if problem is not first:
                    print(f"also: {problem.text}")
    return 0 if report.ok else 1
