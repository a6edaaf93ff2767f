"""Wire arrays: the bytes stay those the services always sent, and what arrives malformed is
refused with a RequestError that says what was wrong, before anything is read."""

from __future__ import annotations

import numpy as np
import pytest

from services.common import serde
from services.common.limits import MAX_BATCH
from services.common.protocol import RequestError
from services.proto.capc.v1 import common_pb2, guardian_pb2

SHAPE = (1, 2, 2)


def queries(n: int = 3) -> np.ndarray:
    return np.arange(n * 4, dtype=np.float32).reshape(n, *SHAPE) / 7


def tensor(
    shape: list[int], dtype: str = "float32", data: bytes | None = None
) -> common_pb2.Tensor:
    size = int(np.prod(shape)) * (8 if dtype in ("float64", "int64") else 4)
    return common_pb2.Tensor(shape=shape, dtype=dtype, data=bytes(size) if data is None else data)


# -- the wire format ----------------------------------------------------------------
def test_query_tensors_keep_the_wire_format_and_round_trip() -> None:
    x = queries()
    t = serde.queries_to_proto(x)
    # The bytes every site wrote by hand before: C-order little-endian float32.
    assert (list(t.shape), t.dtype, t.data) == ([3, *SHAPE], "float32", x.astype("<f4").tobytes())
    assert serde.queries_to_proto(np.array([[1.0]])).data == b"\x00\x00\x80\x3f"
    np.testing.assert_array_equal(serde.queries_from_proto(t, SHAPE, MAX_BATCH), x)
    # Other dtypes and layouts are converted, never reinterpreted.
    wide = np.asfortranarray(x.astype(np.float64))
    assert serde.queries_to_proto(wide).data == t.data


def test_label_tensors_round_trip_as_int64() -> None:
    y = np.array([[2, -1], [0, 1]], dtype=np.int32)
    t = serde.labels_to_proto(y)
    assert (list(t.shape), t.dtype, t.data) == ([2, 2], "int64", y.astype("<i8").tobytes())
    out = serde.labels_from_proto(t)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, y)


def test_shares_keep_the_wire_format_and_round_trip() -> None:
    share = np.array([[1, 2**64 - 1], [0, 2**63]], dtype=np.uint64)
    msg = serde.shares_to_proto(7, share, sealed_seed=b"seed")
    assert msg.guardian_share[:16] == b"\x01" + bytes(7) + b"\xff" * 8
    assert (msg.round_id, list(msg.shape), msg.sealed_seed, msg.batch_hash) == (
        7,
        [2, 2],
        b"seed",
        b"",
    )
    # An unset field and an empty one are the same bytes on the wire.
    plain = guardian_pb2.Shares(round_id=7, shape=[2, 2], guardian_share=msg.guardian_share)
    assert serde.shares_to_proto(7, share).SerializeToString() == plain.SerializeToString()
    out = serde.shares_from_proto(msg, (2, 2))
    np.testing.assert_array_equal(out, share)
    assert out.dtype == np.uint64 and out.flags.writeable


@pytest.mark.parametrize("n", [1, 3, 8, 9, 64, 4097])
def test_participation_masks_round_trip(n: int) -> None:
    mask = np.random.default_rng(n).random(n) < 0.5
    data = serde.participation_to_bytes(mask)
    assert data == np.packbits(mask, bitorder="little").tobytes() and len(data) == (n + 7) // 8
    out = serde.participation_from_bytes(data, n)
    assert out is not None
    np.testing.assert_array_equal(out, mask)


def test_no_mask_is_empty_bytes_and_means_every_query() -> None:
    assert serde.participation_to_bytes(None) == b""
    assert serde.participation_from_bytes(b"", 5) is None
    assert serde.participation_to_bytes(np.array([True, False, True])) == b"\x05"


# -- what arrives malformed ---------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "int64", "", "FLOAT32", "<f4"])
def test_queries_of_another_dtype_are_refused(dtype: str) -> None:
    with pytest.raises(RequestError, match=f"queries must be float32, got '{dtype}'"):
        serde.queries_from_proto(tensor([2, *SHAPE], dtype), SHAPE, MAX_BATCH)


@pytest.mark.parametrize(
    "shape",
    [[2, 2, 2], [2, 1, 2, 2, 1], [2, 4], [2, 1, 4, 1], [], [1, 2, 2]],
)
def test_queries_of_another_shape_are_refused(shape: list[int]) -> None:
    with pytest.raises(RequestError, match=r"must have shape \(N, 1, 2, 2\)"):
        serde.queries_from_proto(tensor(shape), SHAPE, MAX_BATCH)


@pytest.mark.parametrize("cut", [-1, 1, 4, 16])
def test_bytes_that_do_not_match_the_shape_are_refused(cut: int) -> None:
    data = queries(2).tobytes()
    data = data[:-cut] if cut > 0 else data + b"\x00"
    with pytest.raises(RequestError, match=f"must be 32 bytes .* got {len(data)}"):
        serde.queries_from_proto(tensor([2, *SHAPE], data=data), SHAPE, MAX_BATCH)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_queries_are_refused_and_counted(bad: float) -> None:
    # The guardian and the student party refused them before, and the answering party
    # (Teacher.predict); the refusal now says how many.
    x = queries(4)
    x[1, 0, 0, 0] = bad
    x[3, 0, 1, 1] = bad
    with pytest.raises(RequestError, match="2 queries contain NaN or infinity"):
        serde.queries_from_proto(serde.queries_to_proto(x), SHAPE, MAX_BATCH)


