"""A hospital's data files are untrusted input: a decompression bomb is refused, naming
it, before it is decoded; a labels CSV cannot name files outside --data; a symbolic link
is followed only to a file inside --data."""

from __future__ import annotations

import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from capc.data.readers import (
    MIN_PIXEL_LIMIT,
    pixel_limit,
    read_image,
    read_records,
    read_unlabelled,
)
from capc.data.schema import ImageSchema, SchemaError
from tests.hospital_files import DIGIT_CLASSES, write_dicom, write_dicom_set

IMAGES = ImageSchema(1, 28, 28)
CLASSES = ["cat", "dog"]


def png_bomb(path: Path, width: int, height: int) -> Path:
    """A 1-bit grey PNG of ``width`` x ``height`` black pixels, compressed as far as zlib
    goes: 12000 x 12000 (144 Mpx) is about 17 KiB."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    packer = zlib.compressobj(9)
    row = bytes((width + 7) // 8 + 1)  # filter byte 0, then the row's bits
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )
    return path


def png(path: Path, size: int = 28, seed: int = 0) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, "L").save(path)
    return path


def test_the_pixel_limit_comes_from_the_task() -> None:
    assert pixel_limit(IMAGES) == MIN_PIXEL_LIMIT
    big = ImageSchema(3, 1024, 1024)
    assert pixel_limit(big) == 64 * 1024 * 1024 > MIN_PIXEL_LIMIT


def test_a_decompression_bomb_is_refused_naming_it_before_it_is_decoded(
    tmp_path: Path,
) -> None:
    (tmp_path / "data" / "cat").mkdir(parents=True)
    bomb = png_bomb(tmp_path / "data" / "cat" / "scan-7.png", 12000, 12000)
    assert bomb.stat().st_size < 20 * 1024
    png(tmp_path / "data" / "dog" / "ok.png")
    tracemalloc.start()
    try:
        with pytest.raises(SchemaError, match=r"scan-7\.png: 12000 x 12000 pixels \(144\.0 Mpx\)"):
            read_records(tmp_path / "data", IMAGES, (1, 28, 28), CLASSES)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Refused from its header: decoding it took 278 MiB; nothing near that was allocated.
    assert peak < 16 << 20
    with pytest.raises(SchemaError, match="decompression bomb"):
        read_unlabelled(tmp_path / "data" / "cat", IMAGES, (1, 28, 28))


def test_pillows_own_bomb_error_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should Pillow's limit be the lower one, its DecompressionBombError is a refusal
    naming the file, not a traceback."""
    path = png(tmp_path / "big.png", size=100)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # Pillow refuses above twice this
    with pytest.raises(SchemaError, match=r"big\.png: refused as a decompression bomb"):
        read_image(path, IMAGES)


def test_a_dicom_declaring_too_many_pixels_is_refused(tmp_path: Path) -> None:
    """The size is read from the header, before the (maybe compressed) pixels."""
    import pydicom

    root, labels = write_dicom_set(tmp_path / "dicom", 2)
    name = pd.read_csv(labels).loc[0, "file"]
    ds = pydicom.dcmread(root / name)
    ds.Rows = ds.Columns = 6000
    ds.save_as(root / name)
    with pytest.raises(SchemaError, match=f"{name}: 6000 x 6000 pixels"):
        read_records(root, IMAGES, (1, 28, 28), DIGIT_CLASSES, labels_csv=labels)


@pytest.mark.parametrize("escape", ["../outside.dcm", "{abs}"])
def test_a_labels_csv_cannot_name_files_outside_the_data_folder(
    tmp_path: Path, escape: str
) -> None:
    root, labels = write_dicom_set(tmp_path / "dicom", 3)
    outside = tmp_path / "outside.dcm"
    write_dicom(outside, np.full((8, 8), 0.5, np.float32))
    name = escape.format(abs=outside)
    table = pd.read_csv(labels)
    table.loc[1, "file"] = name
    table.drop(index=[0]).to_csv(labels, index=False)
    for f in root.glob("*.dcm"):  # keep only the files the CSV still lists
        if f.name not in set(table["file"]):
            f.unlink()
    with pytest.raises(SchemaError, match=r"labels\.csv: row 2: file .*outside\.dcm.* inside"):
        read_records(root, IMAGES, (1, 28, 28), DIGIT_CLASSES, labels_csv=labels)


def test_a_link_out_of_the_data_folder_is_refused_and_one_inside_followed(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    png(data / "cat" / "a.png", seed=1)
    png(data / "dog" / "b.png", seed=2)
    secret = png(tmp_path / "elsewhere" / "patient.png", seed=3)
    # Inside: a link to another image of the folder is read as that image.
    (data / "dog" / "same-as-a.png").symlink_to(data / "cat" / "a.png")
    records = read_records(data, IMAGES, (1, 28, 28), CLASSES)
    assert len(records) == 3
    np.testing.assert_array_equal(records.x[0], records.x[2])
    # Outside: a file link and a class-folder link are both refused, naming them.
    (data / "cat" / "leak.png").symlink_to(secret)
    with pytest.raises(SchemaError, match=r"cat/leak\.png: the file lies outside"):
        read_records(data, IMAGES, (1, 28, 28), CLASSES)
    with pytest.raises(SchemaError, match=r"leak\.png: the file lies outside"):
        read_unlabelled(data, IMAGES, (1, 28, 28))
    (data / "cat" / "leak.png").unlink()
    (data / "dog").rename(tmp_path / "dog-elsewhere")
    (data / "dog").symlink_to(tmp_path / "dog-elsewhere")
    with pytest.raises(SchemaError, match=r"data/dog: the class folder lies outside"):
        read_records(data, IMAGES, (1, 28, 28), CLASSES)
