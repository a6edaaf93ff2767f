"""The side-by-side plots, drawn from the saved summary (matplotlib, PNG).

* ``when_joining_pays``: one figure per (dataset, scenario): test accuracy against
  eps, a panel per n (and per hospital where a scenario reports hospitals apart), a
  line per private method with its seed spread as a band, and the non-private
  methods (a hospital alone: the best model it trains on its own records; pooled:
  the ceiling) as flat lines.
* ``accuracy_vs_n``: IID only: a hospital's accuracy against its own labelled
  records n, every method at the largest eps, the non-private ones beside them.

Every method has one colour, marker and line style (:data:`STYLES`) in every panel
of every figure, and every figure has one legend, built from the union of the
methods it plots (not from whichever panel came last). Beside each PNG a JSON file
records what was drawn, read back from the figure (:func:`drawn`); a unit test
redraws the figures from the saved rows and finds the committed files equal.

Run (after the grid; idempotent, with the summary's ``--write``):
    python -m experiments.side_by_side.plots experiments/results/side-by-side.json docs/img
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from experiments.side_by_side.summary import (
    BY_N,
    IID,
    METHODS,
    figure_names,
    hospitals,
    lookup,
    measured_cells,
    scenario_name,
    table,
    test_set,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Style:
    """How one method is drawn, everywhere."""

    color: str
    marker: str
    linestyle: Literal["-", "--", ":"] = "-"


#: One colour, marker and line style per method, for every panel and every figure.
#: capc's methods solid, a DP-trained-teacher variant beside its plain one in a
#: related hue; the baselines in warm colours; the non-private ones grey and black,
#: dashed, without markers (flat lines where eps does not apply).
STYLES: dict[str, Style] = {
    "capc-diet-student": Style("#1f77b4", "o"),
    "capc-dp-student": Style("#17becf", "v"),
    "capc-loop": Style("#2ca02c", "s"),
    "capc-dp-loop": Style("#8c564b", "X"),
    "capc-pate-public": Style("#9467bd", "^"),
    "capc-dp-pate-public": Style("#e377c2", "P"),
    "dp_fedavg": Style("#d62728", "D"),
    "dp_sgd_pooled": Style("#ff7f0e", "*"),
    "alone": Style("#7f7f7f", "None", "--"),
    "pooled": Style("#000000", "None", ":"),
}

#: Legend names where the tables' names say less than a plot needs.
LABELS: dict[str, str] = {
    **METHODS,
    "alone": "a hospital alone: its best model on its own records (non-private)",
    "pooled": "pooled records, non-private (the ceiling)",
}


def style(method: str) -> Style:
    """``method``'s style; a method the table does not know is refused, so that no
    line is ever coloured by drawing order."""
    if method not in STYLES:
        raise ValueError(f"no plot style for method {method!r}: add it to plots.STYLES")
    return STYLES[method]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on a server
    import matplotlib.pyplot as plt

    return plt


def _methods(summary: Sequence[dict[str, Any]]) -> list[str]:
    """The summary's methods in the legend's order (:data:`METHODS`, unknown last)."""
    found = {e["method"] for e in summary}
    return [m for m in METHODS if m in found] + sorted(found - set(METHODS))


def _line(ax: Axes, method: str, x: list[float], y: list[float]) -> None:
    s = style(method)
    ax.plot(
        x,
        y,
        color=s.color,
        marker=s.marker,
        linestyle=s.linestyle,
        label=LABELS.get(method, method),
        gid=method,
    )


def _band(ax: Axes, method: str, x: list[float], y: list[float], sd: list[float]) -> None:
    ax.fill_between(
        x,
        [a - b for a, b in zip(y, sd, strict=True)],
        [a + b for a, b in zip(y, sd, strict=True)],
        color=style(method).color,
        alpha=0.15,
        gid=method,
        linewidth=0,
    )


def _legend(
    fig: Figure, methods: Sequence[str], suffix: dict[str, str] | None = None, ncol: int = 2
) -> None:
    """One legend for the whole figure: a handle per method plotted anywhere in it,
    drawn from :data:`STYLES` (so it cannot follow one panel's drawing order)."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D(
            [],
            [],
            color=style(m).color,
            marker=style(m).marker,
            linestyle=style(m).linestyle,
            label=LABELS.get(m, m) + (suffix or {}).get(m, ""),
        )
        for m in methods
    ]
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=ncol,
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, 0.0),
    )