def test_oversized_and_empty_batches_are_refused_before_their_data_is_read() -> None:
    over = serde.queries_to_proto(np.zeros((MAX_BATCH + 1, *SHAPE), np.float32))
    with pytest.raises(RequestError, match=f"a batch holds at most {MAX_BATCH} queries, got"):
        serde.queries_from_proto(over, SHAPE, MAX_BATCH)
    # A declared count far past the limit, with no data behind it: the count is refused first.
    forged = tensor([2**31, *SHAPE], data=b"")
    with pytest.raises(RequestError, match=f"a job holds at most 10 queries, got {2**31}"):
        serde.queries_from_proto(forged, SHAPE, 10, "a job")
    with pytest.raises(RequestError, match="at least 1 query, got 0"):
        serde.queries_from_proto(tensor([0, *SHAPE]), SHAPE, MAX_BATCH)
    exact = serde.queries_to_proto(np.zeros((MAX_BATCH, *SHAPE), np.float32))
    assert len(serde.queries_from_proto(exact, SHAPE, MAX_BATCH)) == MAX_BATCH


def test_a_shape_whose_size_overflows_int64_is_refused_not_wrapped() -> None:
    # 2**32 * 2**32 elements wrap to 0 in int64; the byte count must not.
    t = tensor([2**32 - 1, 2**32 - 1, 2], "int64", data=b"")
    with pytest.raises(RequestError, match="bytes"):
        serde.labels_from_proto(t)


def test_generic_tensors_check_dtype_and_length_but_not_values() -> None:
    with pytest.raises(RequestError, match="labels must be int64, got 'float32'"):
        serde.labels_from_proto(serde.queries_to_proto(queries()))
    with pytest.raises(RequestError, match="labels must be 16 bytes"):
        serde.labels_from_proto(tensor([2], "int64", data=bytes(12)))
    # The gateway reads results pages the student wrote: values are not judged there,
    # as they never were.
    nan = serde.queries_to_proto(np.full((1, 2), np.nan))
    assert np.isnan(serde.tensor_from_proto(nan, "float32", "queries")).all()


def test_malformed_shares_are_refused() -> None:
    share = np.zeros((4, 3), dtype=np.uint64)
    msg = serde.shares_to_proto(5, share, sealed_seed=b"s")
    with pytest.raises(
        RequestError, match=r"shares for round 5 must have shape \(4, 4\), got \(4, 3\)"
    ):
        serde.shares_from_proto(msg, (4, 4))
    msg.guardian_share = msg.guardian_share[:-8]
    with pytest.raises(RequestError, match=r"guardian share must be 96 bytes .* got 88"):
        serde.shares_from_proto(msg, (4, 3))
    with pytest.raises(RequestError, match="got 8"):
        serde.share_from_bytes(bytes(8), (0, 3))


@pytest.mark.parametrize(
    "share",
    [
        np.zeros((2, 3), dtype=np.int64),
        np.zeros((2, 3), dtype=np.float64),
        np.zeros(6, dtype=np.uint64),
    ],
)
def test_only_uint64_matrices_are_sent_as_shares(share: np.ndarray) -> None:
    # A signed share would be wrapped into other ring elements without a word.
    with pytest.raises(TypeError, match="uint64"):
        serde.share_to_bytes(share)


@pytest.mark.parametrize("data", [b"\x01", b"\x01\x00\x00", bytes(64)])
def test_participation_of_another_length_is_refused(data: bytes) -> None:
    with pytest.raises(RequestError, match=f"participation must carry 9 bits, got {8 * len(data)}"):
        serde.participation_from_bytes(data, 9)


@pytest.mark.parametrize("body", ["[" * 100_000, '{"a":' * 100_000, "NaN", "[]", "{"])
def test_a_task_definition_that_is_no_configuration_is_refused_not_raised(body: str) -> None:
    """A hospital drops a definition that does not check (its rounds are then refused):
    however it is malformed, even nested past the parser's depth, it is a RequestError,
    never an exception that would end the party's stream."""
    header = common_pb2.Header(task="t", config_hash="0" * 64)
    with pytest.raises(RequestError, match="does not hash"):
        serde.task_definition_from_proto(guardian_pb2.TaskDefinition(config_json=body), header)


def test_a_recipe_nested_past_the_parsers_depth_is_a_bad_recipe_not_a_crash() -> None:
    """JSON nested past the parser's depth raises RecursionError, not ValueError: it is
    refused as a bad recipe like any other malformed parameters."""
    from services.common.serde.recipes import RecipeError, recipe_from_proto

    deep = "[" * 100_000 + "]" * 100_000
    msg = common_pb2.Recipe(generator="fractal", seed=1, count=2, shape=[1, 8, 8])
    msg.params_json = '{"a": ' + deep + "}"
    with pytest.raises(RecipeError, match="bad recipe"):
        recipe_from_proto(msg)
