"""What limits the DIET student: the privacy noise, the draw of queries, or the teachers?

Central mode, plain GNMax with exact Gaussian-DP accounting at one epsilon
(delta 1e-5), in the configuration docs/diet.md reports (250 teachers on
animal-mnist, Gaussian queries under current statistics, sigma2 = 16 votes
per 100 teachers, student L2 0.01). For each seed the teachers are fitted
once; then for each of ``--query-draws`` sets of Gaussian queries:

- the labels are drawn ``--noise-draws`` times with fresh GNMax noise and a
  student is fitted on each (draw 0 is the one ``capc diet run`` makes);
- one more student is fitted on the teachers' noiseless majority over the
  same answered queries: what the student would reach if the noise cost
  nothing, which no privacy budget buys.

It reports the means, the spread over noise draws on one query set, the
spread over query sets, and the teachers' noiseless majority on the real
test images (current statistics, as the teachers see the queries).

Run: python -m experiments.diet_label_noise [--seeds 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from capc.learning.diet import (
    DietConfig,
    load_images,
    noise_stream,
    pretrained_body,
    query_recipe,
    quick,
    split_hospitals,
    student_accuracies,
)
from capc.learning.pate import ConfidentParams, label_within_budgets
from capc.learning.teachers import fit_head_ensemble
from capc.models.checkpoint import weights_sha256
from capc.models.inference import features
from capc.models.registry import Classifier
from experiments.report import save


def seed_students(
    config: DietConfig,
    seed: int,
    body: Classifier,
    x: NDArray[np.float32],
    y: NDArray[np.int64],
    query_draws: int,
    noise_draws: int,
) -> dict[str, Any]:
    """One seed's students: ``noisy`` (query_draws, noise_draws) and ``noiseless`` (query_draws,)
    test accuracies (fractions), the answered counts and the teachers' majority."""
    test, parts, _ = split_hospitals(y, config, seed)
    classes = body.head.out_features
    ensemble = fit_head_ensemble(
        body,
        x,
        y,
        parts,
        architecture=config.body.architecture,
        width=config.body.width,
        l2=config.teacher_l2,
    )
    test_feats = features(body, x[test], current_statistics=True, batch=config.batch)
    test_votes = ensemble.predict_features(test_feats)
    voting = config.voting(classes)
    majority = float((voting.summed_votes(test_votes).argmax(1) == y[test]).mean())
    (epsilon,) = config.epsilons
    noisy, noiseless, answered, agreement = [], [], [], []
    for q in range(query_draws):
        queries = query_recipe(config, seed, 0, draw=q).generate()
        qf = features(body, queries, current_statistics=True, batch=config.batch)
        hist = voting.summed_votes(ensemble.predict_features(qf))
        truth = hist.argmax(1).astype(np.int64)

        student = partial(
            student_accuracies, body, qf, test_feats, y[test], config.student_l2, config.batch
        )
        row = []
        labelled = []
        for n in range(noise_draws):
            (run,) = label_within_budgets(
                hist,
                voting,
                (epsilon,),
                config.delta,
                noise_stream(seed, n),
                num_teachers=config.teachers,
                accountants=config.accountants,
                labels_by=config.labels_by,
            )
            labelled.append(run)
            row.append(student(run.labels)["student_accuracy"])
            agreement.append(float((run.labels[run.answered] == truth[run.answered]).mean()))
        # Plain GNMax answers a prefix whose length does not depend on the noise, so
        # every draw answers the same queries; the noiseless student gets those.
        first = labelled[0].answered
        noiseless.append(student(np.where(first, truth, -1))["student_accuracy"])
        answered.append(int(first.sum()))
        noisy.append(row)
    return {
        "seed": seed,
        "teacher_majority_accuracy": majority,
        "answered": answered,
        "label_agreement_with_majority": float(np.mean(agreement)),
        "noisy": noisy,
        "noiseless": noiseless,
    }


def summary(seeds: list[dict[str, Any]]) -> dict[str, float]:
    """Means over every seed and draw; spreads as standard deviations (accuracy fractions)."""
    noisy = [np.asarray(s["noisy"]) for s in seeds]
    return {
        "student_noisy_mean": float(np.mean([a.mean() for a in noisy])),
        "student_noiseless_mean": float(np.mean([np.mean(s["noiseless"]) for s in seeds])),
        "teacher_majority_mean": float(np.mean([s["teacher_majority_accuracy"] for s in seeds])),
        # the spread one seed's figure carries from its noise draw alone
        "noise_draw_std": float(np.mean([a.std(axis=1).mean() for a in noisy])),
        # the spread of the noise-averaged figure over query sets on one seed
        "query_draw_std": float(np.mean([a.mean(axis=1).std() for a in noisy])),
        "seed_std_of_noisy_means": float(np.std([a.mean() for a in noisy])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teachers", type=int, default=250)
    ap.add_argument("--queries", type=int, default=4096, help="Gaussian queries per draw")
    ap.add_argument("--epsilon", type=float, default=10.0, help="budget at delta 1e-5")
    ap.add_argument("--seeds", type=int, default=4, help="number of seeds")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--query-draws", type=int, default=3)
    ap.add_argument("--noise-draws", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path(".capc-cache"), help="pretrained bodies")
    ap.add_argument("--quick", action="store_true", help="tiny settings, for a smoke test")
    ap.add_argument("--out", type=Path, default=Path("experiments/results/diet_label_noise.json"))
    args = ap.parse_args()
    if min(args.query_draws, args.noise_draws) < 1:
        ap.error("--query-draws and --noise-draws must be at least 1")
    try:
        config = DietConfig(
            teachers=args.teachers,
            generators=("gaussian",),
            statistics=("current",),
            epsilons=(args.epsilon,),
            seeds=tuple(range(args.first_seed, args.first_seed + args.seeds)),
            queries=args.queries,
            mechanism=ConfidentParams(threshold=None, sigma1=1.0, sigma2=16.0),
            accountants=("gdp",),
            student_l2=0.01,
            baseline=False,
        )
    except ValueError as err:
        ap.error(str(err))
    if args.quick:
        config = quick(config)
    start = time.perf_counter()
    x, y = load_images(config.dataset)
    body = pretrained_body(config.body, args.cache, int(y.max()) + 1, print, config.device)
    seeds = []
    for seed in config.seeds:
        seeds.append(seed_students(config, seed, body, x, y, args.query_draws, args.noise_draws))
        s = seeds[-1]
        print(
            f"seed {seed}: majority {s['teacher_majority_accuracy']:.3f}, "
            f"noiseless {np.round(s['noiseless'], 3).tolist()}, "
            f"noisy {np.round(s['noisy'], 3).tolist()}",
            flush=True,
        )
    save(
        {
            "experiment": "diet_label_noise",
            "config": config.to_dict(),
            "query_draws": args.query_draws,
            "noise_draws": args.noise_draws,
            "body_sha256": weights_sha256(body.features),
            "summary": summary(seeds),
            "seeds": seeds,
            "seconds": time.perf_counter() - start,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
