"""Uploads are sized from their .npy headers and zip directory before anything is inflated.

The bombs here are real: parsed the way the gateway once did (``np.load`` then a float32
copy), the first one takes about 1.5 GiB. Peak memory is measured with tracemalloc,
which sees numpy's buffers and zlib's output.
"""

from __future__ import annotations

import io
import random
import struct
import tracemalloc
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from numpy.lib import format as npy_format

from services.common.limits import MAX_UPLOAD_MEMBERS
from services.gateway.app import create_app
from services.gateway.backends import Backends
from services.gateway.datasets import DatasetError, parse_dataset
from services.gateway.tokens import TokenStore

SHAPE = (1, 28, 28)
#: uint8 zeros under deflate: 263 MB of queries in about 255 KiB, 1 GiB as float32.
BOMB_QUERIES = 335_000
#: What parsing a refused upload may allocate at most (the upload itself aside).
SMALL = 4 * 2**20


def npy_header(shape: tuple[int, ...], dtype: np.dtype[np.generic]) -> bytes:
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(
        buf,
        {"descr": npy_format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape},
    )
    return buf.getvalue()


def member(
    z: zipfile.ZipFile, name: str, header: bytes, zero_bytes: int, chunk: int = 2**24
) -> None:
    """A member holding ``header`` then ``zero_bytes`` zeros, written without allocating them."""
    zeros = bytes(min(chunk, max(zero_bytes, 1)))
    with z.open(name, "w", force_zip64=True) as f:
        f.write(header)
        left = zero_bytes
        while left:
            n = min(left, len(zeros))
            f.write(zeros if n == len(zeros) else zeros[:n])
            left -= n


def npz(build: Callable[[zipfile.ZipFile], None], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=method, compresslevel=9) as z:
        build(z)
    return buf.getvalue()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    n = BOMB_QUERIES * int(np.prod(SHAPE))
    return npz(
        lambda z: member(z, "x.npy", npy_header((BOMB_QUERIES, *SHAPE), np.dtype(np.uint8)), n)
    )


def peak_while(fn: Callable[[], object]) -> tuple[object, int]:
    """What ``fn`` returns (or raises) and the peak bytes traced meanwhile."""
    tracemalloc.start()
    try:
        try:
            result: object = fn()
        except DatasetError as err:
            result = err
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    tokens = TokenStore(str(tmp_path / "t.db"))
    secret, _ = tokens.create("analyst", "uploader")
    backends = Backends("127.0.0.1:1", "127.0.0.1:1", None)
    with TestClient(create_app(backends, tokens)) as c:
        yield c, {"Authorization": f"Bearer {secret}"}
    backends.close()


def test_a_zip_bomb_is_refused_from_its_header_before_it_is_inflated(
    bomb: bytes, client: tuple[TestClient, dict[str, str]]
) -> None:
    assert len(bomb) < 256 * 1024  # 255 KiB on the wire
    c, auth = client
    files = {"file": ("bomb.npz", bomb)}
    response, peak = peak_while(lambda: c.post("/v1/jobs/upload", headers=auth, files=files))
    assert isinstance(response, httpx.Response), response
    r = response
    assert r.status_code == 413, r.text
    detail = r.json()["detail"]
    # 335,000 uint8 queries of 784 pixels are 1,050,560,000 bytes as float32.
    assert "1050560000 bytes as float32 queries" in detail and "split it" in detail
    assert peak < SMALL + 2 * len(bomb), f"refusing the bomb took {peak / 2**20:.0f} MiB"


def test_a_lying_header_cannot_inflate_past_what_it_declares() -> None:
    """The header declares one query; the member goes on for 256 MiB of zeros."""
    liar = npz(lambda z: member(z, "x.npy", npy_header((1, *SHAPE), np.dtype(np.float32)), 2**28))
    error, peak = peak_while(lambda: parse_dataset(liar))
    assert isinstance(error, DatasetError), error
    assert "more data than its header declares" in str(error)
    assert peak < SMALL, f"{peak / 2**20:.0f} MiB"


def test_a_lying_directory_cannot_inflate_past_what_it_declares() -> None:
    """The central directory says one query's bytes; the deflated stream holds 256 MiB.
    Reads stop at the directory's size, and the CRC then gives the lie away."""
    header = npy_header((1, *SHAPE), np.dtype(np.float32))
    data = bytearray(npz(lambda z: member(z, "x.npy", header, 2**28)))
    # The reader trusts the central directory's size field (4 bytes at +24 of the entry).
    entry = data.index(b"PK\x01\x02")
    assert struct.unpack_from("<I", data, entry + 24)[0] == len(header) + 2**28
    struct.pack_into("<I", data, entry + 24, len(header) + 4 * 784)
    error, peak = peak_while(lambda: parse_dataset(bytes(data)))
    assert isinstance(error, DatasetError), error
    assert "x" in str(error) and ("CRC" in str(error) or "more data" in str(error)), error
    assert peak < SMALL, f"{peak / 2**20:.0f} MiB"


