"""End-to-end labelling throughput of a local consortium over mutual TLS.

Guardian and P answering parties run as separate processes (capc up), each
hospital with a small CNN on 28x28 inputs; the student labels Q queries in
rounds of B. Prints one JSON object: labelled queries per second, round
latency percentiles, a time split, and ``secure_over_plain``: the secure
run's wall time over an in-process plaintext PATE aggregation with the same
teachers, queries and mechanism.

The split: ``inference_s`` and ``sharing_s`` are measured on the same
teachers and batches in this process (the parties run them in parallel with
each other); ``ledger_s`` times the reserve/release/commit transactions of as
many rounds on a scratch ledger; ``mpc_s`` is the student's 2PC time;
``network_s`` is what remains of the round-opening time: transfers and
waiting for the slowest party, which on a small machine includes the
parties' inference competing for the same cores.

With ``--link RATE:DELAY`` (e.g. 100mbit:20ms; needs root and iproute2) the
same consortium then runs again with the guardian behind an emulated link:
the guardian in a network namespace joined by a veth pair that ``tc tbf``
holds to RATE each way, and every hospital and the student dialling it
through a relay that adds DELAY each way (services.testbed: the kernel has
no netem). The JSON object then also carries ``link_queries_per_s``,
``link_round_p50_s`` and ``link_bytes_per_query`` (every byte to and from
the guardian, hospitals' and student's, per labelled query) beside the
loopback figures.

Usage: python benchmarks/consortium.py [--parties 10] [--queries 2048] [--batch 512] [--dir DIR]
       [--link 100mbit:20ms] [--epochs 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.models import load_teacher
from capc.mpc.votes import one_hot_votes, share_votes
from capc.privacy.randomness import SecureRandom
from services.common.ledger import Ledger
from services.local import TASK_NAME, LocalConsortium
from services.student.client import RoundResult
from services.testbed import netlab
from services.testbed.proxy import LinkProxy


def plain_pate(c: LocalConsortium, queries: np.ndarray, batch: int) -> float:
    """Seconds for in-process PATE: every teacher predicts, histogram, noise, Confident-GNMax."""
    teachers = [load_teacher(c.model_path(i)) for i in range(c.parties)]
    task = c.task_config
    mech = task.mechanism
    rng = SecureRandom()
    start = time.perf_counter()
    for i in range(0, len(queries), batch):
        xb = queries[i : i + batch]
        hist = mech.summed_votes(np.stack([t.predict(xb) for t in teachers], axis=1))
        mech.decide(hist, mech.draw_noise(len(xb), rng))
    return time.perf_counter() - start


def local_costs(
    c: LocalConsortium, queries: np.ndarray, batch: int, rounds: int
) -> dict[str, float]:
    """Per-run inference and sharing time of one party, and ledger time of ``rounds`` rounds."""
    teacher = load_teacher(c.model_path(0))
    pub = X25519PrivateKey.generate().public_key().public_bytes_raw()
    inference = sharing = 0.0
    for i in range(0, len(queries), batch):
        t0 = time.perf_counter()
        preds = teacher.predict(queries[i : i + batch])
        t1 = time.perf_counter()
        share_votes(one_hot_votes(preds, 10), pub, i, "hospital-0")
        sharing += time.perf_counter() - t1
        inference += t1 - t0
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(str(Path(tmp) / "scratch.db"))
        ledger.create_task(TASK_NAME, c.task)
        for p in range(c.parties):
            ledger.register_party(f"h{p}", 1e9)
        cost = c.task_config.mechanism.worst_case(batch)
        t0 = time.perf_counter()
        for r in range(rounds):
            res = ledger.reserve(
                f"r{r}",
                TASK_NAME,
                "student",
                batch,
                {f"h{p}": cost for p in range(c.parties)},
                mechanism="confident-gnmax",
                quorum=1,
            )
            ledger.release(res.round_id)
            ledger.commit(res.round_id, {f"h{p}": cost for p in range(c.parties)})
        ledger_s = time.perf_counter() - t0
    return {"inference_s": inference, "sharing_s": sharing, "ledger_s": ledger_s}


def label(
    c: LocalConsortium,
    queries: np.ndarray,
    batch: int,
    warmed: Callable[[], None] = lambda: None,
) -> tuple[np.ndarray, list[RoundResult], float]:
    """Labels, rounds and wall seconds for ``queries``, after a warm-up round (then
    ``warmed`` is called, so what it resets leaves the warm-up out)."""
    student = c.student()
    student.label(queries[:batch], batch_size=batch)  # warm-up: base OTs, caches
    warmed()
    start = time.perf_counter()
    labels, rounds = student.label(queries, batch_size=batch)
    wall = time.perf_counter() - start
    student.close()
    return labels, rounds, wall


def over_link(c: LocalConsortium, spec: str, queries: np.ndarray, batch: int) -> dict[str, float]:
    """The same labelling with the guardian behind an emulated RATE:DELAY link."""
    rate, delay = netlab.parse_link(spec)
    c.stop()
    with netlab.NetLab() as lab:
        link = lab.add()
        lab.shape(link, rate)
        c.listen_host, c.guardian_prefix = link.ns_addr, lab.prefix(link)
        relay = LinkProxy((link.host_addr, 0), (link.ns_addr, c.port), delay=delay)
        with relay:
            c.dial = relay.address
            c.start()
            _, rounds, wall = label(c, queries, batch, warmed=relay.reset_counters)
            moved = relay.bytes_total
            c.stop()
    return {
        "link_queries_per_s": round(len(queries) / wall, 1),
        "link_round_p50_s": round(statistics.median(r.open_s + r.mpc_s for r in rounds), 3),
        "link_bytes_per_query": round(moved / len(queries)),
        "link_rounds": len(rounds),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parties", type=int, default=10)
    ap.add_argument("--queries", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument(
        "--epochs",
        type=int,
        default=LocalConsortium.epochs,
        help="training epochs of each hospital's teacher (fewer: a quicker, weaker consortium)",
    )
    ap.add_argument(
        "--dir", type=Path, default=None, help="keep PKI and teachers here between runs"
    )
    ap.add_argument(
        "--link",
        default=None,
        metavar="RATE:DELAY",
        help="also run over an emulated link, e.g. 100mbit:20ms (rate each way, one-way delay)",
    )
    args = ap.parse_args()
    if args.link is not None:
        netlab.parse_link(args.link)  # a bad spec fails before anything starts
        reason = netlab.unavailable()
        if reason is not None:
            ap.error(f"--link needs network namespaces: {reason}")
    tmp = tempfile.TemporaryDirectory()
    directory = args.dir or Path(tmp.name)
    c = LocalConsortium(
        directory / f"p{args.parties}", parties=args.parties, epsilon_cap=1e9, epochs=args.epochs
    )
    t_setup = time.perf_counter()
    with c:
        setup_s = time.perf_counter() - t_setup
        reps = -(-args.queries // len(c.queries))
        queries = np.concatenate([c.queries] * reps)[: args.queries]
        labels, rounds, wall = label(c, queries, args.batch)
        plain_s = plain_pate(c, queries, args.batch)
        costs = local_costs(c, queries, args.batch, len(rounds))
        link = (
            {}
            if args.link is None
            else {"link": args.link, **over_link(c, args.link, queries, args.batch)}
        )
    per_round = [r.open_s + r.mpc_s for r in rounds]
    mpc_s = sum(r.mpc_s for r in rounds)
    open_s = sum(r.open_s for r in rounds)
    truth = np.concatenate([c.truth] * reps)[: args.queries]
    answered = labels >= 0
    q = sorted(per_round)
    print(
        json.dumps(
            {
                "benchmark": "consortium",
                "parties": args.parties,
                "queries": args.queries,
                "batch": args.batch,
                "rounds": len(rounds),
                "cores": os.cpu_count(),
                "queries_per_s": round(args.queries / wall, 1),
                "wall_s": round(wall, 3),
                "round_p50_s": round(statistics.median(per_round), 3),
                "round_p95_s": round(q[min(len(q) - 1, int(0.95 * len(q)))], 3),
                "inference_s": round(costs["inference_s"], 3),
                "sharing_s": round(costs["sharing_s"], 3),
                "ledger_s": round(costs["ledger_s"], 3),
                "mpc_s": round(mpc_s, 3),
                "network_s": round(
                    max(
                        0.0, open_s - costs["inference_s"] - costs["sharing_s"] - costs["ledger_s"]
                    ),
                    3,
                ),
                "plain_pate_s": round(plain_s, 3),
                "secure_over_plain": round(wall / plain_s, 2),
                "answered_fraction": round(float(answered.mean()), 3),
                "label_accuracy": round(float((labels[answered] == truth[answered]).mean()), 3)
                if answered.any()
                else None,
                "setup_s": round(setup_s, 1),
                "targets": {"queries_per_s_min": 100, "secure_over_plain_max": 3},
                **link,
            }
        )
    )
    tmp.cleanup()


if __name__ == "__main__":
    main()
