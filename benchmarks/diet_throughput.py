"""Throughput of DIET's hot paths: query generation, teacher inference, body pretraining.

Prints one JSON object per result: images/s per generator (with its ratio to
the fastest), a teacher's batched inference in images/s with training
and with current BatchNorm statistics, for the small CNN and the body of
DIET's default experiment, 250 last-layer teachers' votes per second on
current-statistics queries through the body and from features already
computed, and seconds per SimCLR pretraining step of that
body in float32 and under bfloat16 autocast (with the speed-up), at the
default width and the GPU section's; on the CPU and on CUDA when present.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from timing import best_time

from capc.data.generators import GENERATORS, Recipe
from capc.learning.diet import DietConfig
from capc.learning.simclr import PRECISIONS, PretrainConfig, pretrain
from capc.models import Teacher, build
from capc.models.ensemble import TeacherEnsemble
from capc.models.inference import features


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1024, help="images per generator call")
    ap.add_argument("--batch", type=int, default=4096, help="queries per inference batch")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="pretraining steps per timing")
    ap.add_argument(
        "--widths",
        default=f"{DietConfig().body.width},64",
        help="body widths to time pretraining at (default: the experiment's and the GPU body's)",
    )
    ap.add_argument("--pretrain-batch", type=int, default=256, help="images per pretraining step")
    args = ap.parse_args()
    shape = (1, 28, 28)
    rates = {}
    for name in sorted(GENERATORS):
        recipe = Recipe(name, seed=1, start=0, count=args.images, shape=shape)
        rates[name] = args.images / best_time(recipe.generate, args.repeat)
    fastest = max(rates.values())
    for name, rate in rates.items():
        print(
            json.dumps(
                {
                    "bench": "generator",
                    "generator": name,
                    "shape": list(shape),
                    "images_per_s": round(rate, 1),
                    "ratio_to_fastest": round(rate / fastest, 4),
                }
            )
        )
    x = Recipe("mix", seed=2, start=0, count=args.batch, shape=shape).generate()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    diet = DietConfig().body  # the teachers' body in the default DIET experiment
    models = [("small-cnn", None), (diet.architecture, diet.width)]
    for device, (architecture, width) in [(d, m) for d in devices for m in models]:
        model = build(architecture, shape, 10, width)
        teacher = Teacher(architecture, shape, 10, model, device=device, width=width)
        teacher.predict(x[:64])  # warm-up (CUDA context, kernels)
        stored = args.batch / best_time(lambda: teacher.predict(x), args.repeat)  # noqa: B023
        current = args.batch / best_time(
            lambda: teacher.predict(x, current_statistics=True),  # noqa: B023
            args.repeat,
        )
        print(
            json.dumps(
                {
                    "bench": "teacher_inference",
                    "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                    "architecture": architecture,
                    "batch": args.batch,
                    "threads": torch.get_num_threads(),
                    "images_per_s_training_statistics": round(stored, 1),
                    "images_per_s_current_statistics": round(current, 1),
                    "current_over_training": round(current / stored, 3),
                }
            )
        )
    # The experiment's 250 teachers voting on current-statistics queries: through the
    # body and then every head, or from the batch's features the student already holds.
    body = build(diet.architecture, shape, 10, diet.width, seed=0).eval()
    teachers = 250
    dim = body.head.in_features
    gen = torch.Generator().manual_seed(0)
    # Current statistics never read a teacher's own: empty ones will do.
    ensemble = TeacherEnsemble(
        diet.architecture,
        shape,
        10,
        body,
        [{} for _ in range(teachers)],
        torch.randn((teachers, 10, dim), generator=gen),
        torch.zeros((teachers, 10)),
        width=diet.width,
        device="cpu",
    )
    batch = DietConfig().batch
    feats = features(body, x, current_statistics=True, batch=batch)
    through_body = best_time(
        lambda: ensemble.predict(x, current_statistics=True, batch=batch), args.repeat
    )
    heads_only = best_time(lambda: ensemble.predict_features(feats), args.repeat)
    print(
        json.dumps(
            {
                "bench": "ensemble_votes",
                "device": "cpu",
                "architecture": diet.architecture,
                "teachers": teachers,
                "queries": len(x),
                "threads": torch.get_num_threads(),
                "queries_per_s_through_body": round(len(x) / through_body, 1),
                "queries_per_s_from_features": round(len(x) / heads_only, 1),
                "from_features_speedup": round(through_body / heads_only, 1),
            }
        )
    )
    pool = Recipe("mix", seed=3, start=0, count=512, shape=shape).generate()
    for device, width in [(d, int(w)) for d in devices for w in args.widths.split(",")]:
        per_step = {}
        for precision in PRECISIONS:
            model = build(diet.architecture, shape, 10, width, seed=0).to(device)
            config = PretrainConfig(
                steps=args.steps, batch=args.pretrain_batch, precision=precision
            )
            warm_up = PretrainConfig(steps=1, batch=args.pretrain_batch, precision=precision)
            pretrain(model, pool, warm_up)
            seconds = best_time(lambda: pretrain(model, pool, config), args.repeat)  # noqa: B023
            per_step[precision] = seconds / args.steps
        print(
            json.dumps(
                {
                    "bench": "pretraining_step",
                    "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                    "architecture": diet.architecture,
                    "width": width,
                    "batch": args.pretrain_batch,
                    "threads": torch.get_num_threads(),
                    "s_per_step_fp32": round(per_step["fp32"], 4),
                    "s_per_step_bf16": round(per_step["bf16"], 4),
                    "bf16_speedup": round(per_step["fp32"] / per_step["bf16"], 3),
                }
            )
        )


if __name__ == "__main__":
    np.seterr(all="raise")
    main()
