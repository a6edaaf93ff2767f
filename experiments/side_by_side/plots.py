"""The side-by-side plots, drawn from the saved summary (matplotlib, PNG).

* ``accuracy_vs_epsilon``: test accuracy against eps, a line per method with the
  seed spread as a band, non-private methods as flat lines; one panel per n.
* ``when_to_join``: a hospital's accuracy against its own labelled records n:
  alone, with the CaPC loop and with DP-FedAvg (at the largest eps), and the pooled
  ceiling.

Run (after the grid):
    python -m experiments.side_by_side.plots experiments/results/side-by-side.json docs/img
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.side_by_side.summary import METHODS, lookup, table


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on a server
    import matplotlib.pyplot as plt

    return plt


def accuracy_vs_epsilon(summary: Sequence[dict[str, Any]], dataset: str, path: Path) -> None:
    """One panel per n; a line per private method, a dashed line per non-private one."""
    plt = _pyplot()
    ns = sorted({e["n"] for e in summary if e["dataset"] == dataset})
    fig, axes = plt.subplots(1, len(ns), figsize=(4.2 * len(ns), 3.6), sharey=True, squeeze=False)
    for ax, n in zip(axes[0], ns, strict=True):
        for method, name in METHODS.items():
            rows = sorted(
                (e for e in summary if (e["dataset"], e["method"], e["n"]) == (dataset, method, n)),
                key=lambda e: e["epsilon"] or 0.0,
            )
            private = [e for e in rows if e["epsilon"] is not None]
            if private:
                x = [e["epsilon"] for e in private]
                y = [e["accuracy"] for e in private]
                s = [e["accuracy_std"] for e in private]
                (line,) = ax.plot(x, y, marker="o", label=name)
                ax.fill_between(
                    x,
                    [a - b for a, b in zip(y, s, strict=True)],
                    [a + b for a, b in zip(y, s, strict=True)],
                    color=line.get_color(),
                    alpha=0.15,
                )
            flat = lookup(summary, dataset, method, n, None)
            if flat is not None:
                ax.axhline(
                    flat["accuracy"],
                    linestyle="--",
                    linewidth=1,
                    label=name,
                    color="black" if method == "pooled" else "grey",
                )
        ax.set_xscale("log")
        ax.set_xticks([1, 2, 5, 10], ["1", "2", "5", "10"])
        ax.set_xlabel("epsilon (delta 1e-5)")
        ax.set_title(f"n = {n} per hospital")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"{dataset}: accuracy against the privacy budget")
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def when_to_join(summary: Sequence[dict[str, Any]], dataset: str, path: Path) -> None:
    """A hospital's accuracy against its own n: alone, loop, DP-FedAvg, pooled."""
    plt = _pyplot()
    eps = max(
        (e["epsilon"] for e in summary if e["dataset"] == dataset and e["epsilon"]), default=None
    )
    ns = sorted({e["n"] for e in summary if e["dataset"] == dataset})
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, budget, label in (
        ("alone", None, "alone (non-private)"),
        ("capc-loop", eps, f"CaPC loop (eps {eps:g})" if eps else "CaPC loop"),
        ("dp_fedavg", eps, f"DP-FedAvg (eps {eps:g})" if eps else "DP-FedAvg"),
        ("pooled", None, "pooled ceiling (non-private)"),
    ):
        points = [(n, lookup(summary, dataset, method, n, budget)) for n in ns]
        got = [(n, e) for n, e in points if e is not None]
        if not got:
            continue
        x = [n for n, _ in got]
        y = [e["accuracy"] for _, e in got]
        s = [e["accuracy_std"] for _, e in got]
        style = "--" if method == "pooled" else "-"
        ax.errorbar(x, y, yerr=s, marker="o", linestyle=style, capsize=3, label=label)
    ax.set_xscale("log")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("labelled records per hospital (n)")
    ax.set_ylabel("hospital 0's test accuracy")
    ax.set_title(f"{dataset}: when joining pays")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw(result: dict[str, Any], folder: Path) -> list[Path]:
    """Every plot of a saved result into ``folder``; the files written."""
    summary = table(result["rows"])
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for dataset in sorted({e["dataset"] for e in summary}):
        for name, fn in (
            ("accuracy-vs-epsilon", accuracy_vs_epsilon),
            ("when-to-join", when_to_join),
        ):
            path = folder / f"side-by-side-{dataset}-{name}.png"
            fn(summary, dataset, path)
            out.append(path)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.side_by_side.plots")
    parser.add_argument("result", type=Path, help="the saved side-by-side JSON")
    parser.add_argument("folder", type=Path, help="where the PNG files go")
    args = parser.parse_args(argv)
    for path in draw(json.loads(args.result.read_text()), args.folder):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