def test_a_truncated_member_is_refused() -> None:
    header = npy_header((4, *SHAPE), np.dtype(np.float32))
    short = npz(lambda z: member(z, "x.npy", header, 4 * 784 * 3))
    with pytest.raises(DatasetError, match="fewer bytes than its header declares"):
        parse_dataset(short)
    with pytest.raises(DatasetError, match="fewer bytes than its header declares"):
        parse_dataset(header + bytes(4 * 784 * 3))
    with pytest.raises(DatasetError, match="more data than its header declares"):
        parse_dataset(header + bytes(4 * 784 * 5))


def test_every_member_is_sized_not_only_x() -> None:
    """A small x beside a y whose header declares 2 GiB: refused from that header alone
    (its data is not even there), although x is fine."""

    def build(z: zipfile.ZipFile) -> None:
        member(z, "x.npy", npy_header((2, *SHAPE), np.dtype(np.float32)), 2 * 4 * 784)
        member(z, "y.npy", npy_header((2**28,), np.dtype(np.float64)), 64)

    data = npz(build)
    error, peak = peak_while(lambda: parse_dataset(data))
    assert isinstance(error, DatasetError) and "y.npy" in str(error), error
    assert "1073741824 bytes as float32" in str(error), error
    assert peak < SMALL, f"{peak / 2**20:.0f} MiB"


def test_more_members_than_allowed_are_refused_before_the_directory_is_parsed() -> None:
    many = 20_000
    x = np.zeros((2, *SHAPE), np.float32)

    def build(z: zipfile.ZipFile) -> None:
        buf = io.BytesIO()
        np.save(buf, x)
        z.writestr("x.npy", buf.getvalue())
        for i in range(many):
            z.writestr(f"{i}.npy", b"")

    data = npz(build, zipfile.ZIP_STORED)
    error, peak = peak_while(lambda: parse_dataset(data))
    assert isinstance(error, DatasetError), error
    assert f"at most {MAX_UPLOAD_MEMBERS}" in str(error), error
    # 20,000 parsed directory entries would take several MiB.
    assert peak < 2**20, f"{peak / 2**20:.1f} MiB"


def test_pickles_other_compressions_and_encryption_are_refused_unread() -> None:
    obj = npy_format.header_data_from_array_1_0(np.array([None, 1], dtype=object))
    pickled = io.BytesIO()
    npy_format.write_array_header_1_0(pickled, obj)
    pickled.write(b"\x80\x04N.")  # a pickle: never unpickled
    for data in (
        pickled.getvalue(),
        npz(lambda z: z.writestr("x.npy", pickled.getvalue())),
    ):
        with pytest.raises(DatasetError, match="object arrays"):
            parse_dataset(data)
    x = io.BytesIO()
    np.save(x, np.zeros((2, *SHAPE), np.float32))
    bz = npz(lambda z: z.writestr("x.npy", x.getvalue()), zipfile.ZIP_BZIP2)
    with pytest.raises(DatasetError, match="compressed with bzip2"):
        parse_dataset(bz)
    locked = bytearray(npz(lambda z: z.writestr("x.npy", x.getvalue())))
    for sig in (b"PK\x03\x04", b"PK\x01\x02"):  # the encrypted flag in both headers
        at = locked.index(sig) + (6 if sig == b"PK\x03\x04" else 8)
        locked[at] |= 1
    with pytest.raises(DatasetError, match="encrypted"):
        parse_dataset(bytes(locked))


def test_good_uploads_still_parse() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((5, *SHAPE))
    for save in (np.savez, np.savez_compressed):
        buf = io.BytesIO()
        save(buf, x=x, y=np.arange(5))
        np.testing.assert_array_equal(parse_dataset(buf.getvalue()), x.astype(np.float32))
    fortran = io.BytesIO()
    np.save(fortran, np.asfortranarray(x))
    np.testing.assert_array_equal(parse_dataset(fortran.getvalue()), x.astype(np.float32))
    big_endian = io.BytesIO()
    counts = (x * 1000).astype(">i2")
    np.save(big_endian, counts)
    np.testing.assert_array_equal(parse_dataset(big_endian.getvalue()), counts.astype(np.float32))
    single = io.BytesIO()
    np.savez(single, queries=x)
    assert parse_dataset(single.getvalue()).shape == x.shape


def test_mangled_uploads_only_ever_raise_dataset_errors() -> None:
    """Flipped, cut and spliced bytes of good uploads: each is parsed or refused with a
    DatasetError (a 4xx), never another exception (a 500). Zip offsets that point before
    the start, undecodable names and unknown zip versions once escaped as ValueError,
    UnicodeDecodeError, NotImplementedError and tokenize.TokenError."""
    rng = random.Random(7)
    goods = []
    for save in (np.save, np.savez, np.savez_compressed):
        buf = io.BytesIO()
        save(buf, np.random.default_rng(1).random((3, 1, 4, 4)))
        goods.append(buf.getvalue())
    escaped: dict[str, bytes] = {}
    for _ in range(3000):
        data = bytearray(rng.choice(goods))
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(data))
            op = rng.random()
            if op < 0.6:
                data[at] = rng.randrange(256)
            elif op < 0.8:
                del data[at : at + rng.randint(1, 20)]
            else:
                data[at:at] = rng.randbytes(rng.randint(1, 10))
        try:
            parse_dataset(bytes(data))
        except DatasetError:
            pass
        except Exception as err:  # what this test looks for
            escaped.setdefault(type(err).__name__, bytes(data))
    assert not escaped, sorted(escaped)
