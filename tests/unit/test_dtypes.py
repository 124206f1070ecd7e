import numpy as np
import pytest

from mcpapi.v2 import tensor_pb2
from mcpcore import dtypes
from mcpcore.errors import Internal, InvalidArgument


@pytest.mark.parametrize("name", sorted(dtypes.NAMES))
def test_names_numpy_and_wire_agree(name):
    dt = dtypes.numpy_dtype(name)
    assert dtypes.from_numpy(dt) == name
    assert tensor_pb2.DataType.Name(dtypes.wire_value(name)) == f"TYPE_{name}"
    assert dtypes.name_of(dtypes.wire_value(name)) == name


def test_every_wire_type_has_a_name():
    for value in tensor_pb2.DataType.values():
        if value != tensor_pb2.TYPE_INVALID:
            assert dtypes.name_of(value) in dtypes.NAMES


def test_bf16_is_the_upper_half_of_fp32():
    x = np.array([1.0, -2.5, 3.140625], np.float32)
    b = x.astype(dtypes.numpy_dtype("BF16"))
    raw = bytes(dtypes.to_bytes(b))
    assert raw == (x.view(np.uint32) >> 16).astype("<u2").tobytes()
    back = dtypes.from_bytes("BF16", raw, (3,), "t")
    assert back.dtype == b.dtype and np.array_equal(back.astype(np.float32), x)


def test_bytes_are_length_prefixed_both_ways():
    x = np.array([[b"ab", b""], ["h\u00e9", b"\x00\xff"]], dtype=object)
    raw = bytes(dtypes.to_bytes(x))
    lengths = [b"\x02\x00\x00\x00", b"\x00" * 4, b"\x03\x00\x00\x00", b"\x02\x00\x00\x00"]
    assert raw == lengths[0] + b"ab" + lengths[1] + lengths[2] + b"h\xc3\xa9" + lengths[3] + b"\x00\xff"
    back = dtypes.from_bytes("BYTES", raw, (2, 2), "t")
    assert back.shape == (2, 2) and back.tolist() == [[b"ab", b""], [b"h\xc3\xa9", b"\x00\xff"]]
    assert dtypes.from_numpy(np.array([b"abc"]).dtype) == "BYTES"  # numpy's fixed-width bytes too
    assert bytes(dtypes.to_bytes(np.array([b"abc"]))) == b"\x03\x00\x00\x00abc"


@pytest.mark.parametrize(
    ("raw", "shape", "words"),
    [
        (b"\x02\x00\x00\x00ab\x00\x00", (2,), "ends after 1 of 2 elements"),
        (b"\x05\x00\x00\x00ab", (1,), "says 5 bytes but only 2 remain"),
        (b"\x01\x00\x00\x00ab", (1,), "1 bytes left over"),
        (b"\x01\x00", (1,), "1 BYTES elements cannot fit in 2 bytes"),
        (b"", (100_000_000,), "100000000 BYTES elements cannot fit in 0 bytes"),  # refused before allocating
    ],
)
def test_malformed_bytes_are_refused_naming_the_fault(raw, shape, words):
    with pytest.raises(InvalidArgument, match=words):
        dtypes.from_bytes("BYTES", raw, shape, "input TEXT")


def test_a_bytes_element_of_another_type_is_an_internal_error():  # only a backend can make one
    with pytest.raises(Internal, match="is int, not bytes or str"):
        dtypes.to_bytes(np.array([1, b"x"], dtype=object))


def test_numeric_bytes_must_fill_the_shape():
    with pytest.raises(InvalidArgument, match="7 bytes, but shape \\[2\\] of FP32 needs 8"):
        dtypes.from_bytes("FP32", b"\x00" * 7, (2,), "input X")


@pytest.mark.parametrize("bad", [np.complex64, np.dtype(">f4"), np.dtype("U4")])
def test_numpy_types_without_a_tensor_type(bad):
    with pytest.raises(InvalidArgument, match="has no tensor type"):
        dtypes.from_numpy(bad)


def test_unknown_names():
    with pytest.raises(InvalidArgument, match="unknown data type 'FP8'"):
        dtypes.numpy_dtype("FP8")
    with pytest.raises(InvalidArgument, match="unknown wire data type 0"):
        dtypes.name_of(0)
