"""``capc privacy``: plan a labelling job and report its cost, from the command line.

Pure: reads ``.npy`` vote histograms, prints text or JSON. The ``capc``
dispatcher in ``services.cli`` mounts it.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from capc.privacy import events, gaussian_dp, planning, rdp
from capc.privacy.accountant import Accountant
from capc.privacy.advisor import LabelStatistics, recommend
from capc.privacy.conversion import DEFAULT_ORDERS, PATE_ORDERS, Conversion, convert
from capc.privacy.randomness import SecureRandom
from capc.privacy.smooth_sensitivity import sanitise

MECHANISMS = ("gnmax", "confident-gnmax", "laplace", "binary", "tau", "powerset")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``privacy plan`` and ``privacy cost``."""
    p = sub.add_parser("privacy", help="plan queries and report privacy cost (no services needed)")
    psub = p.add_subparsers(dest="privacy_command", required=True)
    for name, helptext in (
        ("plan", "how many queries fit a budget, and the noise a query count needs"),
        ("cost", "the privacy cost of a run given its vote histograms"),
    ):
        q = psub.add_parser(name, help=helptext)
        q.add_argument("--mechanism", choices=MECHANISMS, default="confident-gnmax")
        q.add_argument(
            "--teachers",
            type=int,
            help="number of teachers (checks vote files, bounds the threshold)",
        )
        q.add_argument("--sigma", type=float, help="noise of gnmax / binary / tau / powerset")
        q.add_argument("--threshold", type=float, help="Confident-GNMax threshold T")
        q.add_argument("--sigma1", type=float, help="Confident-GNMax threshold-test noise")
        q.add_argument("--sigma2", type=float, help="Confident-GNMax answer noise")
        q.add_argument("--scale", type=float, help="Laplace noise scale")
        q.add_argument("--labels", type=int, help="number of labels k (multi-label)")
        q.add_argument("--tau", type=float, help="tau-voting clipping norm")
        q.add_argument("--delta", type=float, default=1e-5)
        q.add_argument("--conversion", choices=[c.value for c in Conversion], default="improved")
        q.add_argument("--votes", type=Path, help=".npy file: a (queries, classes) vote histogram")
        q.add_argument("--json", action="store_true", help="print JSON")
        if name == "plan":
            q.add_argument("--epsilon", type=float, required=True)
            q.add_argument(
                "--queries", type=int, help="also solve for the noise this many queries need"
            )
        else:
            q.add_argument(
                "--answered", type=Path, help=".npy of booleans: which queries were answered"
            )
            q.add_argument(
                "--sanitise",
                action="store_true",
                help="release the data-dependent epsilon with smooth sensitivity",
            )
            q.add_argument(
                "--seed", help="seed the sanitising noise (reproducible; never for real releases)"
            )
    a = psub.add_parser(
        "advise",
        help="recommend Binary, tau or Powerset voting and its noise from label statistics",
    )
    a.add_argument(
        "--labels-file", type=Path, help=".npy of (N, k) 0/1 non-sensitive label vectors"
    )
    a.add_argument("--labels", type=int, help="k, if no labels file")
    a.add_argument("--mean-l2", type=float, help="mean l2 norm of a label vector, if no file")
    a.add_argument("--subsets", type=int, help="how many label subsets occur, if no file")
    a.add_argument("--teachers", type=int, required=True, help="answering parties voting")
    a.add_argument("--queries", type=int, required=True, help="queries the plan must answer")
    a.add_argument("--epsilon", type=float, required=True, help="each party's epsilon")
    a.add_argument("--delta", type=float, default=1e-5)
    a.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def _need(args: argparse.Namespace, *names: str) -> None:
    missing = [f"--{n}" for n in names if getattr(args, n) is None]
    if missing:
        raise SystemExit(f"error: --mechanism {args.mechanism} needs {', '.join(missing)}")


def _orders(conversion: Conversion) -> np.ndarray:
    return PATE_ORDERS if conversion is Conversion.BASIC else DEFAULT_ORDERS


def _data_independent(args: argparse.Namespace, o: np.ndarray, answered: bool = True) -> np.ndarray:
    m = args.mechanism
    if m == "gnmax":
        _need(args, "sigma")
        return rdp.gnmax_data_independent(args.sigma, o)
    if m == "confident-gnmax":
        _need(args, "threshold", "sigma1", "sigma2")
        thr = rdp.threshold_data_independent(args.sigma1, o)
        return thr + rdp.gnmax_data_independent(args.sigma2, o) if answered else thr
    if m == "laplace":
        _need(args, "scale")
        return rdp.laplace_noisy_max(args.scale, o)
    if m == "binary":
        _need(args, "labels", "sigma")
        return rdp.multilabel_binary(args.labels, args.sigma, o)
    if m == "tau":
        _need(args, "labels", "tau", "sigma")
        return rdp.multilabel_tau(args.labels, args.tau, args.sigma, o)
    _need(args, "sigma")
    return rdp.multilabel_powerset(args.sigma, o)