def _fit(fig: Figure, legend_rows: int) -> None:
    """Lay the panels out above the legend's ``legend_rows`` rows (about 0.17 inch each)."""
    bottom = (0.17 * legend_rows + 0.15) / fig.get_figheight()
    fig.tight_layout(rect=(0, min(0.5, bottom), 1, 1))


def _panels(
    summary: Sequence[dict[str, Any]], dataset: str, scenario: str
) -> list[tuple[str | None, int]]:
    """The (hospital, n) panels of one (dataset, scenario) that have rows."""
    ns, _ = measured_cells(summary, dataset, scenario)
    return [
        (h, n)
        for h in hospitals(summary, dataset, scenario)
        for n in ns
        if any(
            (e["dataset"], e["scenario"], e["hospital"], e["n"]) == (dataset, scenario, h, n)
            for e in summary
        )
    ]


def _panel_title(scenario: str, hospital: str | None, n: int, arch: str) -> str:
    if hospital is not None:
        return f"{hospital}" + (f" ({arch})" if arch else "") + f", n = {n}"
    if scenario == "small-querier":
        return f"querier: n = {n} labelled\n(the others: all of their records)"
    if scenario == "mixed-models":
        return f"a student any hospital may receive, n = {n}"
    return f"n = {n} labelled records per hospital"


def _seeds(summary: Sequence[dict[str, Any]]) -> str:
    seeds = sorted({s for e in summary for s in e["seeds"]})
    return ", ".join(map(str, seeds))


