"""Label-DP: accuracy against epsilon for ALIBI, PATE-FM and randomized response, with the
empirical epsilon of a canary attack beside the provable one (seeds/alibi-pate-fm.txt, Table 1).

For each seed: split the dataset (a fifth held out for testing), plant
100 canaries (training records given a random wrong label), train a body
by SimCLR on the training images (public under label-DP; one body serves
every method), then for each epsilon:

- ALIBI and randomized response fine-tune that body and a new head on the
  noisy labels (pure epsilon, delta 0);
- PATE-FM: FixMatch teacher heads on disjoint partitions (trained once per
  seed: they do not depend on epsilon), GNMax over their votes on k-means
  prototypes of the pool, as many queries as the budget admits if all
  were answered (fixed before any vote; the noise is raised until at
  least ``min_queries`` fit), accounted by exact Gaussian DP at delta
  1e-5, and a FixMatch student head.

Every row carries the test accuracy, the provable epsilon, and the canary
attack's counts with the empirical epsilon interval they give (95%
Clopper-Pearson; ALIBI and RR rows also the attack on their own noisy
release). :func:`summarise` and :func:`claims` recompute the table and the
claims from the rows; tests/unit/test_saved_labeldp_results.py checks the
saved results that way.

Run: python -m experiments.labeldp_table --dataset digits \
         --out experiments/results/labeldp-digits.json
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from capc.audit import bounds
from capc.labeldp import pipeline
from capc.labeldp.pipeline import DataConfig, PateFmSettings, PublicBodyConfig
from capc.learning.fixmatch import FixMatchConfig
from capc.privacy.randomness import SecureRandom
from experiments.report import save

EPSILONS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
METHODS = ("alibi", "rr", "pate-fm")


@dataclass(frozen=True)
class Setup:
    """Per dataset: the body, the ALIBI/RR epochs and PATE-FM's knobs."""

    body: PublicBodyConfig
    epochs: int
    pate: PateFmSettings
    subset: int | None = None


def _pate(teachers: int, sigma: float) -> PateFmSettings:
    fm = FixMatchConfig(steps=300, unlabelled_ratio=8, threshold=0.8)
    return PateFmSettings(
        teachers=teachers,
        sigma=sigma,
        sigma1=0.0,
        threshold=0.0,
        queries=400,
        min_queries=10,
        teacher=FixMatchConfig(steps=200, unlabelled_ratio=8),
        student=fm,
    )


SETUPS = {
    "digits": Setup(PublicBodyConfig(width=32, steps=300), 30, _pate(100, 0.17)),
    "animal-mnist": Setup(PublicBodyConfig(width=16, steps=300), 8, _pate(400, 0.1)),
}


@dataclass(frozen=True)
class Config:
    dataset: str = "digits"
    epsilons: tuple[float, ...] = EPSILONS
    methods: tuple[str, ...] = METHODS
    seeds: tuple[int, ...] = (0,)
    canaries: int = 100
    setup: Setup = field(default_factory=lambda: SETUPS["digits"])


def run(config: Config, cache: Path, out: Path | None = None) -> dict[str, Any]:
    """Every row of the table; saved to ``out`` after each row when given."""
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"config": _config_dict(config), "rows": rows}
    s = config.setup
    for seed in config.seeds:
        data = DataConfig(config.dataset, s.subset, canaries=config.canaries, seed=seed)
        split = pipeline.load(data)
        body = pipeline.public_body(split, replace(s.body, seed=seed), cache, _log)
        train = replace(pipeline.default_train_config(config.dataset, seed), epochs=s.epochs)
        features = teachers = None
        if "pate-fm" in config.methods:
            features = pipeline.pool_features(split, body, seed)
            teachers = pipeline.pate_teachers(split, features, s.pate, seed)
        for eps in config.epsilons:
            for method in config.methods:
                started = time.perf_counter()
                # Experiments replay their noise from a seed; a service never does.
                rng = SecureRandom.from_seed(f"labeldp/{config.dataset}/{seed}/{method}/{eps}")
                if method == "alibi":
                    row = pipeline.run_alibi(split, body, eps, train, rng)
                elif method == "rr":
                    row = pipeline.run_rr(split, body, eps, train, rng)
                elif features is not None:
                    row = pipeline.run_pate_fm(split, features, eps, s.pate, rng, seed, teachers)
                else:
                    raise RuntimeError("PATE-FM's pool features were not computed")
                row = {"dataset": config.dataset, "seed": seed, "budget": eps, **row}
                rows.append(row)
                _log(
                    f"{method} eps {eps}: accuracy {row['accuracy']:.3f}, provable "
                    f"{row['epsilon']:.3f}, empirical >= {row['audit']['lower']:.2f} "
                    f"({time.perf_counter() - started:.0f} s)"
                )
                result["table"] = summarise(rows)
                result["claims"] = claims(rows)
                if out is not None:
                    save_quietly(result, out)
    return result


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _config_dict(config: Config) -> dict[str, Any]:
    d = asdict(config)
    d["epsilons"] = list(config.epsilons)
    return d


