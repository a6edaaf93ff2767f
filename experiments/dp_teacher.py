"""Where ``capc teacher fit --dp-epsilon``'s defaults come from, and what one DP head on a
hospital's records does against five on its parts.

``tune``: animal-mnist's side-by-side ``tuning`` records (held by no hospital; 700
trained, 300 scored), a linear head on the shipped body's raw features under its
stored statistics, DP-SGD over (clip, steps, lr) at epsilon 2 and 10, two noise seeds
each. ``compare``: hospital 0's share of split seed 1 (1,348 records) trained with the
defaults, as 1 head and as 5 heads on disjoint parts, scored on the split's 1,000
test images, with stored statistics (the answerer's real path) and with the batch's
own statistics (its synthetic path). The noise is seeded here (an experiment), never
in the CLI.

Run::

    python -m experiments.dp_teacher tune
    python -m experiments.dp_teacher compare --out experiments/results/dp-teacher.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.data.readers import Records
from capc.learning import dp_sgd, dp_teacher, hospital
from capc.models.checkpoint import load_teacher
from capc.models.inference import features
from capc.privacy import dp_training
from capc.privacy.randomness import SecureRandom
from experiments.side_by_side.data import split
from services.commands.teacher_cli import SHIPPED_BODY

EPSILONS = (2.0, 10.0)
#: (clip, steps, lr / clip): Opacus averages the clipped gradients, so lr / clip keeps
#: the step length the same across clips.
GRID = [(c, t, r) for c in (0.3, 1.0, 3.0) for t, r in ((300, 0.5), (300, 0.2), (1000, 0.2))]


def _accuracy(model: nn.Module, f: torch.Tensor, y: NDArray[np.int64]) -> float:
    with torch.no_grad():
        return float((model(f).argmax(1).numpy() == y).mean())


def tune() -> list[dict[str, Any]]:
    s = split("animal-mnist", 1)
    train, score = s.tuning[:700], s.tuning[700:]
    body = load_teacher(SHIPPED_BODY).model.cpu().eval()
    ftr, fsc = features(body, s.x[train]), features(body, s.x[score])
    rows = []
    for eps in EPSILONS:
        for clip, steps, lr in GRID:
            accs = []
            for seed in (7, 8):
                record = dp_training.plan_training(eps, dp_teacher.DELTA, steps, clip, len(train))
                torch.manual_seed(0)
                head = nn.Linear(ftr.shape[1], s.classes)
                dp_sgd.train(
                    head,
                    ftr.numpy(),
                    s.y[train],
                    record,
                    lr=lr / clip,
                    rng=SecureRandom.from_seed(seed),
                )
                accs.append(_accuracy(head, fsc, s.y[score]))
            row = {"epsilon": eps, "clip": clip, "steps": steps, "lr": lr / clip, "accuracy": accs}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def compare() -> list[dict[str, Any]]:
    s = split("animal-mnist", 1)
    share = s.labelled(0, None)
    idx = np.concatenate([share, s.test])
    records = Records(s.x[idx], s.y[idx], "animal-mnist share 0 and test")
    held = np.arange(len(share), len(idx), dtype=np.int64)
    rows = []
    for k in (1, 5):
        order = np.random.default_rng(0).permutation(len(share))
        parts = [p.astype(np.int64) for p in np.array_split(order, k)]
        for eps in EPSILONS:
            body = hospital.body_for(SHIPPED_BODY, (1, 28, 28), s.classes)
            fitted, record = dp_teacher.fit_dp_diet(
                records,
                hospital.Split(parts, held),
                body,
                SHIPPED_BODY.name,
                {},
                lambda _: None,
                dp_teacher.DpSettings(eps),
                rng=SecureRandom.from_seed(k * 100 + int(eps)),
            )
            card = getattr(fitted.members, "card", {})
            row = {
                "teachers": k,
                "records_per_teacher": len(parts[0]),
                "epsilon": record.spent(),
                "held_out": card["held_out"],
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("what", choices=("tune", "compare"))
    parser.add_argument("--out", type=Path, help="write the rows here as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = tune() if args.what == "tune" else compare()
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
