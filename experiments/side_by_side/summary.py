"""The side-by-side summary, recomputed from the saved rows: means and spreads over
seeds per (dataset, method, n, eps), the issue's goals, and markdown tables.

A row's ``epsilon`` is ``None`` for a non-private method (training alone, pooled).
A capc row run at a tuned configuration (``experiments.side_by_side.tuned``) records
its ``configuration`` and ``tuned``; the tables say which configuration each capc
cell is at, and whether that is the configuration tuning picked for it.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: Methods in the order the tables list them, with the names people read.
METHODS: dict[str, str] = {
    "capc-diet-student": "capc: DIET student (no data of its own)",
    "capc-loop": "capc: CaPC loop (hospital 0's own model + labels)",
    "capc-pate-public": "capc: PATE with public records",
    "dp_fedavg": "DP-FedAvg (Flower + Opacus)",
    "dp_sgd_pooled": "DP-SGD on pooled records (Opacus)",
    "alone": "each hospital alone (non-private)",
    "pooled": "pooled, non-private (the ceiling)",
}


def _stats(values: Sequence[float]) -> tuple[float, float]:
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), float(v.std())


def table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (dataset, method, n, eps): mean and standard deviation over seeds of
    the test accuracy (and of the loop's model before it), seeds, mean wall seconds and
    bytes sent."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("accuracy") is not None:
            groups[(r["dataset"], r["method"], r["n"], r["epsilon"])].append(r)
    out = []
    order = list(METHODS)
    for (dataset, method, n, eps), group in sorted(
        groups.items(),
        key=lambda kv: (
            kv[0][0],
            kv[0][2],
            order.index(kv[0][1]) if kv[0][1] in order else len(order),
            -1.0 if kv[0][3] is None else kv[0][3],
        ),
    ):
        mean, std = _stats([r["accuracy"] for r in group])
        entry: dict[str, Any] = {
            "dataset": dataset,
            "method": method,
            "n": n,
            "epsilon": eps,
            "seeds": sorted(r["seed"] for r in group),
            "accuracy": mean,
            "accuracy_std": std,
            "seconds": float(np.mean([r.get("seconds") or 0.0 for r in group])),
        }
        sent = [r["bytes_sent"] for r in group if r.get("bytes_sent") is not None]
        if sent:
            entry["bytes_sent"] = float(np.mean(sent))
        if method == "capc-loop":
            entry["accuracy_before"], entry["accuracy_before_std"] = _stats(
                [r["accuracy_before"] for r in group]
            )
            entry["gain"], entry["gain_std"] = _stats([r["gain"] for r in group])
        if "queries" in group[0]:
            entry["queries"] = float(np.mean([r["queries"] for r in group]))
        if method.startswith("capc"):
            entry["configurations"] = _configurations(group)
        out.append(entry)
    return out


#: What a capc row without a ``configuration`` ran at: the grid's rule (``capc_runs``).
SHIPPED_RULE = "shipped rule"


def _configurations(group: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A capc cell's configurations: each with its seeds, teachers a hospital, sigma and
    whether it is the cell's tuned pick (``None``: the cell was never tuned)."""
    found: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for r in group:
        sigma = (r.get("hyperparameters") or {}).get("sigma")
        k = (r.get("configuration") or SHIPPED_RULE, r.get("teachers_per_hospital"), sigma)
        found[(*k, r.get("tuned"))].append(r["seed"])
    return [
        {"name": name, "teachers": m, "sigma": sigma, "tuned": tuned, "seeds": sorted(seeds)}
        for (name, m, sigma, tuned), seeds in sorted(found.items(), key=lambda kv: kv[1])
    ]


def lookup(
    summary: Sequence[dict[str, Any]], dataset: str, method: str, n: int, eps: float | None
) -> dict[str, Any] | None:
    for e in summary:
        if (e["dataset"], e["method"], e["n"], e["epsilon"]) == (dataset, method, n, eps):
            return e
    return None


def _cells(summary: Sequence[dict[str, Any]], dataset: str) -> tuple[list[int], list[float]]:
    ns = sorted({e["n"] for e in summary if e["dataset"] == dataset})
    eps = sorted({e["epsilon"] for e in summary if e["dataset"] == dataset and e["epsilon"]})
    return ns, eps


