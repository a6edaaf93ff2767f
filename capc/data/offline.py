"""Offline datasets and disjoint partitions for hospitals.

- animal-mnist: 10,000 real 28x28 grey images in 10 classes (MIT licence),
  read straight from the gzipped pickles inside the installed wheel (its own
  loader imports TensorFlow, so it is not used);
- scikit-learn digits: 1,797 8x8 digits, upsampled to 28x28 if asked;
- scikit-learn breast cancer: 569 patients, 30 features, standardised (or raw,
  for a table task's schema to encode).
Nothing is downloaded. Partitions into hospitals are disjoint: i.i.d., or
label-skewed (each hospital's class mix drawn from a Dirichlet).
"""

from __future__ import annotations

import gzip
import importlib.util
import pickle
from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray
from torch.nn import functional


def _package_folder(name: str) -> Path:
    """Where the installed package ``name`` lies, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {name} package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def digits(size: int = 28) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """scikit-learn's 1,797 8x8 digits as (N, 1, size, size) floats in [0, 1] and (N,) labels."""
    # The file load_digits reads, read as it reads it: importing scikit-learn costs
    # about 3 s of CPU, more than the rest of a short command that only needs digits.
    path = _package_folder("sklearn") / "datasets" / "data" / "digits.csv.gz"
    if path.is_file():
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = np.loadtxt(f, delimiter=",")
        if data.shape != (1797, 65):
            raise ValueError(f"unexpected scikit-learn digits array: {data.shape}")
        images, target = data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
    else:  # a scikit-learn that keeps the file elsewhere: its own reader
        from sklearn.datasets import load_digits

        d = load_digits()
        images, target = d.images, d.target.astype(np.int64)
    x = torch.from_numpy((images / 16.0).astype(np.float32)[:, None])
    if size != 8:
        x = functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.numpy().astype(np.float32), target


def breast_cancer() -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """scikit-learn's breast cancer data: (569, 30) features standardised to mean 0 and
    unit variance per feature, and (569,) labels (0 malignant, 1 benign)."""
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    x = np.asarray(d.data, dtype=np.float64)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    return x.astype(np.float32), np.asarray(d.target, dtype=np.int64)


def breast_cancer_records() -> tuple[dict[str, NDArray[np.float64]], NDArray[np.int64]]:
    """scikit-learn's breast cancer data as a hospital's file holds it: raw measurements,
    one (569,) float64 column per feature (sklearn's names), and (569,) labels (0 malignant,
    1 benign). A table task's schema encodes them (services/tasks/breast-cancer.json)."""
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    data = np.asarray(d.data, dtype=np.float64)
    columns = {str(name): data[:, j] for j, name in enumerate(d.feature_names)}
    return columns, np.asarray(d.target, dtype=np.int64)


ANIMAL_MNIST_CLASSES = 10


def animal_mnist() -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """animal-mnist as (10000, 1, 28, 28) floats in [0, 1] and (10000,) labels."""
    spec = importlib.util.find_spec("animal_mnist")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the animal-mnist package is not installed (pip install animal-mnist)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "data" / "Animal_MNIST"
    # The wheel ships its arrays as gzipped pickles; they come from the installed package only.
    with gzip.open(folder / "animal_data_version_3.gz", "rb") as f:
        images = np.asarray(pickle.load(f))
    with gzip.open(folder / "animal_label_version_3.gz", "rb") as f:
        labels = np.asarray(pickle.load(f))
    if images.shape != (10_000, 28, 28) or labels.shape != (10_000,):
        raise ValueError(f"unexpected animal-mnist arrays: {images.shape}, {labels.shape}")
    return (images.astype(np.float32) / 255.0)[:, None], labels.astype(np.int64)


def partition(n: int, parts: int, seed: int = 0) -> list[NDArray[np.int64]]:
    """Disjoint, i.i.d. index sets covering range(n)."""
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} items into {parts} parts")
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(p).astype(np.int64) for p in np.array_split(order, parts)]


def skewed_partition(
    labels: NDArray[np.integer], parts: int, alpha: float = 0.5, seed: int = 0
) -> list[NDArray[np.int64]]:
    """Disjoint index sets covering every index of (N,) class ``labels``, label-skewed.

    Each class is split among the hospitals in proportions drawn from
    Dirichlet(``alpha``): small ``alpha`` gives hospitals that see mostly a
    few classes, large ``alpha`` approaches the i.i.d. split. Every hospital
    gets at least one example.
    """
    y = np.asarray(labels)
    if y.ndim != 1 or not 1 <= parts <= len(y):
        raise ValueError(f"cannot split {len(y)} labels into {parts} parts")
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    rng = np.random.default_rng(seed)
    owner = np.empty(len(y), dtype=np.int64)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        share = rng.dirichlet(np.full(parts, alpha))
        cuts = (np.cumsum(share)[:-1] * len(idx)).astype(np.int64)
        for part, chunk in enumerate(np.split(idx, cuts)):
            owner[chunk] = part
    # Hand an example to any empty hospital from the largest one.
    for part in range(parts):
        if not (owner == part).any():
            largest = int(np.bincount(owner, minlength=parts).argmax())
            owner[np.flatnonzero(owner == largest)[0]] = part
    return [np.flatnonzero(owner == part).astype(np.int64) for part in range(parts)]