def save_quietly(result: dict[str, Any], path: Path) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=float) + "\n")


def recomputed(audit: dict[str, Any]) -> bounds.EmpiricalEpsilon:
    """An audit's interval recomputed from its counts (what the saved numbers must equal)."""
    return bounds.empirical_epsilon(
        int(audit["correct"]),
        int(audit["guesses"]),
        int(audit["canaries"]),
        delta=float(audit["delta"]),
        confidence=float(audit["confidence"]),
    )


def audits(row: dict[str, Any]) -> dict[str, bounds.EmpiricalEpsilon]:
    """A row's audits by attack: the model's, and the release's and the release's
    floating-point support's where there are (rows saved before the support attack have
    none)."""
    out = {"model": recomputed(row["audit"])}
    if "release_audit" in row:
        out["release"] = recomputed(row["release_audit"])
    if "support_audit" in row:
        out["support"] = recomputed(row["support_audit"])
    return out


def refresh(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with every audit and flag recomputed from the counts by the current
    :mod:`capc.audit.bounds` (the counts themselves are what the runs measured)."""
    out = []
    for r in rows:
        a = audits(r)
        new = {**r, "audit": a["model"].to_dict()}
        if "release" in a:
            new["release_audit"] = a["release"].to_dict()
        if "support" in a:
            new["support_audit"] = a["support"].to_dict()
        new["flagged"] = any(e.exceeds(r["epsilon"]) for e in a.values())
        out.append(new)
    return out


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (method, budget): mean accuracy and provable epsilon over seeds, the model
    attack's pooled counts and the largest lower bound over seeds (95%), recomputed
    from the counts."""
    keys = sorted({(r["method"], r["budget"]) for r in rows}, key=lambda k: (k[0], k[1]))
    table = []
    for method, budget in keys:
        group = [r for r in rows if r["method"] == method and r["budget"] == budget]
        found = [audits(r) for r in group]
        worst = max(found, key=lambda a: a["model"].lower)["model"]
        entry: dict[str, Any] = {
            "method": method,
            "budget": budget,
            "seeds": len(group),
            "accuracy": float(np.mean([r["accuracy"] for r in group])),
            "epsilon": float(np.mean([r["epsilon"] for r in group])),
            "empirical_lower": worst.lower,
            "empirical_upper": None if math.isinf(worst.upper) else worst.upper,
            "guesses": sum(a["model"].guesses for a in found),
            "correct": sum(a["model"].correct for a in found),
            "refuted": any(
                e.exceeds(r["epsilon"])
                for r, a in zip(group, found, strict=True)
                for e in a.values()
            ),
        }
        if all("release" in a for a in found):
            entry["release_lower"] = max(a["release"].lower for a in found)
        if method == "pate-fm":
            entry["queries"] = float(np.mean([r["queries"] for r in group]))
            entry["label_accuracy"] = float(np.mean([r["label_accuracy"] for r in group]))
        table.append(entry)
    return table


def _accuracy(table: Sequence[dict[str, Any]], method: str, budget: float) -> float | None:
    for t in table:
        if t["method"] == method and t["budget"] == budget:
            return float(t["accuracy"])
    return None


def claims(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the results say, recomputed from the rows alone."""
    table = summarise(rows)
    budgets = sorted({r["budget"] for r in rows})
    found = [(r, audits(r)) for r in rows]
    out: dict[str, Any] = {
        "no_audit_refutes_a_claim": not any(
            e.exceeds(r["epsilon"]) for r, a in found for e in a.values()
        ),
        # A 95% lower bound of an exact attack exceeds a true claim 2.5% of the time.
        "lower_bounds_above_claim_at_95": [
            {"method": r["method"], "seed": r["seed"], "budget": r["budget"], "attack": k}
            for r, a in found
            for k, e in a.items()
            if e.lower > r["epsilon"]
        ],
        "audits": sum(len(a) for _, a in found),
    }
    both = [
        b
        for b in budgets
        if _accuracy(table, "alibi", b) is not None and _accuracy(table, "pate-fm", b) is not None
    ]
    if both:
        out["pate_fm_ahead_at"] = [
            b
            for b in both
            if (_accuracy(table, "pate-fm", b) or 0) > (_accuracy(table, "alibi", b) or 0)
        ]
        out["alibi_ahead_at"] = [
            b
            for b in both
            if (_accuracy(table, "alibi", b) or 0) >= (_accuracy(table, "pate-fm", b) or 0)
        ]
        out["alibi_ahead_at_the_largest_epsilon"] = max(both) in out["alibi_ahead_at"]
        out["pate_fm_ahead_at_the_smallest_epsilon"] = min(both) in out["pate_fm_ahead_at"]

        def pooled(method: str) -> float:
            mine = [a["model"] for r, a in found if r["method"] == method]
            guesses = sum(e.guesses for e in mine)
            return sum(e.correct for e in mine) / guesses if guesses else 0.5

        # The model attack's accuracy over every guess of a method (0.5 is chance).
        out["pooled_attack_accuracy"] = {m: pooled(m) for m in ("alibi", "pate-fm")}
        out["pate_fm_leaks_less_empirically"] = pooled("pate-fm") <= pooled("alibi")
        # Table 1's view: match each PATE-FM row with the cheapest ALIBI row at least as
        # accurate, and set their provable and empirical epsilons side by side.
        matched = []
        for t in table:
            if t["method"] != "pate-fm":
                continue
            better = [a for a in table if a["method"] == "alibi" and a["accuracy"] >= t["accuracy"]]
            if better:
                a = min(better, key=lambda x: x["budget"])
                matched.append(
                    {
                        "pate_fm_budget": t["budget"],
                        "pate_fm_accuracy": t["accuracy"],
                        "pate_fm_epsilon": t["epsilon"],
                        "alibi_budget": a["budget"],
                        "alibi_accuracy": a["accuracy"],
                        "alibi_epsilon": a["epsilon"],
                    }
                )
        out["matched_by_accuracy"] = matched
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", choices=tuple(SETUPS), default="digits")
    p.add_argument(
        "--epsilons", default=",".join(str(e) for e in EPSILONS), help="comma-separated, nats"
    )
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--canaries", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="tiny settings, for a smoke test")
    p.add_argument("--cache", type=Path, default=Path(".capc-cache"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--refresh",
        action="store_true",
        help="recompute the audits, table and claims of the saved --out file from its counts",
    )
    args = p.parse_args(argv)
    if args.refresh:
        import json

        saved = json.loads(args.out.read_text())
        saved["rows"] = refresh(saved["rows"])
        saved["table"], saved["claims"] = summarise(saved["rows"]), claims(saved["rows"])
        save(saved, args.out)
        return 0
    methods = tuple(m for m in args.methods.split(",") if m)
    if not methods or any(m not in METHODS for m in methods):
        p.error(f"--methods: choose from {', '.join(METHODS)}")
    setup = SETUPS[args.dataset]
    if args.quick:
        quick = FixMatchConfig(steps=20, unlabelled_ratio=2)
        setup = replace(
            setup,
            body=replace(setup.body, steps=20),
            epochs=1,
            subset=300,
            pate=replace(setup.pate, teachers=10, teacher=quick, student=quick, min_queries=2),
        )
    config = Config(
        dataset=args.dataset,
        epsilons=tuple(float(e) for e in args.epsilons.split(",") if e),
        methods=methods,
        seeds=tuple(range(args.first_seed, args.first_seed + args.seeds)),
        canaries=20 if args.quick else args.canaries,
        setup=setup,
    )
    result = run(config, args.cache, args.out)
    save(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
