"""How the guardian's cost per round grows with the number of hospitals, and where it goes.

An in-process simulation through the protocol core (``capc.round``): one
:class:`~capc.round.GuardianCore` over the in-memory ledger, P answering parties
(:class:`~capc.round.PartyCore`, each with its own in-memory ledger, ``m``
teachers voting random classes) and a student (:class:`~capc.round.StudentCore`),
joined by function calls. Every round goes the networked way except the wire and
the garbled circuit: the guardian reserves every party's worst case, each party
reserves its own and votes with its vote validity proof, the guardian collects
the shares, closes and draws the challenge, the student opens every sealed seed
and expands its shares, the guardian checks every proof with the student's
verifier shares, then the mechanism's oracle releases (the circuit's cost does not
depend on P: its inputs are the two share sums) and the guardian charges every
party, which settles its own ledger.

Each step is timed in CPU seconds (``time.process_time``), so the split holds on a
loaded machine. Guardian and student steps are what one process pays per round;
the parties' steps run on P machines in a deployment, so they are reported per
party.

Prints one JSON object: per P, ``guardian_ms_per_round`` (open and reserve,
receive, close, vote check, release and charge), ``student_ms_per_round`` (open
seeds and expand, verifier shares, sum), ``party_ms_per_round`` (one party's
admit, vote with proof and settle), the guardian's share of each step, and
``ledgers_agree``: every party's own ledger holds what the guardian charged it.

Rounds are of 32 queries by default: over 1,000 parties of 5 teachers, the proofs'
conversion to the circuit's ring is safe (error below 2^-40) for at most 34.

Usage: python benchmarks/round_core_scale.py [--parties 10 100 1000] [--rounds 3]
       [--batch 32] [--teachers 5]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.mechanisms import from_config
from capc.privacy import accountants
from capc.round import GuardianCore, MemoryLedger, QueryBatch
from capc.round import circuit as round_circuit
from capc.round.central import histogram
from capc.round.memory_party_ledger import MemoryPartyLedger
from capc.round.party import PartyCore
from capc.round.settlement import settlement
from capc.round.student import StudentCore
from capc.round.task import MechanismTask

CLASSES = 10
SESSION = b"simulated-sessio"


class Clock:
    """CPU seconds per named step, summed over its uses (``with clock("step"): ...``)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, step: str) -> Iterator[None]:
        start = time.process_time()
        yield
        self.spent[step] += time.process_time() - start


def simulate(parties: int, rounds: int, batch: int, teachers: int) -> dict[str, Any]:
    """CPU milliseconds per round of each step for ``parties`` hospitals."""
    acct = accountants.make(accountants.DEFAULT_ACCOUNTANT)
    # The demo's sigma, as a share of the vote (40 for 250 teachers).
    mech = from_config({"name": "gnmax", "sigma": 40.0 * parties * teachers / 250}, CLASSES)
    task = MechanismTask("simulated", mech, quorum=1)
    config = {"mechanism": mech.to_config(), "outputs": mech.outputs, "quorum": 1}
    names = [f"hospital-{i:04d}" for i in range(parties)]
    cap = 1e6  # the simulation measures cost, not budgets
    ledger = MemoryLedger(accounting=acct, delta=1e-5)
    for p in names:
        ledger.register(p, cap)
    own = {p: MemoryPartyLedger(p, cap, accounting=acct, delta=1e-5) for p in names}
    cores = {p: PartyCore(p, own[p]) for p in names}
    guardian: GuardianCore[MechanismTask] = GuardianCore(ledger, round_timeout=math.inf)
    student = StudentCore("student", X25519PrivateKey.generate())
    rng = np.random.default_rng(0)
    clock = Clock()
    for r in range(rounds):
        request = student.request(QueryBatch("tensor", batch), session_id=SESSION)
        with clock("guardian_open"):
            rnd, work = guardian.open(
                task, request, names, dict.fromkeys(names, teachers), float(r)
            )
        for w in work:
            w = replace(w, task_config=config)
            party = cores[w.party]
            votes = rng.integers(0, CLASSES, size=(batch, teachers))
            with clock("party_admit"):
                party.admit(w)
            with clock("party_vote"):
                shares = party.vote(w, votes, CLASSES)
            with clock("guardian_receive"):
                guardian.receive(shares)
        with clock("guardian_close"):
            opened = guardian.close(rnd.round_id)
        with clock("student_open"):
            mine = student.opened(task, opened, batch)
        with clock("student_verifier"):
            proven, share = student.vote_check(mine)
        guardian.vote_check_batch(rnd.round_id, request.querier, SESSION, proven)
        with clock("guardian_check"):
            verdict = guardian.check_votes(rnd.round_id, share)
        with clock("student_sum"):
            student_sum = student.checked(mine, verdict)
        ready = guardian.to_compute(rnd.round_id)
        with clock("guardian_release_charge"):
            plan = round_circuit.round_circuit(ready)
            noise = round_circuit.draw_noise(ready, guardian.rng)
            if ready.guardian_sum is None:
                raise RuntimeError("the vote check left no share sum")
            hist = histogram(ready.guardian_sum + student_sum, task.frac_bits)
            _, answered = mech.oracle(hist, noise, plan.spec.frac_bits, plan.theta)
            guardian.release(ready.round_id)
            guardian.charge(ready.round_id, answered)
        record = ledger.round_record(rnd.round_id)
        for p in rnd.included:
            settled = settlement(record, p)
            if settled is not None:
                with clock("party_settle"):
                    cores[p].settle(settled)
    # Every round went the whole way: each party's own ledger holds what the guardian's
    # charged it, and no round is left open on either side.
    agree = (
        all(
            math.isclose(ledger.spent(p), own[p].spent(), rel_tol=1e-9)
            and ledger.spent(p) > 0
            and not cores[p].open_rounds()
            for p in names
        )
        and not ledger.open_rounds()
    )
    per_round = {k: 1000 * v / rounds for k, v in clock.spent.items()}
    guardian_ms = sum(v for k, v in per_round.items() if k.startswith("guardian"))
    student_ms = sum(v for k, v in per_round.items() if k.startswith("student"))
    party_ms = sum(v for k, v in per_round.items() if k.startswith("party")) / parties
    return {
        "parties": parties,
        "ledgers_agree": agree,
        "guardian_ms_per_round": round(guardian_ms, 2),
        "student_ms_per_round": round(student_ms, 2),
        "party_ms_per_round": round(party_ms, 3),
        "guardian_ms_per_party": round(guardian_ms / parties, 4),
        "guardian_split": {
            k: round(v / guardian_ms, 3) for k, v in per_round.items() if k.startswith("guardian")
        },
        "student_split": {
            k: round(v / student_ms, 3) for k, v in per_round.items() if k.startswith("student")
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parties", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--teachers", type=int, default=5)
    args = ap.parse_args()
    runs = [simulate(p, args.rounds, args.batch, args.teachers) for p in args.parties]
    base = runs[0]
    for run in runs:
        # Growth against the smallest consortium: 1.0 per party is linear.
        run["guardian_growth_per_party"] = round(
            (run["guardian_ms_per_round"] / base["guardian_ms_per_round"])
            / (run["parties"] / base["parties"]),
            3,
        )
    print(
        json.dumps(
            {
                "benchmark": "round_core_scale",
                "batch": args.batch,
                "teachers": args.teachers,
                "rounds": args.rounds,
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