def _load_votes(args: argparse.Namespace) -> np.ndarray:
    try:
        votes = np.load(args.votes, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: cannot read --votes {args.votes}: {exc}") from None
    if votes.ndim != 2 or votes.shape[1] < 2:
        raise SystemExit(
            f"error: --votes must hold a (queries, classes) histogram, got shape {votes.shape}"
        )
    if not np.isfinite(votes).all() or (votes < 0).any():
        raise SystemExit("error: --votes must be finite and non-negative")
    if args.teachers is not None and votes.sum(axis=1).max() > args.teachers:
        raise SystemExit(
            f"error: a histogram in --votes has more than --teachers={args.teachers} votes"
        )
    return np.asarray(votes, dtype=np.float64)


def _dd_curves(
    args: argparse.Namespace, votes: np.ndarray, o: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per query: data-dependent threshold RDP (or zeros) and GNMax RDP. Shapes (queries, orders)."""
    if args.mechanism == "gnmax":
        gn = np.stack([rdp.gnmax(v, args.sigma, o) for v in votes])
        return np.zeros_like(gn), gn
    if args.mechanism == "confident-gnmax":
        thr = np.stack([rdp.threshold(v, args.threshold, args.sigma1, o) for v in votes])
        gn = np.stack([rdp.gnmax(v, args.sigma2, o) for v in votes])
        return thr, gn
    raise SystemExit(
        "error: data-dependent accounting is available for gnmax and confident-gnmax only"
    )


def _pr_answered(args: argparse.Namespace, votes: np.ndarray) -> np.ndarray:
    if args.mechanism != "confident-gnmax":
        return np.ones(votes.shape[0])
    return np.asarray([np.exp(rdp.log_pr_answered(v, args.threshold, args.sigma1)) for v in votes])


def _fits_in_order(
    curves: np.ndarray, o: np.ndarray, eps: float, delta: float, conv: Conversion
) -> int:
    total = np.cumsum(curves, axis=0)
    for i in range(total.shape[0]):
        if convert(total[i], o, delta, conv).epsilon > eps:
            return i
    return int(total.shape[0])


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """Queries that fit (epsilon, delta): data-independent, and data-dependent given votes."""
    conv = Conversion(args.conversion)
    o = _orders(conv)
    if args.teachers is not None and args.threshold is not None and args.threshold > args.teachers:
        raise SystemExit(f"error: --threshold {args.threshold} exceeds --teachers {args.teachers}")
    per_query = _data_independent(args, o)
    out: dict[str, Any] = {
        "mechanism": args.mechanism,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "conversion": conv.value,
        "data_independent": {
            "queries_fit": planning.max_queries(per_query, o, args.epsilon, args.delta, conv)
        },
    }
    if args.mechanism == "gnmax":
        # Plain GNMax is a Gaussian mechanism: composed exactly, more queries fit than by RDP.
        out["gaussian_dp"] = {
            "queries_fit": gaussian_dp.max_queries(
                gaussian_dp.gnmax_mu(args.sigma), args.epsilon, args.delta
            )
        }
    if args.mechanism == "confident-gnmax":
        unanswered = _data_independent(args, o, answered=False)
        out["data_independent"]["queries_fit_if_none_answered"] = planning.max_queries(
            unanswered, o, args.epsilon, args.delta, conv
        )
    if args.queries is not None and args.mechanism != "laplace":
        if args.mechanism == "confident-gnmax":
            ratio = args.sigma1 / args.sigma2
            s = planning.noise_scale_for(
                events.confident_gnmax_unit(ratio, o),
                o,
                args.queries,
                args.epsilon,
                args.delta,
                conv,
            )
            out["noise_for_queries"] = {"queries": args.queries, "sigma1": ratio * s, "sigma2": s}
        else:
            unit = per_query * args.sigma**2  # these curves scale as 1 / sigma**2
            s = planning.noise_scale_for(unit, o, args.queries, args.epsilon, args.delta, conv)
            out["noise_for_queries"] = {"queries": args.queries, "sigma": s}
    if args.votes is not None:
        votes = _load_votes(args)
        thr, gn = _dd_curves(args, votes, o)
        p = _pr_answered(args, votes)
        expected = (thr + p[:, None] * gn).mean(axis=0)
        out["data_dependent"] = {
            "histograms": int(votes.shape[0]),
            "queries_fit_at_mean_cost": planning.max_queries(
                expected, o, args.epsilon, args.delta, conv
            ),
            "file_queries_fit_if_all_answered": _fits_in_order(
                thr + gn, o, args.epsilon, args.delta, conv
            ),
            "mean_pr_answered": float(p.mean()),
        }
    return out


def cost(args: argparse.Namespace) -> dict[str, Any]:
    """The cost of a run: every histogram in --votes is a query (answered unless --answered says not)."""
    if args.votes is None:
        raise SystemExit("error: cost needs --votes FILE.npy")
    conv = Conversion(args.conversion)
    o = _orders(conv)
    votes = _load_votes(args)
    if args.answered is not None:
        answered = np.load(args.answered, allow_pickle=False).astype(bool)
        if answered.shape != (votes.shape[0],):
            raise SystemExit(
                f"error: --answered must have shape ({votes.shape[0]},), got {answered.shape}"
            )
    else:
        answered = np.ones(votes.shape[0], dtype=bool)
    di = Accountant("data-independent", o, conv)
    dd = Accountant("data-dependent", o, conv)
    n_ans = int(answered.sum())
    if args.mechanism == "confident-gnmax":
        _need(args, "threshold", "sigma1", "sigma2")
        di.compose(events.threshold_test(args.threshold, args.sigma1, o), votes.shape[0])
        di.compose(events.gnmax(args.sigma2, o), n_ans)
        for v, a in zip(votes, answered, strict=True):
            dd.compose(events.threshold_test(args.threshold, args.sigma1, o, votes=v))
            if a:
                dd.compose(events.gnmax(args.sigma2, o, votes=v))
    elif args.mechanism == "gnmax":
        _need(args, "sigma")
        di.compose(events.gnmax(args.sigma, o), n_ans)
        for v in votes[answered]:
            dd.compose(events.gnmax(args.sigma, o, votes=v))
    else:
        raise SystemExit(
            "error: cost from vote histograms is available for gnmax and confident-gnmax"
        )
    out: dict[str, Any] = {
        "queries": int(votes.shape[0]),
        "answered": n_ans,
        "answered_source": "file" if args.answered is not None else "assumed: every query answered",
        "data_independent": di.report(args.delta).to_dict(),
        "data_dependent": dd.report(args.delta).to_dict(),
    }
    if args.mechanism == "gnmax":
        mu = math.sqrt(n_ans) * gaussian_dp.gnmax_mu(args.sigma)
        out["gaussian_dp"] = {"mu": mu, "epsilon": gaussian_dp.epsilon_at(mu, args.delta)}
    if args.sanitise:
        if args.teachers is None:
            raise SystemExit("error: --sanitise needs --teachers")
        rng = SecureRandom.from_seed(args.seed) if args.seed else SecureRandom()
        sigma = args.sigma2 if args.mechanism == "confident-gnmax" else args.sigma
        released = sanitise(
            votes,
            answered,
            args.teachers,
            sigma,
            out["data_dependent"]["order"],
            args.delta,
            rng,
            threshold=args.threshold if args.mechanism == "confident-gnmax" else None,
            sigma1=args.sigma1 if args.mechanism == "confident-gnmax" else None,
        )
        out["sanitised"] = {k: getattr(released, k) for k in released.__dataclass_fields__}
    return out


def _text(result: dict[str, Any], indent: int = 0) -> str:
    lines = []
    for key, value in result.items():
        label = key.replace("_", " ")
        if isinstance(value, dict):
            lines.append(" " * indent + f"{label}:")
            lines.append(_text(value, indent + 2))
        elif isinstance(value, float):
            lines.append(
                " " * indent
                + (f"{label}: {value:.6g}" if math.isfinite(value) else f"{label}: inf")
            )
        else:
            lines.append(" " * indent + f"{label}: {value}")
    return "\n".join(lines)


def advise(args: argparse.Namespace) -> dict[str, Any]:
    """The advisor's recommendation (capc.privacy.advisor) from a label file or its statistics."""
    if args.labels_file is not None:
        try:
            labels = np.load(args.labels_file, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise SystemExit(f"error: cannot read {args.labels_file}: {err}") from None
        stats = LabelStatistics.from_labels(labels)
    else:
        missing = [
            f"--{n.replace('_', '-')}"
            for n in ("labels", "mean_l2", "subsets")
            if getattr(args, n) is None
        ]
        if missing:
            raise SystemExit(f"error: give --labels-file, or {', '.join(missing)}")
        stats = LabelStatistics(args.labels, args.mean_l2, args.subsets)
    rec = recommend(stats, args.teachers, args.queries, args.epsilon, args.delta)
    return {
        "statistics": vars(stats),
        "epsilon": args.epsilon,
        "delta": args.delta,
        **rec.to_dict(),
    }


def run(args: argparse.Namespace) -> int:
    """Run ``capc privacy plan|cost|advise`` and print the result."""
    actions: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
        "plan": plan,
        "cost": cost,
        "advise": advise,
    }
    try:
        result = actions[args.privacy_command](args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(json.dumps(result, indent=2) if args.json else _text(result))
    return 0
