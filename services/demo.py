"""``capc demo``: what a newcomer sees first.

Until the consortium services exist, the demo walks through the privacy
accounting of a sample labelling plan: three hospitals with personalized caps,
Confident-GNMax over simulated teacher votes, each hospital's spend, and how
data-dependent accounting compares with the data-independent default.
"""

from __future__ import annotations

import argparse

import numpy as np

from capc.privacy import events, planning
from capc.privacy.accountant import Accountant, Budget
from capc.privacy.conversion import DEFAULT_ORDERS
from capc.privacy.mechanisms import confident_gnmax
from capc.privacy.randomness import SecureRandom

HOSPITALS = {"hospital-a": 4.0, "hospital-b": 6.0, "hospital-c": 8.0}
TEACHERS, CLASSES, QUERIES = 250, 10, 400
THRESHOLD, SIGMA1, SIGMA2, DELTA = 200.0, 150.0, 40.0, 1e-5


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``capc demo``."""
    p = sub.add_parser("demo", help="walk through a sample labelling plan and its privacy cost")
    p.add_argument("--seed", default="capc-demo", help="seed of the simulated votes and noise")
    p.set_defaults(handler=run)


def _simulated_votes(rng: SecureRandom) -> np.ndarray:
    # Teachers agree on most queries and split on some, as trained ensembles do.
    truth = (rng.uint64(QUERIES) % np.uint64(CLASSES)).astype(np.int64)
    accuracy = np.where(rng.uniform(QUERIES) < 0.8, 0.95, 0.45)
    correct = rng.uniform((QUERIES, TEACHERS)) < accuracy[:, None]
    wrong = (rng.uint64((QUERIES, TEACHERS)) % np.uint64(CLASSES)).astype(np.int64)
    labels = np.where(correct, truth[:, None], wrong)
    hist = np.zeros((QUERIES, CLASSES))
    np.add.at(hist, (np.repeat(np.arange(QUERIES), TEACHERS), labels.ravel()), 1.0)
    return hist


def run(args: argparse.Namespace) -> int:
    """Print the walk-through."""
    rng = SecureRandom.from_seed(args.seed)
    votes = _simulated_votes(rng)
    result = confident_gnmax(votes, THRESHOLD, SIGMA1, SIGMA2, rng)
    answered = int(result.answered.sum())
    print(
        f"capc demo: {QUERIES} queries, {TEACHERS} teachers, Confident-GNMax "
        f"(T={THRESHOLD:g}, sigma1={SIGMA1:g}, sigma2={SIGMA2:g}), delta={DELTA:g}"
    )
    print(f"answered {answered} of {QUERIES} queries\n")

    per_query = events.threshold_test(THRESHOLD, SIGMA1).rdp + events.gnmax(SIGMA2).rdp
    print("How many answered queries each hospital's cap allows (data-independent):")
    for name, cap in HOSPITALS.items():
        n = planning.max_queries(per_query, DEFAULT_ORDERS, cap, DELTA)
        print(f"  {name}: cap epsilon {cap:g} -> {n} queries")
    print()

    print("Each hospital's ledger after this run (data-independent, the distributed default):")
    for name, cap in HOSPITALS.items():
        acc = Accountant(name)
        budget = Budget(cap, DELTA)
        acc.compose(events.threshold_test(THRESHOLD, SIGMA1), QUERIES, budget=budget)
        acc.compose(events.gnmax(SIGMA2), answered, budget=budget)
        print(acc.report(DELTA, budget).to_text())
    print()

    dd = Accountant("central mode, data-dependent")
    for v, a in zip(votes, result.answered, strict=True):
        dd.compose(events.threshold_test(THRESHOLD, SIGMA1, votes=v))
        if a:
            dd.compose(events.gnmax(SIGMA2, votes=v))
    print("The same run with data-dependent accounting (needs the histograms; central mode only):")
    print(dd.report(DELTA).to_text())
    return 0