def goals(summary: Sequence[dict[str, Any]], dataset: str = "animal-mnist") -> dict[str, Any]:
    """The issue's three goals on ``dataset``, each with the cells it was judged on.

    * loop: at every n where training alone is below the pooled ceiling (by more than
      their spreads), the loop at the largest eps beats training alone by more than
      the larger of the two seed spreads;
    * student vs DP-FedAvg: at every (n, eps), the DIET student's mean is at least
      DP-FedAvg's;
    * 80%: the DIET student reaches 0.80 at eps 10 for some n.
    """
    ns, epsilons = _cells(summary, dataset)
    top = max(epsilons) if epsilons else None
    loop_cells, duel_cells = [], []
    for n in ns:
        alone = lookup(summary, dataset, "alone", n, None)
        pooled = lookup(summary, dataset, "pooled", n, None)
        loop = lookup(summary, dataset, "capc-loop", n, top)
        if alone and pooled and loop:
            below = pooled["accuracy"] - alone["accuracy"] > max(
                alone["accuracy_std"], pooled["accuracy_std"]
            )
            margin = loop["accuracy"] - alone["accuracy"]
            spread = max(loop["accuracy_std"], alone["accuracy_std"])
            loop_cells.append(
                {
                    "n": n,
                    "alone": alone["accuracy"],
                    "loop": loop["accuracy"],
                    "pooled": pooled["accuracy"],
                    "alone_below_ceiling": below,
                    "met": (not below) or margin > spread,
                }
            )
        for eps in epsilons:
            student = lookup(summary, dataset, "capc-diet-student", n, eps)
            fed = lookup(summary, dataset, "dp_fedavg", n, eps)
            if student and fed:
                duel_cells.append(
                    {
                        "n": n,
                        "epsilon": eps,
                        "student": student["accuracy"],
                        "dp_fedavg": fed["accuracy"],
                        "met": student["accuracy"] >= fed["accuracy"],
                    }
                )
    best = [
        e["accuracy"]
        for e in summary
        if e["dataset"] == dataset and e["method"] == "capc-diet-student" and e["epsilon"] == 10
    ]
    return {
        "loop_beats_alone": {
            "met": all(c["met"] for c in loop_cells) and bool(loop_cells),
            "cells": loop_cells,
        },
        "student_at_least_dp_fedavg": {
            "met": all(c["met"] for c in duel_cells) and bool(duel_cells),
            "cells": duel_cells,
        },
        "student_80_at_eps_10": {
            "met": bool(best) and max(best) >= 0.80,
            "best": max(best) if best else None,
        },
    }


def _cell(e: dict[str, Any] | None) -> str:
    if e is None:
        return "n/a"
    return f"{e['accuracy']:.3f} ± {e['accuracy_std']:.3f}"


