"""Reading a hospital's own records into a task's inputs and class indices.

Four sources, each checked record by record against the task's schema
(:mod:`capc.data.schema`); the first bad record is a :class:`SchemaError`
naming the file and the row or field, so a hospital can fix its data:

- a folder of images in class subfolders (PNG or JPEG, read with Pillow),
  converted to the task's channels (grey / RGB) and size (bilinear resize)
  and scaled from 8-bit pixels to the task's value range;
- DICOM files with a labels CSV (a file column and a label column); pixel
  values are scaled by the stored bit depth (a public, per-format constant,
  never fitted to the data) and MONOCHROME1 is inverted;
- a CSV or Parquet table with a label column, encoded by the table schema;
- an NPZ with arrays ``x`` (records already in the task's input shape and
  range: images, or encoded table rows) and ``y`` (class names or indices).

Row numbers: a CSV's (a table or a labels CSV) are its line numbers (the
header is line 1); a Parquet file's and an NPZ's rows count from 0.

The files are untrusted input (records gathered from many systems, or handed
over): an image is refused, naming it, when it declares more pixels than
:func:`pixel_limit` allows for the task before a byte of it is decoded (a
17 KiB PNG can declare 144 Mpx and cost 278 MiB); every file read from a
folder must lie inside that folder once symbolic links are followed, and a
labels CSV names files inside ``--data`` only (no ``..``, no absolute paths).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from capc.data.schema import (
    FloatRecords,
    ImageSchema,
    RecordSchema,
    SchemaError,
    TableSchema,
    level_names,
)

#: Image files a class folder may hold (lower-case suffixes).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
#: Pillow modes for 1 to 4 channels.
_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}
#: ITU-R BT.601 luma weights: an RGB DICOM read for a grey task.
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)
#: Pixels (height x width) any image may have, whatever the task: 32 Mi, a 5792 x 5792
#: image, above the largest radiographs and mammograms (about 4000 x 5000), at most
#: 128 MiB decoded as float32 grey.
MIN_PIXEL_LIMIT = 1 << 25
#: Pixels an image may have per pixel of the task's input: a task on large images may
#: read images larger than MIN_PIXEL_LIMIT in this proportion.
PIXELS_PER_TASK_PIXEL = 64


@dataclass(frozen=True)
class Records:
    """A hospital's records: ``x`` (N, *input_shape) float32, ``y`` (N,) class indices, and
    ``source`` (what was read, for the teacher's card)."""

    x: FloatRecords
    y: NDArray[np.int64]
    source: str

    def __len__(self) -> int:
        return len(self.y)


def class_indices(
    values: Sequence[Any] | NDArray[Any], classes: Sequence[str], where: str, first_row: int = 0
) -> NDArray[np.int64]:
    """Labels -> indices into ``classes``; an unknown or missing label names ``where`` and its row."""
    index = {name: i for i, name in enumerate(classes)}
    names = level_names(np.asarray(values, dtype=object))
    out = np.empty(len(names), dtype=np.int64)
    for row, name in enumerate(names):
        i = index.get(name)
        if i is None:
            shown = repr(name) if name else "a missing label"
            raise SchemaError(
                f"{where}: row {first_row + row}: label {shown} is not one of the task's classes "
                f"{list(classes)}"
            )
        out[row] = i
    return out


def to_range(unit: NDArray[np.float32], schema: ImageSchema) -> FloatRecords:
    """Values in [0, 1] -> the task's range [low, high]."""
    return (schema.low + (schema.high - schema.low) * unit).astype(np.float32)


def pixel_limit(schema: ImageSchema) -> int:
    """Most pixels (height x width) an image read for ``schema``'s task may have:
    ``max(MIN_PIXEL_LIMIT, PIXELS_PER_TASK_PIXEL * height * width)`` of the task."""
    return max(MIN_PIXEL_LIMIT, PIXELS_PER_TASK_PIXEL * schema.height * schema.width)


def check_pixels(path: Path, width: int, height: int, schema: ImageSchema) -> None:
    """SchemaError naming ``path`` when a ``width`` x ``height`` image is above the task's
    :func:`pixel_limit` (checked from the header, before anything is decoded)."""
    limit = pixel_limit(schema)
    if width * height > limit:
        raise SchemaError(
            f"{path}: {width} x {height} pixels ({width * height / 1e6:.1f} Mpx) is more than "
            f"the {limit / 1e6:.1f} Mpx an image may have for a {schema.height} x "
            f"{schema.width} task (it may be a decompression bomb); downscale it, or leave "
            "it out"
        )


def inside(root: Path, path: Path, what: str = "file") -> Path:
    """``path`` resolved (symbolic links followed); SchemaError naming it when it lies
    outside ``root`` (``--data``): a link or a listed name must not reach other files.
    (Checked when the folder is read: the hospital's own folder is not assumed to change
    under the reader.)"""
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise SchemaError(
            f"{path}: the {what} lies outside {root} (it resolves to {resolved}); only files "
            f"inside the data folder are read: copy it in, or remove the link"
        )
    return resolved


def read_image(path: Path, schema: ImageSchema) -> FloatRecords:
    """One PNG/JPEG as (C, H, W) float32 in the task's range; SchemaError if it cannot be
    read or declares more pixels than :func:`pixel_limit` (checked before decoding)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Pillow warns of a possible bomb from 89 Mpx; the task's own limit decides.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(path)
        with opened as img:
            check_pixels(path, img.width, img.height, schema)
            img.load()  # decode now: a truncated or corrupt file fails here, not later
            converted = img.convert(_MODES[schema.channels])
            if converted.size != (schema.width, schema.height):
                converted = converted.resize(
                    (schema.width, schema.height), Image.Resampling.BILINEAR
                )
            pixels = np.asarray(converted, dtype=np.float32) / 255.0
    except SchemaError:
        raise
    except Image.DecompressionBombError as err:  # Pillow's own limit, should ours be above
        raise SchemaError(f"{path}: refused as a decompression bomb ({err})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise SchemaError(f"{path}: not a readable image ({err})") from None
    chw = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    one: FloatRecords = schema.check(to_range(chw, schema)[None], str(path))[0]
    return one


def _resize_unit(pixels: NDArray[np.float32], schema: ImageSchema) -> NDArray[np.float32]:
    """(H, W) or (H, W, C) values in [0, 1] -> (C, H, W) with the task's channels and size."""
    from PIL import Image

    hwc = pixels[:, :, None] if pixels.ndim == 2 else pixels
    if hwc.shape[2] >= 3 and schema.channels == 1:
        hwc = (hwc[:, :, :3] @ _LUMA)[:, :, None]
    elif hwc.shape[2] == 1 and schema.channels > 1:
        hwc = np.repeat(hwc, schema.channels, axis=2)
    if hwc.shape[2] != schema.channels:
        raise ValueError(f"{hwc.shape[2]} channels cannot be read as {schema.channels}")
    planes = [
        np.asarray(
            Image.fromarray(np.ascontiguousarray(hwc[:, :, c], dtype=np.float32), mode="F").resize(
                (schema.width, schema.height), Image.Resampling.BILINEAR
            )
        )
        for c in range(schema.channels)
    ]
    # Bilinear resampling stays within its inputs' range up to rounding.
    out: NDArray[np.float32] = np.clip(np.stack(planes), 0.0, 1.0).astype(np.float32)
    return out


def read_dicom(path: Path, schema: ImageSchema) -> FloatRecords:
    """One single-frame DICOM image as (C, H, W) float32 in the task's range."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        ds = pydicom.dcmread(path)
        # The header's size, before the pixel data is decoded (it may be compressed).
        rows, columns = int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0)
        check_pixels(path, columns, rows, schema)
        raw = np.asarray(ds.pixel_array, dtype=np.float64)
        bits = int(ds.get("BitsStored", 8))
        rgb = int(ds.get("SamplesPerPixel", 1)) > 1
        frames = int(ds.get("NumberOfFrames", 1) or 1)
        if frames > 1 or raw.ndim > (3 if rgb else 2):
            raise ValueError(f"{frames} frames; one image per file is read")
        if int(ds.get("PixelRepresentation", 0)) == 1:
            raw = raw + 2.0 ** (bits - 1)  # signed samples: shift to [0, 2**bits - 1]
        unit = raw / (2.0**bits - 1.0)
        if str(ds.get("PhotometricInterpretation", "")) == "MONOCHROME1":
            unit = 1.0 - unit  # MONOCHROME1: the lowest value is white
        if not (np.isfinite(unit).all() and unit.min() >= 0.0 and unit.max() <= 1.0):
            raise ValueError(f"pixel values outside the {bits}-bit range it declares")
        chw = _resize_unit(unit.astype(np.float32), schema)
    except SchemaError:
        raise
    except FileNotFoundError:
        raise SchemaError(f"{path}: no such file") from None
    except (InvalidDicomError, OSError, ValueError, AttributeError, KeyError, TypeError) as err:
        raise SchemaError(f"{path}: not a readable DICOM image ({err})") from None
    one: FloatRecords = schema.check(to_range(chw, schema)[None], str(path))[0]
    return one


def read_image_folder(folder: Path, schema: ImageSchema, classes: Sequence[str]) -> Records:
    """A folder with one subfolder per class (named as the task's classes) of PNG/JPEG files."""
    subfolders = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not subfolders:
        raise SchemaError(
            f"{folder}: no class subfolders; put each class's images in a folder named after it"
        )
    images: list[FloatRecords] = []
    labels: list[int] = []
    for sub in subfolders:
        if sub.name not in classes:
            raise SchemaError(
                f"{sub}: folder name {sub.name!r} is not one of the task's classes {list(classes)}"
            )
        inside(folder, sub, "class folder")
        for f in sorted(sub.iterdir()):
            if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES:
                inside(folder, f)
                images.append(read_image(f, schema))
                labels.append(list(classes).index(sub.name))
    if not images:
        raise SchemaError(f"{folder}: no {'/'.join(IMAGE_SUFFIXES)} files in its class folders")
    return Records(
        np.stack(images), np.asarray(labels, dtype=np.int64), f"image folder {folder.name}"
    )


def read_frame(path: Path) -> Any:
    """A CSV or Parquet file as a pandas DataFrame; SchemaError if it cannot be read."""
    import pandas as pd

    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(path)
        return pd.read_csv(path)
    except FileNotFoundError:
        raise SchemaError(f"{path}: no such file") from None
    except (ValueError, OSError, pd.errors.ParserError, ImportError) as err:
        raise SchemaError(f"{path}: not a readable table ({err})") from None


def _column(frame: Any, name: str, path: Path, what: str) -> Any:
    if name not in frame.columns:
        raise SchemaError(
            f"{path}: missing {what} column {name!r}; its columns are {', '.join(map(str, frame.columns))}"
        )
    return frame[name]


def first_row(path: Path) -> int:
    """How a table's rows are numbered in messages: a CSV's line numbers, else from 0."""
    return 2 if path.suffix.lower() == ".csv" else 0


def read_table(path: Path, schema: TableSchema, classes: Sequence[str], label: str) -> Records:
    """A CSV/Parquet table: the schema's features encoded, ``label``'s values as classes."""
    frame = read_frame(path)
    start = first_row(path)
    y = class_indices(_column(frame, label, path, "label").to_numpy(), classes, str(path), start)
    x = schema.encode(frame, str(path), start)
    return Records(schema.check(x, str(path)), y, f"table {path.name}")


def read_dicom_folder(
    folder: Path,
    labels_csv: Path,
    schema: ImageSchema,
    classes: Sequence[str],
    file_column: str = "file",
    label_column: str = "label",
) -> Records:
    """DICOM files listed in ``labels_csv`` (paths relative to ``folder``) with their labels.

    Every ``.dcm`` file in ``folder`` must have a row: a file without a label
    is refused rather than silently left out."""
    table = read_frame(labels_csv)
    files = [str(f) for f in _column(table, file_column, labels_csv, "file").to_numpy()]
    y = class_indices(
        _column(table, label_column, labels_csv, "label").to_numpy(),
        classes,
        str(labels_csv),
        first_row(labels_csv),
    )
    for row, name in enumerate(files):
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise SchemaError(
                f"{labels_csv}: row {first_row(labels_csv) + row}: {file_column} {name!r} "
                f"must be a path inside {folder} relative to it (no absolute path, no '..')"
            )
    listed = {(folder / f).resolve() for f in files}
    for f in sorted(folder.rglob("*")):
        if f.is_file() and f.suffix.lower() == ".dcm" and f.resolve() not in listed:
            raise SchemaError(
                f"{f}: no row in {labels_csv} (column {file_column!r}); every DICOM file "
                "needs a label"
            )
    if not files:
        raise SchemaError(f"{labels_csv}: no rows")
    images = []
    for row, name in enumerate(files):
        path = folder / name
        if not path.is_file():
            raise SchemaError(
                f"{labels_csv}: row {first_row(labels_csv) + row}: no file {path} for "
                f"{file_column} {name!r}"
            )
        inside(folder, path)
        images.append(read_dicom(path, schema))
    return Records(np.stack(images), y, f"DICOM folder {folder.name} with {labels_csv.name}")


def read_npz(
    path: Path, schema: RecordSchema | None, shape: tuple[int, ...], classes: Sequence[str]
) -> Records:
    """An NPZ with ``x`` (N, *shape) records in the task's range (tables: encoded rows) and
    ``y`` (N,) class names or indices."""
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in ("x", "y") if k not in data.files]
            if missing:
                raise SchemaError(
                    f"{path}: missing array {missing[0]!r}; an NPZ needs 'x' (records) and "
                    f"'y' (labels), it has {', '.join(data.files) or 'none'}"
                )
            x, y = np.asarray(data["x"]), np.asarray(data["y"])
    except FileNotFoundError:
        raise SchemaError(f"{path}: no such file") from None
    except (ValueError, OSError, EOFError) as err:
        raise SchemaError(f"{path}: not a readable NPZ ({err})") from None
    if y.ndim != 1 or len(y) != len(x):
        raise SchemaError(f"{path}: 'y' must have shape ({len(x)},), got {y.shape}")
    if np.issubdtype(y.dtype, np.integer):
        bad = (y < 0) | (y >= len(classes))
        if bad.any():
            row = int(np.argmax(bad))
            raise SchemaError(
                f"{path}: row {row}: label {int(y[row])} is not a class index (0 to "
                f"{len(classes) - 1})"
            )
        labels = y.astype(np.int64)
    else:
        labels = class_indices(y, classes, str(path))
    if not np.issubdtype(x.dtype, np.number):
        raise SchemaError(f"{path}: 'x' must be numbers, got {x.dtype}")
    if schema is not None:
        checked = schema.check(x, str(path))
    else:
        checked = x.astype(np.float32)
        if checked.shape[1:] != shape:
            raise SchemaError(f"{path}: 'x' must have shape (N, {shape}), got {checked.shape}")
        if not np.isfinite(checked).all():
            row = int(np.argmax(~np.isfinite(checked.reshape(len(x), -1)).all(axis=1)))
            raise SchemaError(f"{path}: record {row} has a NaN or infinite value")
    return Records(checked, labels, f"NPZ {path.name}")


def read_records(
    data: Path,
    schema: RecordSchema | None,
    shape: tuple[int, ...],
    classes: Sequence[str],
    *,
    label: str | None = None,
    labels_csv: Path | None = None,
    file_column: str = "file",
    label_column: str = "label",
) -> Records:
    """Whatever ``data`` is (see the module docstring), read and checked against the task.

    ``schema``: the task's records (None for a task that declares none: then
    images of ``shape`` in [0, 1] are assumed and tables cannot be read).
    ``label``: a table's label column (default: the schema's, else ``label``).
    """
    if not data.exists():
        raise SchemaError(f"{data}: no such file or folder")
    if schema is None and len(shape) == 3:
        schema = ImageSchema(*shape)
    suffix = data.suffix.lower()
    if suffix == ".npz":
        return read_npz(data, schema, shape, classes)
    if isinstance(schema, TableSchema):
        if data.is_dir() or suffix not in (".csv", ".parquet", ".pq"):
            raise SchemaError(f"{data}: a table task reads a .csv, .parquet or .npz file")
        return read_table(data, schema, classes, label or schema.label or "label")
    if not isinstance(schema, ImageSchema):
        raise SchemaError(
            "this task declares no records; add a 'records' object (capc task init) or use an NPZ"
        )
    if not data.is_dir():
        raise SchemaError(
            f"{data}: an image task reads a folder of class subfolders, a DICOM folder with "
            "--labels, or an .npz file"
        )
    if labels_csv is not None:
        return read_dicom_folder(data, labels_csv, schema, classes, file_column, label_column)
    return read_image_folder(data, schema, classes)


def read_flat_folder(folder: Path, schema: ImageSchema) -> FloatRecords:
    """Every PNG/JPEG in ``folder`` (flat) or in its subfolders, in name order, as
    (N, C, H, W) float32: unlabelled images, so a subfolder's name is not read as a class."""
    files = sorted(
        f for f in folder.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES
    )
    if not files:
        raise SchemaError(f"{folder}: no {'/'.join(IMAGE_SUFFIXES)} files")
    for f in files:
        inside(folder, f)
    return np.stack([read_image(f, schema) for f in files])


def read_unlabelled(
    data: Path, schema: RecordSchema | None, shape: tuple[int, ...]
) -> FloatRecords:
    """Records without labels, (N, *shape) float32 checked against the task: a folder of
    images (flat or in subfolders), a CSV/Parquet table (no label column needed) or an NPZ
    with ``x`` (a ``y`` there is ignored)."""
    if not data.exists():
        raise SchemaError(f"{data}: no such file or folder")
    if schema is None and len(shape) == 3:
        schema = ImageSchema(*shape)
    if data.suffix.lower() == ".npz":
        return _npz_x(data, schema, shape)
    if isinstance(schema, TableSchema):
        if data.is_dir() or data.suffix.lower() not in (".csv", ".parquet", ".pq"):
            raise SchemaError(f"{data}: a table task reads a .csv, .parquet or .npz file")
        frame = read_frame(data)
        return schema.check(schema.encode(frame, str(data), first_row(data)), str(data))
    if not isinstance(schema, ImageSchema):
        raise SchemaError(
            "this task declares no records; add a 'records' object (capc task init) or use an NPZ"
        )
    if not data.is_dir():
        raise SchemaError(f"{data}: an image task reads a folder of images or an .npz file")
    return read_flat_folder(data, schema)


def _npz_x(path: Path, schema: RecordSchema | None, shape: tuple[int, ...]) -> FloatRecords:
    """An NPZ's ``x`` checked against the task (see :func:`read_npz`)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if "x" not in data.files:
                raise SchemaError(f"{path}: missing array 'x' (the records)")
            x = np.asarray(data["x"])
    except (ValueError, OSError, EOFError) as err:
        raise SchemaError(f"{path}: not a readable NPZ ({err})") from None
    if not np.issubdtype(x.dtype, np.number):
        raise SchemaError(f"{path}: 'x' must be numbers, got {x.dtype}")
    if schema is not None:
        return schema.check(x, str(path))
    checked = x.astype(np.float32)
    if checked.shape[1:] != shape or not np.isfinite(checked).all():
        raise SchemaError(f"{path}: 'x' must be finite numbers of shape (N, {shape})")
    return checked
