"""A multi-label dataset derived from animal-mnist: five attributes of each animal.

animal-mnist has ten classes; its package lists them alphabetically (bear,
bird, cat, cow, dog, elephant, giraffe, horse, sheep, zebra) and class index i
is taken to be the i-th of that list. Each image gets the k = 5 attribute
vector of its class:

=========  =======  ========  =====  =========  =======
animal     hoofed   domestic  large  carnivore  african
=========  =======  ========  =====  =========  =======
bear       0        0         1      1          0
bird       0        0         0      0          0
cat        0        1         0      1          0
cow        1        1         1      0          0
dog        0        1         0      1          0
elephant   0        0         1      0          1
giraffe    1        0         1      0          1
horse      1        1         1      0          0
sheep      1        1         0      0          0
zebra      1        0         1      0          1
=========  =======  ========  =====  =========  =======

"large" means a typical adult above 100 kg. The attributes are a fixed
function of the class, so the labels are exact whichever way the class names
map to indices. Cat and dog share a vector, so do cow and horse: 7 of the
32 subsets occur. Label frequencies are 0.3 to 0.6; a vector has 2.2
positive labels on average (mean l2 norm 1.40).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from capc.data.offline import animal_mnist

ANIMALS = (
    "bear",
    "bird",
    "cat",
    "cow",
    "dog",
    "elephant",
    "giraffe",
    "horse",
    "sheep",
    "zebra",
)
ATTRIBUTES = ("hoofed", "domestic", "large", "carnivore", "african")

#: (classes, attributes) 0/1 table; row i describes ANIMALS[i].
ATTRIBUTE_TABLE: NDArray[np.int8] = np.array(
    [
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0],
        [0, 1, 0, 1, 0],
        [1, 1, 1, 0, 0],
        [0, 1, 0, 1, 0],
        [0, 0, 1, 0, 1],
        [1, 0, 1, 0, 1],
        [1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 1],
    ],
    dtype=np.int8,
)


def attributes_of(classes: NDArray[np.int64]) -> NDArray[np.int8]:
    """Attribute vectors (N, 5) of animal-mnist class indices (N,)."""
    c = np.asarray(classes)
    if c.ndim != 1 or ((c < 0) | (c >= len(ANIMALS))).any():
        raise ValueError(f"classes must be a 1-D array of indices in [0, {len(ANIMALS)})")
    return ATTRIBUTE_TABLE[c]


def animal_attributes() -> tuple[NDArray[np.float32], NDArray[np.int8]]:
    """animal-mnist images (10000, 1, 28, 28) in [0, 1] and their attributes (10000, 5) in {0, 1}."""
    x, y = animal_mnist()
    return x, attributes_of(y)
