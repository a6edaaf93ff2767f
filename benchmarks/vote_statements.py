"""What issue 41's vote statements cost per query, in bytes and time, beside what they check.

Tau voting: each party shares the bits of its counts on the 2^-8 grid, their
complements, its norm's slack and its squared counts, with a proof
(capc.mpc.validity), instead of plain ring shares of its votes. Reported: the
bytes a query adds (the parties' element and proof shares to the guardian, the
student's verifier messages), the proving time per party and the verification
time of both sides, and the whole round (shares and the mechanism circuit,
garbled in process) against the round without proofs.

Encrypted-query mode: the guardian's circuit checks each party's one-hot vote
(ConfidentGNMaxCircuit with ``vote_parties``) and counts the valid ones itself,
instead of reconstructing the sum of the parties' shares. Reported: AND
gates, bytes and seconds of the circuit per query against the sum circuit
(each party's own logits-to-shares 2PC, unchanged, is given for scale).

``correct`` is true only if every released label equals the plaintext
mechanism on the same votes with the same (grid-rounded) noise and every
honest proof is accepted. Prints one JSON object; pinned to one core.

Usage: python benchmarks/vote_statements.py [--batch 256] [--labels 5]
       [--teachers 2] [--classes 10] [--parties 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence

import numpy as np
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from capc.mechanisms import mechanism_class
from capc.mechanisms.argmax import noisy_argmax
from capc.mpc import ring, votes
from capc.mpc import validity as vp
from capc.mpc.mechanism_circuits import (
    ConfidentGNMaxCircuit,
    LogitsToSharesCircuit,
    MultiLabelCircuit,
    round_noise,
)
from capc.mpc.session import LocalPair
from capc.privacy.randomness import SecureRandom

TAU = 1.5
SIGMA = 1.0
#: The encrypted tasks' logits-to-shares ring (capc.he.params.CkksParams.share_bits).
SHARE_BITS = 24


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs[1:]) if len(xs) > 1 else xs[0]  # the first round warms up


def tau_cost(args: argparse.Namespace, pair: LocalPair, secure: SecureRandom) -> dict[str, object]:
    k, b, p, m = args.labels, args.batch, args.parties, args.teachers
    mech = mechanism_class("tau").from_params(k, {"sigma": SIGMA, "tau": TAU})
    rel = mech.vote_relation(m)
    if rel is None:
        raise SystemExit(f"tau over {k} labels with {m} teachers has no proof statement")
    rng = np.random.default_rng(41)
    preds = rng.integers(0, 2, (p, b, m, k))
    counts = [mech.encode_ensemble_votes(preds[i], frac_bits=8).astype(np.int64) for i in range(p)]
    hist = np.sum(counts, axis=0)  # (B, k) on the 2^-8 grid
    spec = MultiLabelCircuit(
        num_labels=k,
        max_votes=p * m,
        sigma=SIGMA,
        decision_threshold=p * m / 2.0,
        frac_bits=8,
        share_frac_bits=8,
    )
    circuit = spec.circuit()
    names = [f"party-{i}" for i in range(p)]
    relations = dict.fromkeys(names, rel)
    correct = True
    plain_walls, plain_sent, walls, sent, prove, verify = [], [], [], [], [], []
    for _ in range(args.rounds + 1):
        noise = secure.normal((b, k), SIGMA)
        want = (hist / 256.0 + round_noise(noise, 8) >= p * m / 2.0).astype(np.int64)
        # Without a statement: plain ring shares of the votes, summed by both sides.
        t0 = time.perf_counter()
        seeds = [ring.new_seed() for _ in names]
        g_sum = np.sum(
            [ring.share(c.astype(np.uint64), s) for c, s in zip(counts, seeds, strict=True)], axis=0
        )
        s_sum = np.sum([ring.expand_seed(s, (b, k)) for s in seeds], axis=0)
        out = pair.run(circuit, spec.garbler_inputs(g_sum, noise), spec.evaluator_inputs(s_sum), b)
        plain_walls.append(time.perf_counter() - t0)
        correct &= bool(np.array_equal(spec.decode(out.evaluator), want))
        circuit_bytes = out.garbler_stats.bytes_sent + out.evaluator_stats.bytes_sent
        plain_sent.append(circuit_bytes + p * b * k * 8)
        # With the statement: every party proves, both verify, proven shares feed the circuit.
        t0 = time.perf_counter()
        shared = []
        for c in counts:
            seed = os.urandom(16)
            t1 = time.perf_counter()
            xg, pg = vp.guardian_shares(rel, rel.encode(c), seed)
            prove.append(time.perf_counter() - t1)
            xs, ps = vp.student_shares(seed, rel, b)
            shared.append((xg, pg, xs, ps))
        t1 = time.perf_counter()
        challenge = vp.Challenge.draw(os.urandom(24))
        g_bits = {n: s[0] for n, s in zip(names, shared, strict=True)}
        s_bits = {n: s[2] for n, s in zip(names, shared, strict=True)}
        constants = {n: np.full(b, m, dtype=np.uint64) for n in names}
        g = votes.verifier_shares(
            relations,
            challenge,
            names,
            g_bits,
            {n: s[1] for n, s in zip(names, shared, strict=True)},
            constants,
        )
        s = votes.verifier_shares(
            relations,
            challenge,
            names,
            s_bits,
            {n: s[3] for n, s in zip(names, shared, strict=True)},
        )
        ok = votes.accepted(relations, challenge, names, g, s)
        weights = dict.fromkeys(names, 1)
        g_sum = votes.proven_vote_sum(relations, g_bits, weights, student=False)
        s_sum = votes.proven_vote_sum(relations, s_bits, weights, student=True)
        verify.append(time.perf_counter() - t1)
        out = pair.run(circuit, spec.garbler_inputs(g_sum, noise), spec.evaluator_inputs(s_sum), b)
        walls.append(time.perf_counter() - t0 - sum(prove[-p:]) + max(prove[-p:]))
        correct &= all(ok.values()) and bool(np.array_equal(spec.decode(out.evaluator), want))
        shares_bytes = p * b * (rel.elements + rel.proof_elements) * 8
        verifier_bytes = s.wire.nbytes + s.combined.nbytes
        sent.append(
            out.garbler_stats.bytes_sent
            + out.evaluator_stats.bytes_sent
            + shares_bytes
            + verifier_bytes
        )
    return {
        "labels": k,
        "teachers_per_party": m,
        "tau": TAU,
        "elements_per_party_query": rel.elements,
        "proof_elements_per_party_query": rel.proof_elements,
        "statement_bytes_per_query": round(
            (p * (rel.elements + rel.proof_elements) * 8 * b + p * (b + 1) * 8) / b, 1
        ),
        "prove_s_per_party": round(median(prove), 4),
        "verify_s_both_sides": round(median(verify), 4),
        "bytes_per_query": round(median(sent) / b, 1),
        "bytes_per_query_without": round(median(plain_sent) / b, 1),
        "bytes_per_query_ratio": round(median(sent) / median(plain_sent), 3),
        "round_s": round(median(walls), 4),
        "round_s_without": round(median(plain_walls), 4),
        "round_s_ratio": round(median(walls) / median(plain_walls), 3),
        "correct": correct,
    }


def encrypted_cost(
    args: argparse.Namespace, pair: LocalPair, secure: SecureRandom
) -> dict[str, object]:
    k, b, p = args.classes, args.batch, args.parties
    rng = np.random.default_rng(7)
    vote = rng.integers(0, k, (b, p))
    one_hot = np.eye(k, dtype=np.uint64)[vote]  # (B, P, K)
    guardian = rng.integers(0, 2**63, one_hot.shape, dtype=np.uint64) << np.uint64(1)
    guardian |= rng.integers(0, 2, one_hot.shape, dtype=np.uint64)
    student = one_hot - guardian  # modulo 2^64, as the parties' 2PCs leave them
    hist = one_hot.sum(axis=1).astype(np.float64)
    kw = {"num_classes": k, "max_votes": p, "sigma": SIGMA, "confident": False}
    specs = {
        "sum": ConfidentGNMaxCircuit(**kw),
        "per_party": ConfidentGNMaxCircuit(**kw, vote_parties=p),
    }
    inputs = {
        "sum": (guardian.sum(axis=1, dtype=np.uint64), student.sum(axis=1, dtype=np.uint64)),
        "per_party": (guardian, student),
    }
    report: dict[str, dict[str, float]] = {}
    correct = True
    for name, spec in specs.items():
        circuit = spec.circuit()
        walls, sent = [], []
        for _ in range(args.rounds + 1):
            noise = secure.normal((b, k), SIGMA)
            g, s = inputs[name]
            t0 = time.perf_counter()
            out = pair.run(
                circuit,
                spec.garbler_inputs(g, noise, vote_total=float(p)),
                spec.evaluator_inputs(s),
                b,
            )
            walls.append(time.perf_counter() - t0)
            sent.append(out.garbler_stats.bytes_sent + out.evaluator_stats.bytes_sent)
            want = noisy_argmax(hist, round_noise(noise, spec.frac_bits))
            correct &= bool(np.array_equal(spec.decode(out.evaluator), want))
        report[name] = {
            "and_gates_per_query": circuit.num_and,
            "bytes_per_query": round(median(sent) / b, 1),
            "round_s": round(median(walls), 4),
        }
    per, total = report["per_party"], report["sum"]
    return {
        "classes": k,
        "circuit_with_per_party_check": per,
        "circuit_with_sum_only": total,
        "and_gates_ratio": round(per["and_gates_per_query"] / total["and_gates_per_query"], 3),
        "bytes_per_query_ratio": round(per["bytes_per_query"] / total["bytes_per_query"], 3),
        "round_s_ratio": round(per["round_s"] / total["round_s"], 3),
        "logits_to_shares_and_gates_per_party_query": LogitsToSharesCircuit(k, SHARE_BITS)
        .circuit()
        .num_and,
        "correct": correct,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--labels", type=int, default=5, help="tau voting's labels")
    ap.add_argument("--teachers", type=int, default=2, help="teachers per party under tau")
    ap.add_argument("--classes", type=int, default=10, help="encrypted mode's classes")
    ap.add_argument("--parties", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--all-cores", action="store_true", help="do not pin to one core")
    args = ap.parse_args()
    if not args.all_cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        threadpool_limits(1)
    pair = LocalPair()
    secure = SecureRandom()
    tau = tau_cost(args, pair, secure)
    encrypted = encrypted_cost(args, pair, secure)
    print(
        json.dumps(
            {
                "benchmark": "vote_statements",
                "batch": args.batch,
                "parties": args.parties,
                "rounds_timed": args.rounds,
                "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                "tau": tau,
                "encrypted": encrypted,
                "correct": bool(tau["correct"]) and bool(encrypted["correct"]),
            }
        )
    )


if __name__ == "__main__":
    main()