def when_joining_pays(summary: Sequence[dict[str, Any]], dataset: str, scenario: str) -> Figure:
    """One (dataset, scenario)'s accuracy against eps: a panel per (hospital, n), a
    line per private method (mean over seeds, the std as a band), a flat line per
    non-private one across the eps measured."""
    plt = _pyplot()
    mine = [e for e in summary if (e["dataset"], e["scenario"]) == (dataset, scenario)]
    panels = _panels(summary, dataset, scenario)
    _, epsilons = measured_cells(summary, dataset, scenario)
    # Four panels as 2 x 2, so that a figure stays readable at a page's width.
    cols = 2 if len(panels) == 4 else min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig: Figure
    fig, axes = plt.subplots(
        rows, cols, figsize=(max(9.0, 4.5 * cols), 3.4 * rows + 1.6), sharey=True, squeeze=False
    )
    plotted: list[str] = []
    for i, (hospital, n) in enumerate(panels):
        ax = axes[i // cols][i % cols]
        where = (scenario, hospital)
        arch = ""
        for method in _methods(mine):
            private = [
                e
                for eps in epsilons
                if (e := lookup(summary, dataset, method, n, eps, *where)) is not None
            ]
            flat = lookup(summary, dataset, method, n, None, *where)
            arch = arch or next(
                (e["architecture"] for e in (flat, *private) if e and e.get("architecture")), ""
            )
            if private:
                x = [e["epsilon"] for e in private]
                y = [e["accuracy"] for e in private]
                _line(ax, method, x, y)
                _band(ax, method, x, y, [e["accuracy_std"] for e in private])
            if flat is not None and epsilons:
                _line(ax, method, [epsilons[0], epsilons[-1]], [flat["accuracy"]] * 2)
            if (private or flat is not None) and method not in plotted:
                plotted.append(method)
        ax.set_xscale("log")
        ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
        ax.minorticks_off()
        ax.set_xlabel("eps (delta 1e-5)")
        ax.set_title(_panel_title(scenario, hospital, n, arch), fontsize=10)
        ax.set_gid(json.dumps({"hospital": hospital, "n": n}))
        ax.grid(alpha=0.3)
    for j in range(len(panels), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    for r in range(rows):
        axes[r][0].set_ylabel(f"test accuracy\n({test_set(dataset)})", fontsize=9)
    fig.suptitle(
        f"{dataset}, {scenario_name(scenario)}: when joining pays "
        f"(mean ± std over seeds {_seeds(mine)})"
    )
    order = [m for m in _methods(mine) if m in plotted]
    _legend(fig, order)
    _fit(fig, (len(order) + 1) // 2)
    return fig


def accuracy_vs_n(summary: Sequence[dict[str, Any]], dataset: str) -> Figure:
    """IID: hospital 0's accuracy (capc's students: the student's) against its own n,
    every private method at the largest eps, the non-private ones beside them."""
    plt = _pyplot()
    mine = [e for e in summary if (e["dataset"], e["scenario"]) == (dataset, IID)]
    ns, epsilons = measured_cells(summary, dataset, IID)
    eps = epsilons[-1] if epsilons else None
    fig: Figure
    fig, ax = plt.subplots(figsize=(7.5, 7))
    plotted = []
    for method in _methods(mine):
        found = [(n, lookup(summary, dataset, method, n, eps)) for n in ns]
        flat = [(n, lookup(summary, dataset, method, n, None)) for n in ns]
        got = [(n, e) for n, e in found if e is not None] or [
            (n, e) for n, e in flat if e is not None
        ]
        if not got:
            continue
        x = [float(n) for n, _ in got]
        y = [e["accuracy"] for _, e in got]
        _line(ax, method, x, y)
        _band(ax, method, x, y, [e["accuracy_std"] for _, e in got])
        plotted.append(method)
    ax.set_xscale("log")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.set_xlabel("labelled records per hospital (n)")
    ax.set_ylabel(f"test accuracy ({test_set(dataset)})", fontsize=9)
    ax.set_gid(json.dumps({"hospital": None, "epsilon": eps}))
    ax.grid(alpha=0.3)
    at = "" if eps is None else f" at eps {eps:g} (delta 1e-5)"
    ax.set_title(
        f"{dataset}, IID: accuracy against own records{at}\n(mean ± std over seeds {_seeds(mine)})",
        fontsize=10,
    )
    suffix = {m: f" at eps {eps:g}" for m in plotted if eps is not None}
    suffix.update({m: "" for m in ("alone", "pooled")})
    _legend(fig, plotted, suffix, ncol=1)
    _fit(fig, len(plotted))
    return fig


def drawn(fig: Figure) -> dict[str, Any]:
    """What ``fig`` shows, read back from its artists: each panel's title, axis labels
    and lines (method, label, colour, marker, style, x, y) and the legend's entries."""
    from matplotlib.colors import to_hex

    def line(x: Any) -> dict[str, Any]:
        return {
            "method": x.get_gid(),
            "label": x.get_label(),
            "color": to_hex(x.get_color()),
            "marker": str(x.get_marker()),
            "linestyle": str(x.get_linestyle()),
            "x": [float(v) for v in x.get_xdata()],
            "y": [float(v) for v in x.get_ydata()],
        }

    panels = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        panels.append(
            {
                "cell": json.loads(ax.get_gid() or "null"),
                "title": ax.get_title(),
                "xlabel": ax.get_xlabel(),
                "ylabel": ax.get_ylabel(),
                "lines": [line(x) for x in ax.get_lines()],
                "bands": [
                    {
                        "method": c.get_gid(),
                        "color": to_hex(cast(Any, c.get_facecolor())[0], keep_alpha=False),
                    }
                    for c in ax.collections
                ],
            }
        )
    legend = fig.legends[0] if fig.legends else None
    entries = []
    if legend is not None:
        for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True):
            entries.append(
                {
                    "label": text.get_text(),
                    "color": to_hex(handle.get_color()),  # type: ignore[union-attr]
                    "marker": str(handle.get_marker()),  # type: ignore[union-attr]
                    "linestyle": str(handle.get_linestyle()),  # type: ignore[union-attr]
                }
            )
    return {
        "title": fig.get_suptitle(),
        "panels": panels,
        "legend": entries,
    }


def figures(summary: Sequence[dict[str, Any]]) -> dict[str, Figure]:
    """Every figure of a summary by its file name (without ``.png``)."""
    return {
        name: accuracy_vs_n(summary, dataset)
        if what == BY_N
        else when_joining_pays(summary, dataset, what)
        for name, dataset, what in figure_names(summary)
    }


def draw(result: dict[str, Any], folder: Path) -> list[Path]:
    """Every plot of a saved result into ``folder``, each PNG with a JSON file of what
    it shows (:func:`drawn`); the files written. Older side-by-side PNGs and JSON
    files in ``folder`` that these no longer make are removed, so the folder holds
    exactly what the rows give."""
    plt = _pyplot()
    summary = table(result["rows"])
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    made = figures(summary)
    for name, fig in made.items():
        png, record = folder / f"{name}.png", folder / f"{name}.json"
        fig.savefig(png, dpi=100, metadata={"Software": None})
        record.write_text(json.dumps(drawn(fig), indent=1) + "\n")
        plt.close(fig)
        out += [png, record]
    for old in [*folder.glob("side-by-side-*.png"), *folder.glob("side-by-side-*.json")]:
        if old.stem not in made:
            old.unlink()
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.side_by_side.plots")
    parser.add_argument("result", type=Path, help="the saved side-by-side JSON")
    parser.add_argument("folder", type=Path, help="where the PNG files go")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for path in draw(json.loads(args.result.read_text()), args.folder):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
