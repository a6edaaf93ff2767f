"""DIET-CaPC through the networked services at eps 5, 8 and 10 (issue 35, item 6).

For every seed, one consortium of separate processes over mutual TLS (the
guardian with its ledger, H hospitals hosting m last-layer teachers each on
disjoint parts of their animal-mnist images, the student party and the
gateway), driven as an analyst and a data-protection officer drive it,
through the REST API (capc_client):

1. every hospital sets its own cap to the first budget (eps 5);
2. the analyst reads how many whole rounds every cap still covers (the
   ledger's data-independent plan, never the votes), labels that many
   Gaussian-noise queries, trains the student on every job so far and reads
   its held-out accuracy; the ledger's epsilon of every hospital is recorded;
3. every hospital raises its own cap to the next budget (8, then 10; its
   configuration and a restart, audited), and step 2 runs again on fresh
   queries. The guardian's operator registered each at the largest budget.

So, as in the central-mode experiment, the labels at eps 8 are those at eps
5 plus more, and every hospital's total stays within the cap of its row by
the ledger's exact Gaussian-DP accountant. One row per (seed, budget); the
summary is the mean and standard deviation over seeds.

Run (defaults: 5 hospitals x 50 teachers, the demo's shipped body, 3 seeds):
    python -m experiments.diet_services --out experiments/results/diet-services.json
    # three more seeds, added to the saved rows:
    python -m experiments.diet_services --out experiments/results/diet-services.json \
        --first-seed 4 --add-to
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from capc.learning.diet import BodyConfig, pretrained_body, save_body
from capc.learning.simclr import PretrainConfig
from capc.models import load_teacher
from capc.models.checkpoint import weights_sha256
from experiments.report import save
from services.commands.demo import DEMO_BATCH, DEMO_TEST, SHIPPED_BODY, demo_task
from services.local import LocalConsortium

DELTA = 1e-5


@dataclass(frozen=True)
class Config:
    """One run: the consortium, its budgets (eps at ``DELTA``, raised in turn) and seeds."""

    hospitals: int = 5
    teachers: int = 50
    budgets: tuple[float, ...] = (5.0, 8.0, 10.0)
    seeds: tuple[int, ...] = (1, 2, 3)
    batch: int = DEMO_BATCH
    test: int = DEMO_TEST
    generator: str = "gaussian"
    body: str = str(SHIPPED_BODY)
    #: A small body pretrained here instead (smoke tests): its width and steps.
    quick_body: tuple[int, int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if list(self.budgets) != sorted(set(self.budgets)) or min(self.budgets) <= 0:
            raise ValueError("budgets must be positive and increasing: each raises the caps")
        if self.hospitals < 1 or self.teachers < 1 or not self.seeds:
            raise ValueError("need at least one hospital, one teacher and one seed")


def _body(config: Config, work: Path) -> Path:
    if config.quick_body is None:
        return Path(config.body)
    width, steps = config.quick_body
    body = BodyConfig(width=width, pool=1024, pretrain=PretrainConfig(steps=steps, batch=64))
    path = work / "body.pt"
    save_body(path, pretrained_body(body, None, 10, lambda s: None, "cpu"), body)
    return path


def run_seed(config: Config, seed: int, body: Path, work: Path) -> list[dict[str, Any]]:
    """Every budget's row for one seed (one consortium, caps raised in turn)."""
    from capc_client import Client

    total = config.hospitals * config.teachers
    consortium = LocalConsortium(
        work / f"seed-{seed}",
        parties=config.hospitals,
        task=demo_task(total),
        body=body,
        teachers=[config.teachers] * config.hospitals,
        held_out=config.test,
        split_seed=seed,
        epsilon_cap=config.budgets[0],
        # The guardian operator's ceiling: each hospital raises its own cap up to it.
        registered_caps=[max(config.budgets)] * config.hospitals,
    )
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    consortium.prepare()
    try:
        consortium.start()
        consortium.start_student()
        consortium.start_gateway()
        url, ca = consortium.gateway_url, consortium.ca
        analyst = Client(url, consortium.token("analyst", "experiment"), ca=ca, timeout=600)
        officer = Client(url, consortium.token("admin", "experiment"), ca=ca, timeout=600)
        jobs: list[str] = []
        queried = 0
        for budget in config.budgets:
            # Each hospital raises its own cap (its configuration, then a restart); nobody
            # on the querier's side can.
            for i in range(config.hospitals):
                if consortium.cap(i) != budget:
                    consortium.restart_party(i, budget)
            covered = min(int(b.queries_left or 0) for b in officer.budgets().budgets)
            count = (covered // config.batch) * config.batch
            if count:
                # Fresh queries of the same generator: the next index range of this seed's.
                job = analyst.submit_recipe(
                    config.generator,
                    count,
                    seed=seed,
                    start=queried,
                    batch_size=config.batch,
                )
                job = analyst.wait(job.id, timeout=3600)
                if job.state != "done":
                    raise RuntimeError(f"seed {seed}, eps {budget}: the job {job.error}")
                jobs.append(job.id)
                queried += count
            model = analyst.wait_model(analyst.train(jobs).id, timeout=3600)
            if model.state != "done":
                raise RuntimeError(f"seed {seed}, eps {budget}: training {model.error}")
            spent = {b.party: b.epsilon_spent for b in officer.budgets().budgets}
            answered = sum(analyst.job(j).answered for j in jobs)
            rows.append(
                {
                    "seed": seed,
                    "epsilon": budget,
                    "delta": officer.budgets().delta,
                    "hospitals": config.hospitals,
                    "teachers": total,
                    "queries": queried,
                    "answered": answered,
                    "epsilon_spent": spent,
                    "student_accuracy": float(model.metrics["test_accuracy"]),
                    "test_examples": int(model.metrics["test_examples"]),
                    "seconds": time.perf_counter() - start,
                }
            )
            print(
                f"seed {seed} eps {budget:g}: {answered} labels, student "
                f"{rows[-1]['student_accuracy']:.3f}, largest spend {max(spent.values()):.3f}",
                flush=True,
            )
    finally:
        consortium.stop()
    return rows


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per budget: seeds, mean and standard deviation of the labels and the student's
    accuracy, and the largest epsilon any hospital spent (nats, at the rows' delta)."""
    out = []
    for budget in sorted({r["epsilon"] for r in rows}):
        rs = [r for r in rows if r["epsilon"] == budget]
        acc = np.array([r["student_accuracy"] for r in rs], dtype=np.float64)
        out.append(
            {
                "epsilon": budget,
                "seeds": len(rs),
                "hospitals": rs[0]["hospitals"],
                "teachers": rs[0]["teachers"],
                "answered": float(np.mean([r["answered"] for r in rs])),
                "student_accuracy": float(acc.mean()),
                "student_accuracy_std": float(acc.std()),
                "largest_epsilon_spent": max(max(r["epsilon_spent"].values()) for r in rs),
            }
        )
    return out


def run(config: Config, work: Path) -> dict[str, Any]:
    start = time.perf_counter()
    body = _body(config, work)
    rows = [row for seed in config.seeds for row in run_seed(config, seed, body, work)]
    features = load_teacher(body).model.features
    return {
        "experiment": "diet_services",
        "config": asdict(config),
        "body_file_sha256": hashlib.sha256(body.read_bytes()).hexdigest(),
        "body_sha256": weights_sha256(features),
        "rows": rows,
        "summary": summarise(rows),
        "seconds": time.perf_counter() - start,
    }


def merged(saved: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with ``new``'s rows added: both runs must share every setting but their
    seeds, which must not overlap, and the same body; the summary is recomputed."""
    # As saved: JSON has lists where a fresh run has tuples.
    a, b = json.loads(json.dumps(saved["config"])), json.loads(json.dumps(new["config"]))
    seeds = [*a.pop("seeds"), *b.pop("seeds")]
    if a != b or saved["body_sha256"] != new["body_sha256"]:
        raise ValueError("only runs of one configuration on one body can be merged")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"the runs share seeds: {sorted(seeds)}")
    rows = [*saved["rows"], *new["rows"]]
    return {
        **saved,
        "config": {**saved["config"], "seeds": seeds},
        "rows": rows,
        "summary": summarise(rows),
        "seconds": saved["seconds"] + new["seconds"],
    }


def format_table(result: dict[str, Any]) -> str:
    """The summary as the markdown table the README and docs/results.md show."""
    lines = [
        "| eps (delta 1e-5) | hospitals | teachers | labels | student accuracy | largest eps spent |",
        "|---|---|---|---|---|---|",
    ]
    for s in result["summary"]:
        lines.append(
            f"| {s['epsilon']:g} | {s['hospitals']} | {s['teachers']} | {s['answered']:.0f} | "
            f"{s['student_accuracy']:.3f} +- {s['student_accuracy_std']:.3f} | "
            f"{s['largest_epsilon_spent']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--hospitals", type=int, default=Config.hospitals)
    ap.add_argument("--teachers", type=int, default=Config.teachers, help="per hospital")
    ap.add_argument(
        "--budgets", default=",".join(f"{b:g}" for b in Config.budgets), help="eps, increasing"
    )
    ap.add_argument("--seeds", type=int, default=len(Config().seeds))
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--body", type=Path, default=SHIPPED_BODY)
    ap.add_argument("--test", type=int, default=DEMO_TEST, help="held-out test images")
    ap.add_argument(
        "--quick", action="store_true", help="a small body pretrained here (a smoke test)"
    )
    ap.add_argument("--work", type=Path, default=None, help="keep the consortia here")
    ap.add_argument(
        "--add-to",
        action="store_true",
        help="add these seeds' rows to the result already saved at --out (same configuration)",
    )
    args = ap.parse_args(argv)
    config = Config(
        hospitals=args.hospitals,
        teachers=args.teachers,
        budgets=tuple(float(b) for b in args.budgets.split(",")),
        seeds=tuple(range(args.first_seed, args.first_seed + args.seeds)),
        test=args.test,
        body=str(args.body),
        quick_body=(4, 20) if args.quick else None,
    )
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        result = run(config, args.work)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = run(config, Path(tmp))
    if args.add_to:
        result = merged(json.loads(args.out.read_text()), result)
    save(result, args.out)
    print(format_table(result))
    return 0 if all(math.isfinite(r["student_accuracy"]) for r in result["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