def size(b: float) -> str:
    """Bytes as a person reads them (decimal units)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def bytes_markdown(summary: Sequence[dict[str, Any]], dataset: str) -> list[str]:
    """``dataset``'s table of bytes sent between organisations: a (method, n) a row, an
    eps a column, for the methods that send any (the others send none)."""
    ns, epsilons = _cells(summary, dataset)
    sending = [
        m
        for m in METHODS
        if any(
            e.get("bytes_sent", 0) > 0
            for e in summary
            if (e["dataset"], e["method"]) == (dataset, m)
        )
    ]
    if not sending:
        return []
    out = [
        f"**{dataset}, bytes sent between organisations** (mean over seeds; capc: every "
        "byte to and from the guardian, TLS included, in the labelling jobs that bought "
        "the row's labels; DP-FedAvg: the parameter arrays down and up)",
        "",
        "| method | n | " + " | ".join(f"eps {e:g}" for e in epsilons) + " |",
        "|---|---|" + "---|" * len(epsilons),
    ]
    for method in sending:
        for n in ns:
            found = [lookup(summary, dataset, method, n, e) for e in epsilons]
            if not any(found):
                continue
            cells = [
                "n/a" if e is None or e.get("bytes_sent") is None else size(e["bytes_sent"])
                for e in found
            ]
            out.append(f"| {METHODS[method]} | {n} | " + " | ".join(cells) + " |")
    return [*out, ""]


def _configuration(c: dict[str, Any], every_seed: bool) -> str:
    word = "seed" if len(c["seeds"]) == 1 else "seeds"
    seeds = "" if every_seed else f"{word} {', '.join(map(str, c['seeds']))}: "
    shape = f"{c['teachers']} teachers a hospital, sigma {c['sigma']:g}" if c["sigma"] else ""
    pick = {True: "tuned pick", False: "not the tuned pick", None: "not tuned"}[c["tuned"]]
    return f"{seeds}{c['name']} ({', '.join(p for p in (shape, pick) if p)})"


def configurations_markdown(
    summary: Sequence[dict[str, Any]], dataset: str, n: int, epsilons: Sequence[float]
) -> list[str]:
    """Below a (dataset, n) table: each capc method's configuration at each eps, and
    whether it is what tuning picked there (eps with the same configurations joined)."""
    out = []
    for method, name in METHODS.items():
        if not method.startswith("capc"):
            continue
        spans: list[tuple[list[float], str]] = []
        for e in epsilons:
            entry = lookup(summary, dataset, method, n, e)
            if entry is None:
                continue
            seeds = entry["seeds"]
            text = "; ".join(
                _configuration(c, c["seeds"] == seeds) for c in entry["configurations"]
            )
            if spans and spans[-1][1] == text:
                spans[-1][0].append(e)
            else:
                spans.append(([e], text))
        if spans:
            parts = [f"eps {', '.join(f'{e:g}' for e in es)}: {t}" for es, t in spans]
            out.append(f"- {name}: " + "; ".join(parts) + ".")
    return [*out, ""] if out else []


def markdown(summary: Sequence[dict[str, Any]]) -> str:
    """One table per dataset and n: a method a row, an eps a column (non-private
    methods in their own column), with capc's configurations below it; then the
    dataset's bytes sent."""
    out: list[str] = []
    for dataset in sorted({e["dataset"] for e in summary}):
        ns, epsilons = _cells(summary, dataset)
        for n in ns:
            out += [
                f"**{dataset}, n = {n} labelled records per hospital** (test accuracy, "
                "mean ± std over seeds; each capc cell at the configuration listed below "
                "the table)",
                "",
                "| method | " + " | ".join(f"eps {e:g}" for e in epsilons) + " | non-private |",
                "|---|" + "---|" * (len(epsilons) + 1),
            ]
            for method, name in METHODS.items():
                present = [
                    e
                    for e in summary
                    if (e["dataset"], e["method"], e["n"]) == (dataset, method, n)
                ]
                if not present:
                    continue
                cells = [_cell(lookup(summary, dataset, method, n, e)) for e in epsilons]
                cells.append(_cell(lookup(summary, dataset, method, n, None)))
                out.append(f"| {name} | " + " | ".join(cells) + " |")
            out.append("")
            out += configurations_markdown(summary, dataset, n, epsilons)
        out += bytes_markdown(summary, dataset)
    return "\n".join(out)


def goals_markdown(summary: Sequence[dict[str, Any]], dataset: str = "animal-mnist") -> str:
    """The goals as a list a person reads: met or not, with the cells behind each."""
    g = goals(summary, dataset)
    loop = g["loop_beats_alone"]["cells"]
    duel = g["student_at_least_dp_fedavg"]["cells"]
    best = g["student_80_at_eps_10"]["best"]

    def verdict(met: bool) -> str:
        return "met" if met else "not met"

    lines = [
        f"- The CaPC loop beats training alone by more than the seed spread wherever "
        f"alone is below the pooled ceiling: {verdict(g['loop_beats_alone']['met'])} ("
        + "; ".join(
            f"n {c['n']}: alone {c['alone']:.3f}, loop {c['loop']:.3f}, pooled {c['pooled']:.3f}"
            for c in loop
        )
        + ").",
        f"- The DIET student is at least as accurate as DP-FedAvg at every eps: "
        f"{verdict(g['student_at_least_dp_fedavg']['met'])} ("
        + "; ".join(
            f"n {c['n']} eps {c['epsilon']:g}: {c['student']:.3f} vs {c['dp_fedavg']:.3f}"
            for c in duel
        )
        + ").",
        f"- The DIET student reaches 0.80 at eps 10: {verdict(g['student_80_at_eps_10']['met'])} "
        f"(best {'n/a' if best is None else f'{best:.3f}'}).",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.side_by_side.summary")
    parser.add_argument("result", type=Path, help="the saved side-by-side JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Print the tables and the goals of a saved side-by-side result."""
    args = build_parser().parse_args(argv)
    summary = table(json.loads(args.result.read_text())["rows"])
    print(markdown(summary))
    print(goals_markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
