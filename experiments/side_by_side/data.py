"""The side-by-side splits: one fixed test set, one tuning set, one public set, and
each hospital's share, of which the first ``n`` records are labelled.

The test records are those a :class:`services.local.LocalConsortium` with split seed
0 holds out (its student's test set), so a student trained through the services is
scored on the records every other method is scored on. Then come the DIET
student's reference records (unlabelled, images only), the tuning records (every
method's hyperparameters are chosen on them, never on the test records), and the
public records (PATE's transfer set). The rest is dealt to the hospitals anew per
seed; seed 0 is the tuning seed and is never reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from capc.data.offline import partition
from services import tasks
from services.local import REFERENCE, load_dataset

DATASETS = ("animal-mnist", "breast-cancer")
#: The seed whose hospital shares every method is tuned on; reported seeds differ.
TUNING_SEED = 0


@dataclass(frozen=True)
class Layout:
    """How many records each role gets (the hospitals share what is left)."""

    hospitals: int
    test: int
    reference: int
    tuning: int
    public: int
    #: Labelled records per hospital in the grid; ``None`` is all of its share.
    sizes: tuple[int | None, ...]


LAYOUTS: dict[str, Layout] = {
    # 10,000 images: 1,000 test (the demo's), 256 reference, 1,000 tuning, 1,000
    # public, 5 x 1,348 for the hospitals.
    "animal-mnist": Layout(5, 1000, REFERENCE, 1000, 1000, (50, 200, 1000, None)),
    # 569 patients: 142 test (the adoption experiment's), 57 tuning, 70 public,
    # 3 x 100 for the hospitals: n = 200 and 1,000 do not exist here.
    "breast-cancer": Layout(3, 142, 0, 57, 70, (50, None)),
}


@dataclass(frozen=True)
class Split:
    """Index sets into ``x``/``y`` for one dataset and one seed.

    ``x``: (N, 1, 28, 28) images in [0, 1] or (N, F) encoded table rows; ``y``: (N,)
    classes. ``shares[i]`` is hospital ``i``'s records in a seeded order: its first
    ``n`` are labelled, the rest unlabelled.
    """

    dataset: str
    seed: int
    x: NDArray[np.float32]
    y: NDArray[np.int64]
    classes: int
    test: NDArray[np.int64]
    reference: NDArray[np.int64]
    tuning: NDArray[np.int64]
    public: NDArray[np.int64]
    shares: tuple[NDArray[np.int64], ...]

    @property
    def hospitals(self) -> int:
        return len(self.shares)

    def size(self, n: int | None) -> int:
        """Labelled records per hospital for grid size ``n`` (``None``: all of a share)."""
        smallest = min(len(s) for s in self.shares)
        if n is None:
            return smallest
        if not 1 <= n <= smallest:
            raise ValueError(f"{self.dataset}: n={n}, but a hospital holds {smallest}")
        return n

    def labelled(self, i: int, n: int | None) -> NDArray[np.int64]:
        return self.shares[i][: self.size(n)]

    def unlabelled(self, i: int, n: int | None) -> NDArray[np.int64]:
        return self.shares[i][self.size(n) :]

    def pooled(self, n: int | None) -> NDArray[np.int64]:
        return np.concatenate([self.labelled(i, n) for i in range(self.hospitals)])


def task(dataset: str) -> dict[str, Any] | None:
    """The shipped task whose encoding the table rows use; ``None`` for images."""
    return tasks.load("breast-cancer") if dataset == "breast-cancer" else None


@cache
def _arrays(dataset: str) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    x, y = load_dataset(dataset, task=task(dataset))
    return np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64)


def split(dataset: str, seed: int) -> Split:
    """The split of ``dataset`` for ``seed`` (fixed roles; hospital shares per seed)."""
    if dataset not in LAYOUTS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
    layout = LAYOUTS[dataset]
    x, y = _arrays(dataset)
    # LocalConsortium's split seed 0: its held-out records are the test records.
    order = np.random.default_rng(7).permutation(len(x)).astype(np.int64)
    cuts = np.cumsum([layout.test, layout.reference, layout.tuning, layout.public])
    test, reference, tuning, public, rest = np.split(order, cuts)
    shares = tuple(
        rest[p][np.random.default_rng([11, seed, i]).permutation(len(p))]
        for i, p in enumerate(partition(len(rest), layout.hospitals, seed=1000 + seed))
    )
    return Split(dataset, seed, x, y, int(y.max()) + 1, test, reference, tuning, public, shares)
