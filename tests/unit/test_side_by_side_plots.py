"""The side-by-side figures say what they draw: every plotted line has its method's one
colour and marker in every panel, its entry in the figure's one legend, and the
summary's means as its data; and the committed figures are what the saved rows give.

The checks read the matplotlib figure's artists (each line's label, colour, marker and
data, the legend's handles), not pixels. They are shown to fail on a figure whose
colours were swapped or drawn in cycle order, the bug the plots had: the n = 50 panel's
line the legend called DP-FedAvg was PATE with public records.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from experiments.side_by_side import plots, summary

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (1, 2, 3)
EPS = (1.0, 2.0, 5.0, 10.0)


def _rows(
    method: str,
    n: int,
    accuracy: float | list[float],
    scenario: str | None = None,
    epsilons: tuple[float, ...] = EPS,
    **extra: Any,
) -> list[dict[str, Any]]:
    """Three seeds' rows of one method (one accuracy per eps, or one non-private), each
    seed 0.01 apart so that every cell has a spread."""
    private = isinstance(accuracy, list)
    budgets: list[float | None] = list(epsilons) if private else [None]
    values = accuracy if isinstance(accuracy, list) else [accuracy]
    out = []
    for eps, acc in zip(budgets, values, strict=True):
        for seed in SEEDS:
            row: dict[str, Any] = {
                "dataset": "animal-mnist",
                "method": method,
                "n": n,
                "epsilon": eps,
                "seed": seed,
                "accuracy": acc + 0.01 * (seed - 2),
                "seconds": 1.0,
                **extra,
            }
            if scenario is not None:
                row["scenario"] = scenario
            out.append(row)
    return out


def scenario_rows() -> list[dict[str, Any]]:
    """A small grid of every scenario, as the runs will add them: IID rows without a
    ``scenario`` (n = 50 with the loop, n = 1,348 without it, so the panels plot
    different methods), the small querier, both skews, and mixed models by hospital."""
    rows = []
    # IID. At n = 1,348 capc's best student (DP-trained teachers) is within 0.02 of
    # DP-FedAvg at every eps and reaches 0.895 at eps 10: the IID goal is met.
    rows += _rows("capc-diet-student", 50, [0.16, 0.17, 0.21, 0.27])
    rows += _rows("capc-loop", 50, [0.69, 0.69, 0.69, 0.70], accuracy_before=0.68, gain=0.01)
    rows += _rows("capc-pate-public", 50, [0.15, 0.20, 0.24, 0.41])
    rows += _rows("dp_fedavg", 50, [0.26, 0.37, 0.59, 0.67])
    rows += _rows("dp_sgd_pooled", 50, [0.45, 0.64, 0.74, 0.77])
    rows += _rows("alone", 50, 0.68) + _rows("pooled", 50, 0.85)
    rows += _rows("capc-diet-student", 1348, [0.53, 0.64, 0.73, 0.76])
    rows += _rows("capc-dp-student", 1348, [0.79, 0.84, 0.87, 0.895])
    rows += _rows("capc-pate-public", 1348, [0.66, 0.72, 0.78, 0.78])
    rows += _rows("dp_fedavg", 1348, [0.80, 0.85, 0.88, 0.90])
    rows += _rows("alone", 1348, 0.92) + _rows("pooled", 1348, 0.96)
    # Small querier: the loop lifts the querier 0.16 above alone at eps 5 and 10 (the
    # better loop differs by eps) but stays 0.02 below joining DP-FedAvg at eps 10.
    sq, e = "small-querier", (5.0, 10.0)
    rows += _rows("capc-loop", 50, [0.74, 0.76], sq, e)
    rows += _rows("capc-dp-loop", 50, [0.76, 0.74], sq, e)
    rows += _rows("dp_fedavg", 50, [0.70, 0.78], sq, e)
    rows += _rows("alone", 50, 0.60, sq)
    # Class skew: capc ahead of DP-FedAvg at alpha 0.1.
    for scenario, fed in (("skew-0.1", 0.70), ("skew-0.5", 0.85)):
        rows += _rows("capc-diet-student", 1348, [0.66, 0.72], scenario, e)
        rows += _rows("capc-dp-pate-public", 1348, [0.60, 0.64], scenario, e)
        rows += _rows("dp_fedavg", 1348, [fed - 0.05, fed], scenario, e)
        rows += _rows("alone", 1348, 0.65, scenario)
    # Mixed models: hospital-1 is alone on its architecture (no DP-FedAvg for it);
    # capc gives hospital-0 0.01 less than DP-FedAvg over the cnn hospitals.
    mm = "mixed-models"
    cases: list[tuple[str, str, float, float | None, float]] = [
        ("hospital-0", "cnn", 0.80, 0.86, 0.85),
        ("hospital-1", "linear", 0.78, None, 0.80),
        ("hospital-2", "cnn", 0.83, 0.86, 0.88),
    ]
    for hospital, arch, alone, joint, capc in cases:
        who: dict[str, Any] = {"hospital": hospital, "architecture": arch}
        rows += _rows("alone", 1348, alone, mm, **who)
        rows += _rows("capc-loop", 1348, [capc - 0.05, capc], mm, e, **who)
        if joint is not None:
            rows += _rows("dp_fedavg", 1348, [joint - 0.04, joint], mm, e, **who)
    return rows


def _lines(fig: Figure) -> Iterator[tuple[Any, Any]]:
    """(axes, line) for every labelled line of every visible panel."""
    for ax in fig.axes:
        if ax.get_visible():
            for line in ax.get_lines():
                if not str(line.get_label()).startswith("_"):
                    yield ax, line


def _look(line: Any) -> tuple[str, str, str]:
    return to_hex(line.get_color()), str(line.get_marker()), str(line.get_linestyle())


def disagreements(
    fig: Figure, table: list[dict[str, Any]], dataset: str, scenario: str
) -> list[str]:
    """How ``fig`` (one (dataset, scenario)'s accuracy against eps) disagrees with its
    legend, with the one style table, or with the summary's means; empty when not."""
    found = []
    legends = fig.legends
    if len(legends) != 1:
        return [f"{len(legends)} figure legends, not one"]
    legend = {
        text.get_text(): _look(handle)
        for handle, text in zip(legends[0].legend_handles, legends[0].get_texts(), strict=True)
    }
    if len(legend) != len(legends[0].get_texts()):
        found.append("a legend label appears twice")
    plotted = set()
    for ax, line in _lines(fig):
        method, label = line.get_gid(), line.get_label()
        plotted.add(label)
        where = f"{ax.get_title()}: {label}"
        s = plots.STYLES[method]
        if _look(line) != (s.color, s.marker, s.linestyle):
            found.append(f"{where}: drawn {_look(line)}, its method's style is {s}")
        if label != plots.LABELS[method]:
            found.append(f"{where}: labelled as another method ({method})")
        if label not in legend:
            found.append(f"{where}: not in the legend")
        elif legend[label] != _look(line):
            found.append(f"{where}: drawn {_look(line)}, the legend shows {legend[label]}")
        cell = json.loads(ax.get_gid())
        at = (scenario, cell["hospital"])
        xs, ys = list(line.get_xdata()), list(line.get_ydata())
        flat = summary.lookup(table, dataset, method, cell["n"], None, *at)
        if flat is not None:
            want = [flat["accuracy"]] * 2
        else:
            want = [
                summary.lookup(table, dataset, method, cell["n"], x, *at)["accuracy"]  # type: ignore[index]
                for x in xs
            ]
        if ys != pytest.approx(want, abs=1e-12):
            found.append(f"{where}: y {ys}, the rows' means {want}")
        for band in ax.collections:
            if band.get_gid() == method and to_hex(band.get_facecolor()[0], keep_alpha=False) != (
                s.color
            ):
                found.append(f"{where}: its band is another colour")
    for label in sorted(set(legend) - plotted):
        found.append(f"legend entry {label!r} plotted nowhere")
    return found


def _scenarios(table: list[dict[str, Any]]) -> list[str]:
    return summary.scenarios(table, "animal-mnist")


def test_every_method_has_one_style_of_its_own() -> None:
    assert set(plots.STYLES) == set(summary.METHODS) == set(plots.LABELS)
    looks = [(s.color, s.marker) for s in plots.STYLES.values()]
    assert len({c for c, _ in looks}) == len(looks), "two methods share a colour"
    assert len({m for _, m in looks}) == len(looks) - 1, "only alone and pooled lack markers"
    with pytest.raises(ValueError, match=r"plots\.STYLES"):
        plots.style("a-new-method")


@pytest.fixture(scope="module")
def table() -> list[dict[str, Any]]:
    return summary.table(scenario_rows())


def test_every_scenario_gets_a_figure_whose_lines_match_legend_and_rows(
    table: list[dict[str, Any]],
) -> None:
    assert _scenarios(table) == list(summary.SCENARIOS)
    for scenario in _scenarios(table):
        fig = plots.when_joining_pays(table, "animal-mnist", scenario)
        assert disagreements(fig, table, "animal-mnist", scenario) == [], scenario
        methods = {e["method"] for e in table if e["scenario"] == scenario}
        # The legend is the union of the methods plotted, not the last panel's.
        assert {t.get_text() for t in fig.legends[0].get_texts()} == {
            plots.LABELS[m] for m in methods
        }
        shown = plots.drawn(fig)
        assert summary.scenario_name(scenario) in shown["title"]
        assert all(p["xlabel"] == "eps (delta 1e-5)" for p in shown["panels"])
        assert all("1,000 held-out test images" in p["ylabel"] for p in shown["panels"][:1])
    mixed = plots.drawn(plots.when_joining_pays(table, "animal-mnist", "mixed-models"))
    assert [p["title"] for p in mixed["panels"]] == [
        "hospital-0 (cnn), n = 1348",
        "hospital-1 (linear), n = 1348",
        "hospital-2 (cnn), n = 1348",
    ]


def test_iid_panels_with_different_methods_keep_each_methods_colour(
    table: list[dict[str, Any]],
) -> None:
    """The bug: colours by drawing order in each panel, the legend from the last one.
    Here the n = 50 panel has the loop and DP-SGD, the n = 1,348 panel neither."""
    fig = plots.when_joining_pays(table, "animal-mnist", "iid")
    colours: dict[str, set[str]] = {}
    for _, line in _lines(fig):
        colours.setdefault(line.get_gid(), set()).add(to_hex(line.get_color()))
    assert all(len(c) == 1 for c in colours.values()), colours
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert plots.LABELS["capc-loop"] in labels and plots.LABELS["dp_sgd_pooled"] in labels


def test_the_check_catches_swapped_and_cycle_ordered_colours(
    table: list[dict[str, Any]],
) -> None:
    """Attack the check: two lines' colours swapped in one panel, a legend handle
    recoloured, and every panel coloured by matplotlib's cycle (the old plots)."""
    fig = plots.when_joining_pays(table, "animal-mnist", "iid")
    first = [line for ax, line in _lines(fig) if ax is fig.axes[0]]
    fed = next(x for x in first if x.get_gid() == "dp_fedavg")
    pate = next(x for x in first if x.get_gid() == "capc-pate-public")
    a, b = fed.get_color(), pate.get_color()
    fed.set_color(b)
    pate.set_color(a)
    found = disagreements(fig, table, "animal-mnist", "iid")
    assert any("DP-FedAvg" in f and "the legend shows" in f for f in found), found
    assert any("PATE" in f and "the legend shows" in f for f in found), found

    fig = plots.when_joining_pays(table, "animal-mnist", "iid")
    fig.legends[0].legend_handles[0].set_color("#000001")  # type: ignore[union-attr]
    assert any("the legend shows" in f for f in disagreements(fig, table, "animal-mnist", "iid"))

    fig = plots.when_joining_pays(table, "animal-mnist", "iid")
    for ax in fig.axes:
        drawn = [line for line in ax.get_lines() if not str(line.get_label()).startswith("_")]
        for i, line in enumerate(drawn):
            line.set_color(f"C{i}")
    assert disagreements(fig, table, "animal-mnist", "iid")


def test_the_check_catches_a_line_off_its_rows(table: list[dict[str, Any]]) -> None:
    fig = plots.when_joining_pays(table, "animal-mnist", "small-querier")
    _, line = next(_lines(fig))
    line.set_ydata([y + 0.01 for y in line.get_ydata()])
    assert any(
        "the rows' means" in f for f in disagreements(fig, table, "animal-mnist", "small-querier")
    )


def test_accuracy_against_n_uses_the_same_styles(table: list[dict[str, Any]]) -> None:
    fig = plots.accuracy_vs_n(table, "animal-mnist")
    shown = plots.drawn(fig)
    for panel in shown["panels"]:
        for line in panel["lines"]:
            s = plots.STYLES[line["method"]]
            assert (line["color"], line["marker"], line["linestyle"]) == (
                s.color,
                s.marker,
                s.linestyle,
            )
    legend = {e["label"]: e for e in shown["legend"]}
    assert (
        legend[plots.LABELS["dp_fedavg"] + " at eps 10"]["color"] == plots.STYLES["dp_fedavg"].color
    )
    assert legend[plots.LABELS["alone"]]["linestyle"] == "--"
    assert "at eps 10 (delta 1e-5)" in shown["panels"][0]["title"]


def test_draw_writes_each_figure_and_what_it_shows(tmp_path: Path) -> None:
    stale = tmp_path / "side-by-side-animal-mnist-accuracy-vs-epsilon.png"
    stale.write_bytes(b"old")
    written = plots.draw({"rows": scenario_rows()}, tmp_path)
    names = {p.name for p in written}
    assert "side-by-side-animal-mnist-mixed-models.png" in names
    assert "side-by-side-animal-mnist-mixed-models.json" in names
    assert not stale.exists(), "a figure the rows no longer make is left behind"
    again = plots.draw({"rows": scenario_rows()}, tmp_path)
    assert {p.read_bytes() for p in written} == {p.read_bytes() for p in again}


def test_the_committed_figures_are_what_the_saved_rows_give() -> None:
    """docs/img holds exactly the figures the saved rows make, and each one's record
    of what it shows is what drawing them from the rows shows now."""
    saved = json.loads((ROOT / "experiments/results/side-by-side.json").read_text())
    made = plots.figures(summary.table(saved["rows"]))
    folder = ROOT / "docs/img"
    committed = {p.name for p in folder.glob("side-by-side-*")}
    assert committed == {f"{name}.{ext}" for name in made for ext in ("png", "json")}
    for name, fig in made.items():
        recorded = json.loads((folder / f"{name}.json").read_text())
        assert recorded == json.loads(json.dumps(plots.drawn(fig))), (
            f"{name}: rerun python -m experiments.side_by_side.plots "
            "experiments/results/side-by-side.json docs/img"
        )
