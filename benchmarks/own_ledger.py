"""CPU time of one hospital's own ledger per round, in-process.

A hospital's ledger work in a round is: reserve the round's worst case before
it votes (``OwnBudget.admit``, which writes the settlements it holds in the same
transaction), take the guardian's settlement (``OwnBudget.settle``, held until
then), and now and then the spend report it sends back (``OwnBudget.report``,
at most every ``REPORT_S`` seconds; here every ``--report-every`` rounds). The
scale benchmark runs 50 hospitals to a process, so this cost is paid 50 times
per round per process. Here a real guardian ledger
(signed audit heads) opens and settles each round as the round engine does,
and only the hospital's calls are timed: CPU seconds (``time.process_time``),
so the number holds on a loaded machine better than wall time.

Prints one JSON object: ``cpu_ms_per_round`` (admit + settle + report), the
split, and with ``--profile`` the top functions by cumulative time to stderr.

Usage: python benchmarks/own_ledger.py [--rounds 200] [--batch 64] [--report-every 5]
       [--url URL] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from capc.mechanisms.registry import from_config
from capc.task_config import canonical_json, config_hash
from services import tasks
from services.answerer.budget import OwnBudget
from services.common import serde
from services.common.ledger import Ledger
from services.common.protocol import PROTOCOL_VERSION
from services.guardian import budgets
from services.proto.capc.v1 import common_pb2, guardian_pb2

NAME = "hospital-0"
TASK = "light"


def run(
    guardian_url: str,
    own_url: str,
    rounds: int,
    batch: int,
    profile: cProfile.Profile | None,
    report_every: int = 5,
) -> dict[str, object]:
    config = tasks.load(TASK)
    mech = from_config(config["mechanism"], config["num_classes"])
    guardian = Ledger(guardian_url, signer=Ed25519PrivateKey.generate())
    guardian.register_party(NAME, 1e9, teachers=1)
    guardian.create_task(TASK, config)
    own = OwnBudget(NAME, Ledger(own_url), 1e9)
    own.welcome(budgets.registered(guardian, NAME))
    header = common_pb2.Header(
        protocol_version=PROTOCOL_VERSION, task=TASK, config_hash=config_hash(config)
    )
    own.define(guardian_pb2.TaskDefinition(config_json=canonical_json(config)), header)
    shape = [batch, *config["input_shape"]]
    queries = common_pb2.QueryBatch(tensor=serde.queries_to_proto(np.zeros(shape, np.float32)))
    rng = np.random.default_rng(0)
    spent = {"admit": 0.0, "settle": 0.0, "report": 0.0}

    def timed(part: str, call: object, *args: object) -> None:
        if profile is not None:
            profile.enable()
        t0 = time.process_time()
        call(*args)  # type: ignore[operator]
        spent[part] += time.process_time() - t0
        if profile is not None:
            profile.disable()

    for r in range(rounds):
        res = guardian.reserve(
            f"round-{r}", TASK, "student", batch, {NAME: mech.worst_case(batch)},
            mechanism=mech.name, quorum=1,
        )  # fmt: skip
        work = guardian_pb2.RoundWork(
            round_id=res.round_id,
            queries=queries,
            mechanism=serde.mechanism_to_proto(mech),
            vote_weight=1.0,
        )
        timed("admit", lambda w, h: own.admit(own.decode(w, h).work), work, header)
        # A mechanism without a threshold answers every query.
        answered = rng.random(batch) < 0.5 if mech.confident else np.ones(batch, bool)
        guardian.release(res.round_id)
        guardian.commit(
            res.round_id, {NAME: mech.event(answered)}, outcome=budgets.outcome(answered)
        )
        settled = budgets.settlement_of(guardian, NAME, res.round_id)
        if settled is None:
            raise RuntimeError(f"round {res.round_id} has no settlement")
        timed("settle", own.settle, settled)
        if (r + 1) % report_every == 0:
            timed("report", own.report)
    own.flush()  # as the party does when it stops
    if own.open_rounds():
        raise RuntimeError(f"rounds left open: {own.open_rounds()}")
    own.ledger.verify_audit()
    total = sum(spent.values())
    return {
        "benchmark": "own_ledger",
        "url": own_url.split("://", 1)[0] if "://" in own_url else "sqlite",
        "rounds": rounds,
        "batch": batch,
        "report_every": report_every,
        "cpu_ms_per_round": round(1000 * total / rounds, 3),
        **{f"{k}_cpu_ms": round(1000 * v / rounds, 3) for k, v in spent.items()},
        "audit_entries": own.ledger.audit_head().seq,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--report-every", type=int, default=5, help="rounds between reports")
    ap.add_argument("--url", default=None, help="the hospital's ledger (default: a SQLite file)")
    ap.add_argument("--profile", action="store_true", help="cProfile the hospital's calls")
    args = ap.parse_args()
    profile = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory() as tmp:
        own_url = args.url or str(Path(tmp) / "own.db")
        result = run(
            str(Path(tmp) / "guardian.db"),
            own_url,
            args.rounds,
            args.batch,
            profile,
            args.report_every,
        )
    print(json.dumps(result), flush=True)
    if profile is not None:
        pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
