"""Uploaded unlabelled datasets: an .npy array or an .npz holding ``x``, (N, C, H, W)
images or (N, F) table rows (the student party checks them against its task).

An upload is sized before anything is inflated: the request body limit bounds only the
compressed bytes, and deflate turns 255 KiB into 263 MB. So the zip's end record bounds
its directory before the directory is parsed; each member's .npy header is read alone
and checked against the byte budget, and its directory size must be that header plus
the data it declares; the chosen array is then inflated, by bounded reads, into a buffer
of exactly that size. Nothing is unpickled (a file cannot run code). A refusal is a
:class:`DatasetError` (or :class:`DatasetTooLargeError`, 413) that says what to send.
"""

from __future__ import annotations

import io
import math
import tokenize
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
from numpy.lib import format as npy_format
from numpy.typing import NDArray

from services.common.limits import MAX_TENSOR_BYTES, MAX_UPLOAD_MEMBERS

EXPECTED = (
    "an .npy array or an .npz with array 'x', shaped (N, channels, height, width) for an "
    "image task or (N, features) for a table task"
)
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
#: Longest .npy header read; numpy's own reader refuses longer ones by default.
MAX_HEADER_BYTES = 10_000
#: Directory bytes one member may take: 46 fixed, its name, a zip64 extra field. A
#: bound from MAX_UPLOAD_MEMBERS, so zipfile never builds more entries than that.
_DIRECTORY_BYTES = MAX_UPLOAD_MEMBERS * 1024
#: Inflated bytes per read: deflate output is bounded by what is asked for.
_CHUNK = 2**20
#: Deflate bounds its output per read; bzip2 and LZMA in zipfile inflate a whole
#: compressed chunk at once, so one 4 KiB read of either can become gigabytes.
_METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})
_METHOD_NAMES = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "LZMA"}
# zipfile's own end-record reader: the directory size it returns is the one ZipFile
# then reads, so the bound below holds for exactly what ZipFile would parse.
_end_record: Callable[[IO[bytes]], list[Any] | None] = getattr(zipfile, "_EndRecData")  # noqa: B009
_ECD_SIZE = 5
#: What zipfile raises on a damaged archive: offsets before the start seek to a
#: negative position (ValueError), names fail to decode, versions it does not know.
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    NotImplementedError,
    RuntimeError,
    ValueError,
    EOFError,
    OSError,
    zlib.error,
)


class DatasetError(ValueError):
    """An upload is not a usable dataset; the message says why and what to send."""


class DatasetTooLargeError(DatasetError):
    """An upload declares more data than one job carries (HTTP 413)."""


def _no_reservation(_: int) -> None:
    return None


def parse_dataset(
    data: bytes,
    max_bytes: int = MAX_TENSOR_BYTES,
    reserve: Callable[[int], None] = _no_reservation,
) -> NDArray[np.float32]:
    """The queries of an upload as float32 (N, C, H, W) or (N, F); raises DatasetError.

    ``max_bytes`` bounds the queries both as stored and as float32: it is checked
    from the headers before a byte is inflated. ``reserve(n)`` is called with the
    chosen array's size as float32 (bytes) once its header is checked and before it
    is inflated or copied; it may raise to stop the parse (a shared memory budget)."""
    if not data:
        raise DatasetError(f"the upload is empty; send {EXPECTED}")
    if data.startswith(NPY_MAGIC):
        arr = _read_npy(data, max_bytes, reserve)
    elif data.startswith(ZIP_MAGICS):
        arr = _read_npz(data, max_bytes, reserve)
    else:
        raise DatasetError(
            f"could not read the upload: it starts with neither the .npy nor the .npz "
            f"signature; send {EXPECTED}"
        )
    with np.errstate(over="ignore"):  # past float32's range becomes inf, refused below
        x = arr.astype(np.float32, copy=False)
    if arr.dtype.kind == "f" and not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).reshape(len(x), -1).any(axis=1).sum())
        raise DatasetError(
            f"{bad} queries contain NaN or infinity (or values past float32's range); "
            "clean them and upload again"
        )
    return x


