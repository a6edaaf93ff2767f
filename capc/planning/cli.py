"""``capc privacy``: plan a labelling job and report its cost, from the command line.

Pure: reads ``.npy`` vote histograms, prints text or JSON. The ``capc``
dispatcher in ``services.commands.cli`` mounts it.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from capc.mechanisms import Mechanism, MechanismError, mechanism_class
from capc.planning.advisor import LabelStatistics, recommend
from capc.planning.args import LAPLACE
from capc.privacy import accountants, planning
from capc.privacy.accountant import Accountant
from capc.privacy.accountants import RenyiDp
from capc.privacy.conversion import DEFAULT_ORDERS, PATE_ORDERS, Conversion
from capc.privacy.events import DpEvent, PureDpEvent, RdpCurveEvent
from capc.privacy.randomness import SecureRandom
from capc.privacy.smooth_sensitivity import sanitise

#: Central-mode only: Laplace noisy max is pure DP, which no ledger filter here takes.


PARAMS = ("sigma", "threshold", "sigma1", "tau")


def _mechanism(args: argparse.Namespace) -> Mechanism:
    """The registered mechanism the flags describe; a clear error naming what is missing."""
    cls = mechanism_class(args.mechanism)
    if cls.multi_label and args.labels is None:
        raise SystemExit(f"error: --mechanism {args.mechanism} needs --labels")
    outputs = args.labels if cls.multi_label else args.classes
    given = {k: getattr(args, k) for k in PARAMS if getattr(args, k) is not None}
    fields = cls.params_model.model_fields
    missing = [f"--{k}" for k, f in fields.items() if f.is_required() and k not in given]
    if missing:
        raise SystemExit(f"error: --mechanism {args.mechanism} needs {', '.join(missing)}")
    unused = [f"--{k}" for k in given if k not in fields]
    if unused:
        raise SystemExit(f"error: --mechanism {args.mechanism} takes no {', '.join(unused)}")
    try:
        return cls.from_params(outputs, given)
    except MechanismError as err:
        raise SystemExit(f"error: {err}") from None


def _per_query(args: argparse.Namespace) -> tuple[DpEvent, Mechanism | None]:
    if args.mechanism == LAPLACE:
        if args.scale is None:
            raise SystemExit("error: --mechanism laplace needs --scale")
        # Laplace noisy max: a vote move changes two counts, so eps = 2 / scale.
        return PureDpEvent(2.0 / args.scale), None
    mech = _mechanism(args)
    return mech.per_query(), mech


def _orders(conversion: Conversion) -> np.ndarray:
    return PATE_ORDERS if conversion is Conversion.BASIC else DEFAULT_ORDERS


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


def _data_dependent(
    mech: Mechanism | None, votes: np.ndarray, answered: np.ndarray, o: np.ndarray
) -> np.ndarray:
    """Per query data-dependent RDP curves (queries, orders)."""
    if mech is None:
        raise SystemExit("error: no data-dependent analysis of Laplace noisy max")
    try:
        return np.stack(
            [
                mech.data_dependent_event(v, bool(a), o).rdp
                for v, a in zip(votes, answered, strict=True)
            ]
        )
    except MechanismError as err:
        raise SystemExit(f"error: {err}") from None


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """Queries that fit (epsilon, delta): what the ledger admits, by each accountant.

    Data-independent only: a plan sized from private votes would let them decide how
    much is released."""
    conv = Conversion(args.conversion)
    o = _orders(conv)
    if args.teachers is not None and args.threshold is not None and args.threshold > args.teachers:
        raise SystemExit(f"error: --threshold {args.threshold} exceeds --teachers {args.teachers}")
    per_query, mech = _per_query(args)
    if mech is not None and mech.trained_teachers_only:
        # No per-query charge: no count divides a budget, and every query asked fits.
        return {
            "mechanism": args.mechanism,
            "epsilon": args.epsilon,
            "delta": args.delta,
            "per_query_epsilon": 0.0,
            "queries_fit": "unlimited",
            "note": (
                f"{mech.name} charges nothing per query: its answers are post-processing "
                "of the teachers' DP-SGD training, charged once when each hospital "
                "registers (docs/privacy.md, DP-trained teachers)"
            ),
        }
    renyi = RenyiDp(o, conv)
    out: dict[str, Any] = {
        "mechanism": args.mechanism,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "conversion": conv.value,
        "data_independent": {
            "queries_fit": planning.max_queries(
                renyi.cost(per_query), o, args.epsilon, args.delta, conv
            )
        },
    }
    ledger = accountants.make(accountants.DEFAULT_ACCOUNTANT)
    if ledger.admissible(per_query):
        fit = ledger.max_count(per_query, args.epsilon, args.delta)
        out["ledger"] = {"accountant": ledger.name, "queries_fit": fit}
        out["gaussian_dp"] = {"queries_fit": fit}
    else:
        out["ledger"] = {
            "accountant": ledger.name,
            "queries_fit": None,
            "error": f"the {ledger.name} ledger does not admit {per_query.kind} events",
        }
    if mech is not None and mech.confident and not mech.per_label:
        unanswered = mech.event(np.zeros(1, dtype=bool))
        out["data_independent"]["queries_fit_if_none_answered"] = planning.max_queries(
            renyi.cost(unanswered), o, args.epsilon, args.delta, conv
        )
    if args.queries is not None and mech is not None:
        # Every noise std scaled by s scales each Gaussian loss by 1 / s**2.
        acct = ledger if ledger.admissible(per_query) else renyi
        m = acct.max_multiplier(per_query, args.queries, args.epsilon, args.delta)
        scaled = mech.scaled_noise(1.0 / math.sqrt(m)).params.model_dump()
        out["noise_for_queries"] = {
            "queries": args.queries,
            "accountant": acct.name,
            **{k: v for k, v in scaled.items() if k.startswith("sigma") and v},
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
    mech = _mechanism(args) if args.mechanism != LAPLACE else None
    if mech is None or mech.per_label:
        raise SystemExit("error: cost from vote histograms is for single-label mechanisms")
    if not mech.confident and not answered.all():
        raise SystemExit(f"error: {mech.name} answers every query; --answered must be all true")
    event = mech.event(answered)
    di = Accountant("data-independent", RenyiDp(o, conv))
    di.compose(event, label=mech.name)
    dd = Accountant("data-dependent", RenyiDp(o, conv))
    for curve in _data_dependent(mech, votes, answered, o):
        dd.compose(RdpCurveEvent(curve, o, mech.name, data_dependent=True), label=mech.name)
    n_ans = int(answered.sum())
    out: dict[str, Any] = {
        "queries": int(votes.shape[0]),
        "answered": n_ans,
        "answered_source": "file" if args.answered is not None else "assumed: every query answered",
        "data_independent": di.report(args.delta).to_dict(),
        "data_dependent": dd.report(args.delta).to_dict(),
    }
    gdp = accountants.GaussianDp()
    if gdp.supports(event):
        spent = gdp.spent(gdp.cost(event), args.delta)
        out["gaussian_dp"] = {"mu": spent.mu, "epsilon": spent.epsilon}
    if args.sanitise:
        if args.teachers is None:
            raise SystemExit("error: --sanitise needs --teachers")
        rng = SecureRandom.from_seed(args.seed) if args.seed else SecureRandom()
        released = sanitise(
            votes,
            answered,
            args.teachers,
            float(args.sigma),
            # The data-independent curve's best order: one chosen on the data-dependent
            # curve would let the votes decide what is released.
            out["data_independent"]["order"],
            args.delta,
            rng,
            threshold=args.threshold if mech.confident else None,
            sigma1=args.sigma1 if mech.confident else None,
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
    """The advisor's recommendation (capc.planning.advisor) from a label file or its statistics."""
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
