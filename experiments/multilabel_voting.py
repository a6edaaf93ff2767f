"""Binary vs tau vs Powerset voting at equal epsilon on animal-attributes.

Central-mode simulation: n teachers (small CNNs) trained on disjoint parts of
animal-attributes (five attributes per animal-mnist image) vote on held-out
images. For each epsilon (delta = 1e-5) and each mechanism, the noise is the
one that lets a target number of queries fit the budget with the
data-independent charges the guardian uses (capc.privacy.planning), so every
mechanism spends the same epsilon; we then report how many labels that
budget answers at a common noise, and the label quality at the planned
noise on the held-out pool, labelled as a consortium would: one central round
(capc.round.central, oracle mode) in which one party holds the ensemble and
the guardian draws the mechanism's own noise (seeded streams):

- ``labels_at_equal_sigma``: k labels per query times the queries that fit
  the budget when every mechanism uses the same sigma (Powerset's sqrt(2)
  sensitivity against Binary's sqrt(k) and tau's sqrt(2) tau);
- ``quality``: per-label accuracy, balanced accuracy (mean of per-label
  true-positive and true-negative rates), mAP (average precision per label
  of the released 0/1 labels, averaged over labels) and exact-match rate,
  at the sigma that fits ``--queries`` queries.

The advisor's choice (capc.planning.advisor) from the label statistics of the
teachers' own training labels is reported beside the measured best.

Run: python -m experiments.multilabel_voting [--teachers 50] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.metrics import average_precision_score

from capc.data.multilabel import animal_attributes
from capc.data.offline import partition
from capc.learning.teachers import fit_scratch_teachers
from capc.mechanisms import Mechanism, from_config
from capc.models.ensemble import Voters
from capc.planning.advisor import TAU_MARGIN, LabelStatistics, recommend
from capc.privacy import planning
from capc.privacy.accountants import RenyiDp
from capc.privacy.conversion import DEFAULT_ORDERS
from capc.privacy.randomness import SecureRandom
from capc.round.central import UNCAPPED, CentralDriver
from capc.round.task import MechanismTask
from experiments.report import save

DELTA = 1e-5
#: The guardian's noise streams: this, the mechanism and the seed's number.
SEED = "multilabel-voting"


def quality(pred: NDArray[np.int8], truth: NDArray[np.int8]) -> dict[str, float]:
    """Label quality of (N, k) 0/1 predictions against (N, k) truth."""
    tp = ((pred == 1) & (truth == 1)).sum(axis=0)
    tn = ((pred == 0) & (truth == 0)).sum(axis=0)
    pos, neg = truth.sum(axis=0), (1 - truth).sum(axis=0)
    balanced = 0.5 * (tp / np.maximum(pos, 1) + tn / np.maximum(neg, 1))
    ap = [
        average_precision_score(truth[:, j], pred[:, j])
        for j in range(truth.shape[1])
        if 0 < truth[:, j].sum() < len(truth)
    ]
    return {
        "per_label_accuracy": float((pred == truth).mean()),
        "balanced_accuracy": float(balanced.mean()),
        "mAP": float(np.mean(ap)),
        "exact_match": float((pred == truth).all(axis=1).mean()),
    }


def decide(mech: Mechanism, votes: NDArray[np.int64], rng: SecureRandom) -> NDArray[np.int8]:
    """(B, teachers, k) votes -> (B, k) labels under ``mech``: one central round (oracle
    mode) whose one party holds the ensemble, the guardian's noise from ``rng``."""
    task = MechanismTask("multilabel-voting", mech)
    driver = CentralDriver(task, {"ensemble": UNCAPPED}, rng=rng, mode="oracle")
    return driver.label({"ensemble": votes}).labels.astype(np.int8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teachers", type=int, default=50)
    ap.add_argument("--queries", type=int, default=250, help="queries the budget must cover")
    ap.add_argument("--sigma", type=float, default=10.0, help="common sigma for label counts")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=3, help="noise seeds averaged")
    ap.add_argument(
        "--held-out", type=int, default=2000, help="records held out and labelled (queries)"
    )
    ap.add_argument("--out", type=Path, default=Path("experiments/results/multilabel_voting.json"))
    args = ap.parse_args()
    if not 1 <= args.held_out <= 2000:
        ap.error(f"--held-out takes 1 to 2000 records, not {args.held_out}")
    start = time.perf_counter()
    x, y = animal_attributes()
    order = np.random.default_rng(0).permutation(len(x))
    # The teachers always train on the same records, whatever --held-out labels.
    held, train = order[: args.held_out], order[2000:]
    parts = [train[p] for p in partition(len(train), args.teachers, seed=0)]
    teachers = fit_scratch_teachers(
        x, y, parts, architecture="small-cnn", outputs=int(y.shape[1]), epochs=args.epochs
    )
    votes = Voters(teachers).predict(x[held]).astype(np.int64)
    truth = y[held].astype(np.int8)
    k, n = y.shape[1], args.teachers
    stats = LabelStatistics.from_labels(y[train])
    tau = min(TAU_MARGIN * max(stats.mean_l2, 1.0), math.sqrt(k))
    specs = {
        "binary": from_config({"name": "binary", "sigma": 1.0}, k),
        "tau": from_config({"name": "tau", "sigma": 1.0, "tau": tau}, k),
        "powerset": from_config({"name": "powerset", "sigma": 1.0}, k),
    }
    teacher_quality = quality(votes.mean(axis=1).round().astype(np.int8), truth)
    rows: dict[str, Any] = {}
    for eps in (2.0, 5.0, 10.0):
        row: dict[str, Any] = {}
        for name, spec in specs.items():
            # at sigma 1; scales as 1 / sigma**2
            unit = RenyiDp(DEFAULT_ORDERS).cost(spec.worst_case(1))
            sigma = planning.noise_scale_for(unit, DEFAULT_ORDERS, args.queries, eps, DELTA)
            fit_common = planning.max_queries(unit / args.sigma**2, DEFAULT_ORDERS, eps, DELTA)
            mech = from_config({**spec.to_config(), "sigma": sigma}, k)
            runs = [
                quality(decide(mech, votes, SecureRandom.from_seed(f"{SEED}-{name}-{s}")), truth)
                for s in range(args.seeds)
            ]
            row[name] = {
                "sigma_for_queries": sigma,
                "labels_at_equal_sigma": fit_common * k,
                "quality": {m: float(np.mean([r[m] for r in runs])) for m in runs[0]},
                "quality_std": {m: float(np.std([r[m] for r in runs])) for m in runs[0]},
            }
        best = max(row, key=lambda m: row[m]["quality"]["exact_match"])
        advice = recommend(stats, n, args.queries, eps, DELTA)
        rows[f"eps={eps:g}"] = {
            **row,
            "measured_best_exact_match": best,
            "advisor": advice.best.mechanism,
        }
    out = {
        "experiment": "multi-label voting at equal epsilon (central-mode simulation)",
        "dataset": "animal-attributes (animal-mnist, 5 attributes per class)",
        "teachers": n,
        "held_out_queries": len(held),
        "planned_queries": args.queries,
        "common_sigma": args.sigma,
        "tau": tau,
        "delta": DELTA,
        "label_statistics": vars(stats),
        "plaintext_majority_quality": teacher_quality,
        "results": rows,
        "seconds": round(time.perf_counter() - start, 1),
    }
    save(out, args.out)


if __name__ == "__main__":
    main()
