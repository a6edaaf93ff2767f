"""Consortia where hospitals need each other (issue 52), as transforms of a side-by-side
split, and the tuning pools every new method and scenario is tuned on.

* ``iid``: today's grid (every hospital labels its first ``n`` records);
* ``small-querier``: hospital 0 labels only its first ``n`` records (the rest of its
  share unlabelled), every other hospital all of its share;
* ``skew-<alpha>``: the seed's hospital pool (the union of its shares) dealt anew by
  Dirichlet(``alpha``) label skew (:func:`capc.data.offline.skewed_partition`, seeded
  per seed), every record labelled;
* ``mixed-models``: the iid split; the hospitals differ in their models, not their data.

Tuning (the issue's rule: on records disjoint from every reported seed's pool). The
seed-0 shares the baselines were tuned on are dealt from the same pool as every
reported seed's; here :func:`tuning_split` deals ``split.tuning`` (1,000 records no
hospital ever holds) into pseudo-hospital shares with the same scenario transform and
scores on ``split.public`` (no method tuned so reads public records). Pseudo shares
are ~200 records, so a grid size ``n`` is capped at half a pseudo share there
(``tuning_n``), leaving a querier unlabelled records to buy labels for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from capc.data.offline import partition, skewed_partition
from experiments.side_by_side.data import TUNING_SEED, Split

SCENARIOS = ("iid", "small-querier", "skew-0.1", "skew-0.5", "mixed-models")
#: Mixed models: each hospital's architecture (``onnx``: a closed model that only answers).
MIXED_ARCHITECTURES = ("diet-linear", "diet-linear", "small-cnn", "small-cnn", "onnx")
#: What every tuning row records as ``tuned_on``.
TUNED_ON = (
    "split.tuning (1,000 records disjoint from every seed's hospital shares) dealt into "
    "pseudo-hospital shares with the scenario's transform; scored on split.public"
)


@dataclass(frozen=True)
class ScenarioSplit(Split):
    """A :class:`Split` whose hospitals label ``counts[i]`` of their records each.

    ``n``: the grid size it was made for (``None``: all), what rows report as ``n``
    (:meth:`size`): the querier's count for ``small-querier``, otherwise the iid grid's
    (the mean share for ``None``, 1,348 on animal-mnist, so rows line up with iid's)."""

    scenario: str = "iid"
    counts: tuple[int, ...] = ()
    grid_n: int | None = None
    reported_n: int = 0

    def size(self, n: int | None) -> int:
        if n != self.grid_n and n != self.reported_n:
            raise ValueError(f"this {self.scenario} split was made for n={self.grid_n}, not {n}")
        return self.reported_n

    def labelled(self, i: int, n: int | None) -> NDArray[np.int64]:
        self.size(n)
        return self.shares[i][: self.counts[i]]

    def unlabelled(self, i: int, n: int | None) -> NDArray[np.int64]:
        self.size(n)
        return self.shares[i][self.counts[i] :]

    def pooled(self, n: int | None) -> NDArray[np.int64]:
        return np.concatenate([self.labelled(i, n) for i in range(self.hospitals)])


def skew_alpha(scenario: str) -> float:
    """``skew-0.1`` -> 0.1."""
    if not scenario.startswith("skew-"):
        raise ValueError(f"{scenario!r} is not a skew scenario")
    return float(scenario.removeprefix("skew-"))


def _base(s: Split) -> dict[str, object]:
    return {f: getattr(s, f) for f in Split.__dataclass_fields__}


def transform(s: Split, scenario: str, n: int | None) -> ScenarioSplit:
    """``s`` under ``scenario`` at grid size ``n`` (``None``: every record labelled)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    shares = s.shares
    whole = sum(len(p) for p in shares) // len(shares)
    if scenario == "small-querier":
        if n is None:
            raise ValueError("small-querier needs the querier's n (it labels only n records)")
        counts = (s.size(n), *(len(p) for p in shares[1:]))
        reported = s.size(n)
    elif scenario.startswith("skew-"):
        if n is not None:
            raise ValueError(f"{scenario} labels every record (n = all), not n={n}")
        pool = np.concatenate(shares)
        # Seeded per split seed and alpha; every record of the pool lands in one share.
        alpha = skew_alpha(scenario)
        rng_seed = [23, s.seed, round(alpha * 1000)]
        parts = skewed_partition(s.y[pool], len(shares), alpha=alpha, seed=rng_seed)  # type: ignore[arg-type]
        shares = tuple(
            pool[p][np.random.default_rng([29, s.seed, i]).permutation(len(p))]
            for i, p in enumerate(parts)
        )
        counts = tuple(len(p) for p in shares)
        reported = whole
    else:
        counts = tuple(min(s.size(n), len(p)) for p in shares)
        reported = s.size(n)
    fields = {**_base(s), "shares": shares}
    return ScenarioSplit(
        **fields,  # type: ignore[arg-type]
        scenario=scenario,
        counts=counts,
        grid_n=n,
        reported_n=reported,
    )


def tuning_n(scenario: str, n: int | None, share: int) -> int | None:
    """The grid size ``n`` stands for on pseudo shares of ``share`` records."""
    # Capped at half a pseudo share, so a loop there has records to buy labels for.
    return None if n is None else min(n, share // 2)


def tuning_split(s: Split, scenario: str, n: int | None) -> ScenarioSplit:
    """The pseudo-consortium a scenario's methods are tuned on: ``s.tuning`` dealt into
    ``s.hospitals`` shares (seed :data:`TUNING_SEED`), the scenario's transform applied,
    ``tuning`` (what :func:`baselines.tune` scores on) set to ``s.public``. The test
    records are dropped so nothing tuned can read them."""
    tuning = s.tuning
    shares = tuple(
        tuning[p][np.random.default_rng([31, i]).permutation(len(p))]
        for i, p in enumerate(partition(len(tuning), s.hospitals, seed=4242))
    )
    pseudo = replace(
        s,
        seed=TUNING_SEED,
        shares=shares,
        tuning=s.public,
        test=np.zeros(0, dtype=np.int64),
    )
    smallest = min(len(p) for p in shares)
    return transform(pseudo, scenario, tuning_n(scenario, n, smallest))