def _header(f: IO[bytes], what: str) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """Shape, Fortran order and dtype from an .npy header (only the header is read)."""
    readers = {
        (1, 0): npy_format.read_array_header_1_0,
        (2, 0): npy_format.read_array_header_2_0,
    }
    try:
        version = npy_format.read_magic(f)
        reader = readers.get(version)
        if reader is not None:
            shape, fortran, dtype = reader(f, MAX_HEADER_BYTES)
    except (ValueError, SyntaxError, tokenize.TokenError, EOFError, OSError, zlib.error) as err:
        raise DatasetError(
            f"could not read the upload: {what} has no valid .npy header ({err}); send {EXPECTED}"
        ) from None
    if reader is None:
        raise DatasetError(
            f"{what} is .npy format {version[0]}.{version[1]}; save it with numpy.save "
            "(format 1.0 or 2.0)"
        )
    return tuple(int(n) for n in shape), bool(fortran), np.dtype(dtype)


def _checked(shape: tuple[int, ...], dtype: np.dtype[Any], max_bytes: int, what: str) -> int:
    """The element count of a header that describes acceptable queries; raises otherwise."""
    if dtype.hasobject:
        raise DatasetError(
            f"{what} holds object arrays (pickles), which the gateway never loads; "
            "save the queries as numbers"
        )
    if dtype.kind not in "fiu":
        raise DatasetError(f"queries must be numbers, got dtype {dtype} in {what}")
    count = math.prod(shape)
    as_float32 = count * np.dtype(np.float32).itemsize
    if as_float32 > max_bytes:
        raise DatasetTooLargeError(
            f"the upload is {as_float32} bytes as float32 queries, over the {max_bytes} "
            f"one job can carry ({what} declares shape {shape} of {dtype}); split it into "
            "several jobs"
        )
    stored = count * dtype.itemsize
    if stored > max_bytes:
        raise DatasetTooLargeError(
            f"{what} declares {stored} bytes of {dtype}, over the {max_bytes} one job can "
            "carry; split it into several jobs"
        )
    return count


def _queries_shape(shape: tuple[int, ...]) -> None:
    if len(shape) not in (2, 4) or shape[0] == 0:
        raise DatasetError(f"got an array of shape {shape}; send {EXPECTED}")


def _shaped(flat: NDArray[Any], shape: tuple[int, ...], fortran: bool) -> NDArray[Any]:
    return flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)


def _read_npy(data: bytes, max_bytes: int, reserve: Callable[[int], None]) -> NDArray[Any]:
    stream = io.BytesIO(data)
    shape, fortran, dtype = _header(stream, "the .npy")
    count = _checked(shape, dtype, max_bytes, "the .npy")
    _queries_shape(shape)
    body = memoryview(data)[stream.tell() :]
    declared = count * dtype.itemsize
    if len(body) < declared:
        raise DatasetError(
            f"the .npy holds fewer bytes than its header declares ({len(body)} of "
            f"{declared}); the file is truncated: save it again with numpy.save"
        )
    if len(body) > declared:
        raise DatasetError(
            f"the .npy holds more data than its header declares ({len(body)} bytes, not "
            f"{declared}); save it again with numpy.save"
        )
    reserve(count * np.dtype(np.float32).itemsize)
    return _shaped(np.frombuffer(body, dtype=dtype, count=count), shape, fortran)


@dataclass(frozen=True)
class _Member:
    """An .npz member as its directory entry and .npy header describe it."""

    info: zipfile.ZipInfo
    shape: tuple[int, ...]
    fortran: bool
    dtype: np.dtype[Any]
    count: int


