"""The benchmark scripts run and report correct results (timings are not asserted)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from services.testbed import netlab

ROOT = Path(__file__).resolve().parents[2]


def bench(args: list[str], timeout: int) -> str:
    """Run one benchmark script; its stdout, or a failure that shows its stderr."""
    out = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, f"{args[0]} exited {out.returncode}:\n{out.stderr[-4000:]}"
    return out.stdout


def test_secure_argmax_benchmark_reports_correct_outputs() -> None:
    out = bench(
        [
            "benchmarks/secure_argmax.py",
            "--batch",
            "64",
            "--parties",
            "12",
            "--rounds",
            "1",
        ],
        timeout=300,
    )
    report = json.loads(out)
    assert report["correct"] is True
    for key in (
        "queries_per_s",
        "and_gates_per_query",
        "bytes_per_query",
        "garble_s",
        "evaluate_s",
        "ot_s",
        "base_ot_s",
    ):
        assert report[key] > 0, key


@pytest.mark.slow
def test_consortium_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    # Over an emulated link too where network namespaces can be made (root, iproute2).
    link = [] if netlab.unavailable() else ["--link", "100mbit:20ms"]
    out = bench(
        [
            "benchmarks/consortium.py",
            "--parties",
            "3",
            "--queries",
            "64",
            "--batch",
            "32",
            # teachers of one epoch: the test checks that it runs, not how well they label
            "--epochs",
            "1",
            "--dir",
            str(tmp_path),
            *link,
        ],
        timeout=600,
    )
    report = json.loads(out.strip().splitlines()[-1])
    assert report["rounds"] == 2 and report["queries_per_s"] > 0 and report["secure_over_plain"] > 0
    if link:
        assert report["link"] == "100mbit:20ms" and report["link_rounds"] == 2
        assert report["link_queries_per_s"] > 0 and report["link_bytes_per_query"] > 0


def test_diet_throughput_benchmark_reports_every_generator_and_inference() -> None:
    out = bench(
        [
            "benchmarks/diet_throughput.py",
            "--images",
            "16",
            "--batch",
            "64",
            "--repeat",
            "1",
            "--widths",
            "4",
            "--steps",
            "1",
            "--pretrain-batch",
            "16",
        ],
        timeout=300,
    )
    rows = [json.loads(line) for line in out.splitlines()]
    generators = {r["generator"] for r in rows if r["bench"] == "generator"}
    assert generators == {"gaussian", "spectral", "dead_leaves", "fractal", "mix"}
    inference = [r for r in rows if r["bench"] == "teacher_inference"]
    assert inference and all(r["images_per_s_current_statistics"] > 0 for r in inference)
    (votes,) = [r for r in rows if r["bench"] == "ensemble_votes"]
    assert votes["teachers"] == 250 and votes["queries"] == 64
    assert votes["queries_per_s_from_features"] > 0 and votes["from_features_speedup"] > 0
    steps = [r for r in rows if r["bench"] == "pretraining_step"]
    assert steps and all(r["width"] == 4 and r["bf16_speedup"] > 0 for r in steps)


@pytest.mark.slow
def test_encrypted_inference_benchmark_reports_every_key() -> None:
    out = bench(
        [
            "benchmarks/encrypted_inference.py",
            "--epochs",
            "1",
            "--batch",
            "32",
            "--single",
            "1",
        ],
        timeout=600,
    )
    report = json.loads(out)
    for key in (
        "single_query_s",
        "batched_queries_per_s",
        "encrypt_s",
        "evaluate_s",
        "decrypt_s",
        "ciphertext_bytes",
        "context_bytes",
    ):
        assert report[key] > 0, key
    assert report["security_bits"] == 128
    assert report["argmax_agreement"] >= 0.95 and report["single_argmax_agreement"] == 1.0


@pytest.mark.slow
def test_scale_benchmark_reports_round_latency_per_party_count(tmp_path: Path) -> None:
    out = bench(
        [
            "benchmarks/scale.py",
            "--parties",
            "2,4",
            "--rounds",
            "2",
            "--batch",
            "8",
            "--per-process",
            "2",
            "--idle-s",
            "1",
            "--dir",
            str(tmp_path),
        ],
        timeout=600,
    )
    rows = [json.loads(line) for line in out.strip().splitlines()]
    assert [r["parties"] for r in rows] == [2, 4] and [r["processes"] for r in rows] == [1, 2]
    for r in rows:
        assert r["round_p50_s"] > 0 and r["queries_per_s"] > 0 and r["guardian_rss_mib"] > 0
        # CPU above the idle consortium's: a difference of two readings, so only finite.
        assert math.isfinite(r["guardian_cpu_s_per_round"])
        assert math.isfinite(r["party_cpu_ms_per_round"])
        assert set(r["idle_cores"]) == {"guardian", "parties"}


def test_vote_statements_benchmark_reports_costs_beside_correct_outputs() -> None:
    out = bench(
        ["benchmarks/vote_statements.py", "--batch", "32", "--parties", "3", "--rounds", "1"],
        timeout=300,
    )
    report = json.loads(out)
    assert report["correct"] is True
    tau, encrypted = report["tau"], report["encrypted"]
    # The statement adds bytes and time: its costs are measured, not assumed.
    assert tau["bytes_per_query"] > tau["bytes_per_query_without"] > 0
    assert tau["prove_s_per_party"] > 0 and tau["verify_s_both_sides"] > 0
    per, total = encrypted["circuit_with_per_party_check"], encrypted["circuit_with_sum_only"]
    assert per["and_gates_per_query"] > 0 and total["and_gates_per_query"] > 0
    assert encrypted["and_gates_ratio"] == round(
        per["and_gates_per_query"] / total["and_gates_per_query"], 3
    )


def test_own_ledger_benchmark_settles_every_round_and_reports_its_cpu() -> None:
    out = bench(["benchmarks/own_ledger.py", "--rounds", "20", "--batch", "16"], timeout=300)
    report = json.loads(out)
    assert report["rounds"] == 20 and report["cpu_ms_per_round"] > 0
    parts = report["admit_cpu_ms"] + report["settle_cpu_ms"] + report["report_cpu_ms"]
    assert abs(parts - report["cpu_ms_per_round"]) < 0.01
    # Four entries at connection (party, guardian key, head, task), four a round (reserve,
    # release, the guardian's head, commit): every round was settled and audited.
    assert report["audit_entries"] == 4 + 4 * 20


def test_round_core_scale_benchmark_settles_every_party_and_splits_its_time() -> None:
    out = bench(
        ["benchmarks/round_core_scale.py", "--parties", "2", "6", "--rounds", "2", "--batch", "8"],
        timeout=300,
    )
    report = json.loads(out)
    assert [r["parties"] for r in report["runs"]] == [2, 6]
    for r in report["runs"]:
        assert r["ledgers_agree"] is True
        assert abs(sum(r["guardian_split"].values()) - 1) < 0.01
        assert set(r["guardian_split"]) == {
            "guardian_open",
            "guardian_receive",
            "guardian_close",
            "guardian_check",
            "guardian_release_charge",
        }
        assert r["party_ms_per_round"] > 0 and r["student_ms_per_round"] > 0
