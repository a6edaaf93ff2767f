"""Round latency of one guardian as the consortium grows to 200 connected hospitals.

For each party count N: a fresh guardian (``capc guardian``, its own SQLite
ledger) and N answering parties packed into ``ceil(N / per-process)``
``capc answerer`` processes, each party with its own certificate and its own
mutual-TLS Connect stream, all voting with one small untrained MLP
(services.testbed.light: the protocol, shares, sealed seeds, ledger and 2PC
are the real ones; only the model is trivial, so the machine's cores go to
the consortium, not to inference). The student labels ``rounds`` batches of
``batch`` queries after a warm-up round; every round must include all N.

Prints one JSON object per party count: round latency percentiles and its
split (``open``: reservation, work out, every party's shares in; ``mpc``:
the student's share sum and the garbled circuit), the time for all N to
connect, the guardian's resident memory, and the CPU the guardian and the
answering parties (per party) use per round above what the idle consortium
uses, which a loaded machine changes far less than the latencies.

Usage: python benchmarks/scale.py [--parties 10,50,200] [--rounds 5] [--batch 64]
       [--per-process 50] [--idle-s 10] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from services.testbed.light import light_consortium, queries


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(
    directory: Path, parties: int, rounds: int, batch: int, per_process: int, idle_s: float = 10.0
) -> dict[str, object]:
    with light_consortium(directory, parties=parties, cap=1e9) as c:
        guardian = c.start_guardian("--share-timeout", "120")
        start = time.perf_counter()
        groups = [c.names[i : i + per_process] for i in range(0, parties, per_process)]
        procs = [c.start_parties(group) for group in groups]
        for proc, group in zip(procs, groups, strict=True):
            c.wait_connected(proc, len(group), timeout=600)
        connect_s = time.perf_counter() - start
        student = c.student(timeout=600)
        student.label_batch(queries(batch, seed=10_000))  # warm-up: base OTs, caches
        results = []
        pids = {"guardian": [guardian.popen.pid], "parties": [p.popen.pid for p in procs]}
        # What the consortium uses with no round running (heartbeats, reports, status
        # files), subtracted below: a round's own CPU does not depend on how long the
        # loaded machine makes it last.
        idle0, i0 = {k: sum(cpu_s(p) for p in v) for k, v in pids.items()}, time.perf_counter()
        time.sleep(idle_s)
        cpu0, t0 = {k: sum(cpu_s(p) for p in v) for k, v in pids.items()}, time.perf_counter()
        idle = {k: (cpu0[k] - idle0[k]) / (t0 - i0) for k in pids}
        for r in range(rounds):
            result = student.label_batch(queries(batch, seed=r))
            if len(result.parties) != parties:
                raise RuntimeError(f"round {r} used {len(result.parties)} of {parties} parties")
            results.append(result)
        wall = time.perf_counter() - t0
        cpu = {k: sum(cpu_s(p) for p in v) - cpu0[k] - idle[k] * wall for k, v in pids.items()}
        student.close()
        memory = rss_mib(guardian.popen.pid)
    latency = [r.open_s + r.mpc_s for r in results]
    return {
        "benchmark": "scale",
        "parties": parties,
        "processes": len(groups),
        "batch": batch,
        "rounds": rounds,
        "cores": os.cpu_count(),
        "round_p50_s": round(statistics.median(latency), 3),
        "round_p95_s": round(percentile(latency, 0.95), 3),
        "open_p50_s": round(statistics.median(r.open_s for r in results), 3),
        "mpc_p50_s": round(statistics.median(r.mpc_s for r in results), 3),
        "queries_per_s": round(rounds * batch / wall, 1),
        "connect_all_s": round(connect_s, 1),
        "guardian_rss_mib": memory,
        # CPU, not wall time: it holds on a loaded machine, where the percentiles do not.
        # Per round, above what the idle consortium uses (``idle_cores``, in cores).
        "guardian_cpu_s_per_round": round(cpu["guardian"] / rounds, 3),
        "party_cpu_ms_per_round": round(1000 * cpu["parties"] / rounds / parties, 2),
        "idle_cores": {k: round(v, 3) for k, v in idle.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parties", default="10,50,200", help="comma-separated party counts")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--per-process", type=int, default=50, help="answering parties per process")
    ap.add_argument(
        "--idle-s", type=float, default=10.0, help="seconds the idle consortium's CPU is read"
    )
    ap.add_argument("--dir", type=Path, default=None, help="keep PKI and ledgers here")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    base = args.dir or Path(tmp.name)
    for n in (int(p) for p in args.parties.split(",")):
        print(
            json.dumps(
                run(base / f"p{n}", n, args.rounds, args.batch, args.per_process, args.idle_s)
            ),
            flush=True,
        )
    tmp.cleanup()


if __name__ == "__main__":
    main()
