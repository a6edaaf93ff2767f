"""capc's grid rows at their tuned picks (issue 43: every method tuned as the baselines
are, on records the reported numbers do not use).

``capc_tuning`` picks, per (method, n, eps), the configuration with the best accuracy
on the tuning records (its file's ``chosen``). This module turns those picks into
consortium runs through the services and says which of their rows stand:

* a pick that is the shipped rule: the grid's rows stand (:func:`mark` labels them);
* any other pick: one consortium per (n, configuration) with that configuration's
  teachers and mechanism, running only the methods that chose it, each priced only
  up to the largest eps it was chosen for (:func:`runs`); its rows are kept only at
  the eps where it was chosen, where they replace the grid's (:func:`kept`);
* a loop pick that weights hospital 0's own records (``own-x4``) runs as the student
  service's ``own_weight`` (:data:`OWN_WEIGHT`); one that filters its labels (``agree``)
  is not what the services' loop does, so it cannot run there (:func:`unrunnable`);
  those rows stay the shipped rule's, not marked tuned.

Rows record ``configuration`` (the pick's name) and ``tuned`` (True: the row is its
(method, n, eps)'s tuned pick).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments.side_by_side.capc_runs import METHODS, CapcConfig

#: Every name of a shipped rule's configuration starts so (``capc_tuning``'s grids).
SHIPPED = "shipped"
#: What the services' loop does with its labels (``tuner.Candidate.labels``).
SERVICE_LABELS = "retrain"
#: The loop's label handlings the services run: {``Candidate.labels``: the student
#: service's ``own_weight``, how many times hospital 0's own records enter its fit}.
OWN_WEIGHT = {SERVICE_LABELS: 1, "own-x4": 4}


@dataclass(frozen=True)
class TunedRun:
    """One consortium at a tuned configuration: ``n`` labelled records a hospital,
    ``methods`` {method: the eps it chose this configuration at}."""

    n: int
    configuration: str
    teachers: int
    mechanism: dict[str, Any]
    methods: dict[str, tuple[float, ...]]
    #: The loop's own records' weight (:data:`OWN_WEIGHT`).
    own_weight: int = 1

    def config(self, base: CapcConfig) -> CapcConfig:
        """``base`` with this configuration's teachers, mechanism and own records' weight,
        its eps the union of the methods' (what the consortium's cap is set from)."""
        epsilons = tuple(sorted({e for es in self.methods.values() for e in es}))
        return replace(
            base,
            epsilons=epsilons,
            teachers=self.teachers,
            mechanism=dict(self.mechanism),
            own_weight=self.own_weight,
        )


def load(path: Path, dataset: str) -> list[dict[str, Any]]:
    """The ``chosen`` picks of ``dataset`` in a ``capc_tuning`` file (a pick names its
    dataset; a file of one dataset may say it once, as ``dataset``)."""
    saved = json.loads(path.read_text())
    return [p for p in saved["chosen"] if p.get("dataset", saved.get("dataset")) == dataset]


def _shipped(pick: dict[str, Any]) -> bool:
    return str(pick["chosen"]).startswith(SHIPPED)


def unrunnable(pick: dict[str, Any]) -> bool:
    """A pick the services cannot run: none (no configuration scored), or a loop that
    filters its labels (any handling not in :data:`OWN_WEIGHT`)."""
    config = pick["chosen_config"]
    return config is None or config.get("labels", SERVICE_LABELS) not in OWN_WEIGHT


def runs(
    picks: Iterable[dict[str, Any]],
    sizes: Sequence[int] | None = None,
    methods: Sequence[str] = METHODS,
) -> list[TunedRun]:
    """The consortia the non-shipped picks need: one per (n, configuration), running
    the ``methods`` that chose it at the eps they chose it for. ``sizes``: only these n,
    in this order (default: every n, largest first); configurations in order of name."""
    grouped: dict[tuple[int, str], dict[str, set[float]]] = {}
    configs: dict[tuple[int, str], dict[str, Any]] = {}
    for p in picks:
        if p["method"] not in methods or _shipped(p) or unrunnable(p):
            continue
        if sizes is not None and p["n"] not in sizes:
            continue
        k = (int(p["n"]), str(p["chosen"]))
        grouped.setdefault(k, {}).setdefault(p["method"], set()).add(float(p["epsilon"]))
        if configs.setdefault(k, p["chosen_config"]) != p["chosen_config"]:
            raise ValueError(f"two configurations are named {k[1]!r} at n={k[0]}")
    order = list(sizes) if sizes is not None else sorted({n for n, _ in grouped}, reverse=True)
    out = []
    for n, name in sorted(grouped, key=lambda k: (order.index(k[0]), k[1])):
        c = configs[(n, name)]
        out.append(
            TunedRun(
                n=n,
                configuration=name,
                teachers=int(c["teachers"]),
                mechanism=dict(c["mechanism"]),
                methods={m: tuple(sorted(es)) for m, es in sorted(grouped[(n, name)].items())},
                own_weight=OWN_WEIGHT[c.get("labels", SERVICE_LABELS)],
            )
        )
    return out


def kept(rows: Iterable[dict[str, Any]], run: TunedRun) -> list[dict[str, Any]]:
    """``run``'s rows at the eps their method chose its configuration for, marked."""
    out = []
    for r in rows:
        if r["epsilon"] in run.methods.get(r["method"], ()):
            out.append({**r, "configuration": run.configuration, "tuned": True})
    return out


def _pick_key(method: str, n: int, epsilon: float) -> tuple[str, int, float]:
    return (method, int(n), float(epsilon))


def mark(
    rows: Iterable[dict[str, Any]], picks: Iterable[dict[str, Any]], dataset: str
) -> list[dict[str, Any]]:
    """``rows`` with every capc row of ``dataset`` whose (method, n, eps) was tuned
    marked: a grid row (no ``configuration``) where the shipped rule was chosen is
    the tuned pick; a row made at a configuration is the tuned pick where that
    configuration is still the one chosen. Other rows are left as they are."""
    chosen = {_pick_key(p["method"], p["n"], p["epsilon"]): p for p in picks}
    out = []
    for r in rows:
        if r["dataset"] != dataset or r["epsilon"] is None:  # baselines with no eps
            out.append(r)
            continue
        p = chosen.get(_pick_key(r["method"], r["n"], r["epsilon"]))
        if p is None or p["chosen"] is None:
            out.append(r)
            continue
        made_at = r.get("configuration")
        if made_at is None and _shipped(p):
            out.append({**r, "configuration": p["chosen"], "tuned": True})
        else:
            out.append({**r, "tuned": made_at == p["chosen"]})
    return out
