"""A hospital's files, written by the tests themselves: PNG folders, CSV tables, DICOM sets, NPZ.

Small real data (animal-mnist images, scikit-learn's breast cancer table and
digits), so a teacher fitted on them must beat chance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from capc.data.offline import animal_mnist, digits

ANIMAL_CLASSES = [f"animal{i}" for i in range(10)]
DIGIT_CLASSES = [f"d{i}" for i in range(10)]


def animal_split(
    per_class: int, test: int = 300, seed: int = 0
) -> tuple[NDArray[np.float32], NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]]:
    """``per_class`` animal-mnist images of each class to write, and ``test`` other ones."""
    x, y = animal_mnist()
    order = np.random.default_rng(seed).permutation(len(x))
    chosen = np.concatenate([order[y[order] == c][:per_class] for c in range(10)])
    rest = np.setdiff1d(order, chosen)[:test]
    return x[chosen], y[chosen], x[rest], y[rest]


def write_png_folder(
    root: Path, x: NDArray[np.float32], y: NDArray[np.int64], classes: list[str]
) -> Path:
    """Images (N, 1, H, W) in [0, 1] as 8-bit grey PNGs in one subfolder per class."""
    from PIL import Image

    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        folder = root / classes[int(label)]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((img[0] * 255).round().astype(np.uint8), "L").save(folder / f"{i}.png")
    return root


def breast_cancer_frame() -> pd.DataFrame:
    """569 patients: an identifier column, 30 numeric features and a 'diagnosis' label."""
    from sklearn.datasets import load_breast_cancer

    frame: pd.DataFrame = load_breast_cancer(as_frame=True).frame
    frame["diagnosis"] = frame.pop("target").map({0: "malignant", 1: "benign"})
    frame.insert(0, "patient_id", [f"P{i:04d}" for i in range(len(frame))])
    return frame


def write_dicom(path: Path, image: NDArray[np.float32], bits: int = 12) -> None:
    """A (H, W) image in [0, 1] as a single-frame MONOCHROME2 DICOM of ``bits`` stored bits."""
    from pydicom import dcmwrite
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality = "OT"
    ds.Rows, ds.Columns = image.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, bits, bits - 1
    ds.PixelRepresentation = 0
    ds.PixelData = (image * (2**bits - 1)).round().astype("<u2").tobytes()
    dcmwrite(path, ds, enforce_file_format=True)


def write_dicom_set(root: Path, count: int, seed: int = 0) -> tuple[Path, Path]:
    """``count`` scikit-learn digits (8x8, so every one is resized to the task's 28x28) as
    DICOM files in ``root`` and their labels in ``root/labels.csv`` (columns file, label)."""
    x, y = digits(size=8)
    idx = np.random.default_rng(seed).permutation(len(x))[:count]
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in idx:
        name = f"scan{i:04d}.dcm"
        write_dicom(root / name, x[i, 0])
        rows.append({"file": name, "label": DIGIT_CLASSES[int(y[i])]})
    labels = root / "labels.csv"
    pd.DataFrame(rows).to_csv(labels, index=False)
    return root, labels


def digits_npz(path: Path, count: int, seed: int = 0) -> Path:
    """``count`` digits at 28x28 as an NPZ: x (N, 1, 28, 28) in [0, 1], y (N,) class names."""
    x, y = digits(size=28)
    idx = np.random.default_rng(seed).permutation(len(x))[:count]
    names = np.array(DIGIT_CLASSES)[y[idx]]
    np.savez(path, x=np.clip(x[idx], 0.0, 1.0), y=names)
    return path