def _read_npz(data: bytes, max_bytes: int, reserve: Callable[[int], None]) -> NDArray[Any]:
    stream = io.BytesIO(data)
    try:
        end = _end_record(stream)
    except _ZIP_ERRORS:
        end = None
    if end is None:
        raise DatasetError(
            f"could not read the upload: the .npz has no zip end record; send {EXPECTED}"
        )
    if end[_ECD_SIZE] > _DIRECTORY_BYTES:
        raise DatasetError(
            f"the .npz directory takes {end[_ECD_SIZE]} bytes, room for far more than the "
            f"at most {MAX_UPLOAD_MEMBERS} arrays an upload may hold; save only the queries "
            "as 'x' with numpy.savez"
        )
    try:
        archive = zipfile.ZipFile(stream)
    except _ZIP_ERRORS as err:
        raise DatasetError(f"could not read the upload ({err}); send {EXPECTED}") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_UPLOAD_MEMBERS:
            raise DatasetError(
                f"the .npz holds {len(infos)} arrays; an upload holds at most "
                f"{MAX_UPLOAD_MEMBERS}: save only the queries as 'x' with numpy.savez"
            )
        headers: dict[str, _Member] = {}
        for info in infos:
            name = info.filename.removesuffix(".npy")
            if name in headers:
                raise DatasetError(f"the .npz holds two arrays named {name!r}; keep one")
            what = f"{info.filename} in the .npz"
            _member_readable(info, what)
            try:
                with archive.open(info) as f:
                    shape, fortran, dtype = _header(f, what)
                    header_bytes = f.tell()
            except DatasetError:
                raise
            except _ZIP_ERRORS as err:
                raise DatasetError(f"could not read {what}: {err}") from None
            count = _checked(shape, dtype, max_bytes, what)
            _sizes_agree(info, header_bytes, count * dtype.itemsize, what)
            headers[name] = _Member(info, shape, fortran, dtype, count)
        names = list(headers)
        key = "x" if "x" in headers else names[0] if len(names) == 1 else None
        if key is None:
            raise DatasetError(f"the .npz holds {names}; name the queries array 'x' ({EXPECTED})")
        chosen = headers[key]
        _queries_shape(chosen.shape)
        reserve(chosen.count * np.dtype(np.float32).itemsize)
        flat = _inflate(archive, chosen.info, chosen.dtype, chosen.count)
        return _shaped(flat, chosen.shape, chosen.fortran)


def _member_readable(info: zipfile.ZipInfo, what: str) -> None:
    """Refuse a member that is encrypted or compressed other than by deflate, unread."""
    if info.flag_bits & 0x1:
        raise DatasetError(f"{what} is encrypted; upload it unencrypted")
    if info.compress_type not in _METHODS:
        method = _METHOD_NAMES.get(info.compress_type, f"method {info.compress_type}")
        raise DatasetError(
            f"{what} is compressed with {method}; save it with numpy.savez or "
            "numpy.savez_compressed (stored or deflate)"
        )


def _sizes_agree(info: zipfile.ZipInfo, header_bytes: int, declared: int, what: str) -> None:
    """The directory's inflated size must be the header plus the data it declares: a
    member that claims more is refused before it is inflated."""
    data_bytes = info.file_size - header_bytes
    if data_bytes > declared:
        raise DatasetError(
            f"{what} holds more data than its header declares ({data_bytes} bytes, not "
            f"{declared}); save it again with numpy.savez"
        )
    if data_bytes < declared:
        raise DatasetError(
            f"{what} holds fewer bytes than its header declares ({data_bytes} of "
            f"{declared}); the file is truncated: save it again"
        )


def _inflate(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, dtype: np.dtype[Any], count: int
) -> NDArray[Any]:
    """A member's array, inflated into a buffer of the size its header declares; a member
    that holds more or fewer bytes is refused, so a lying header cannot grow it."""
    what = f"{info.filename} in the .npz"
    out = np.empty(count, dtype=dtype)
    view = out.view(np.uint8)
    try:
        with archive.open(info) as f:
            _header(f, what)
            done = 0
            while done < len(view):
                chunk = f.read(min(_CHUNK, len(view) - done))
                if not chunk:
                    raise DatasetError(
                        f"{what} holds fewer bytes than its header declares ({done} of "
                        f"{len(view)}); the file is truncated: save it again"
                    )
                view[done : done + len(chunk)] = np.frombuffer(chunk, np.uint8)
                done += len(chunk)
            if f.read(1):
                raise DatasetError(
                    f"{what} holds more data than its header declares ({len(view)} bytes); "
                    "save it again with numpy.savez"
                )
    except DatasetError:
        raise
    except _ZIP_ERRORS as err:
        raise DatasetError(f"could not read {what}: {err}") from None
    return out
