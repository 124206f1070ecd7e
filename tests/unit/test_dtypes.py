import numpy as np
import pytest

from mcpapi.v2 import tensor_pb2
from mcpcore import dtypes
from mcpcore.errors import InvalidArgument


@pytest.mark.parametrize("name", sorted(dtypes.NAMES - {"BF16"}))
def test_names_numpy_and_wire_agree(name):
    dt = dtypes.numpy_dtype(name)
    assert dt.itemsize == dtypes.ITEMSIZE[name]
    assert dtypes.from_numpy(dt) == name
    assert tensor_pb2.DataType.Name(dtypes.wire_value(name)) == f"TYPE_{name}"
    assert dtypes.name_of(dtypes.wire_value(name)) == name


def test_every_wire_type_has_a_name():
    for value in tensor_pb2.DataType.values():
        if value != tensor_pb2.TYPE_INVALID:
            assert dtypes.name_of(value) in dtypes.NAMES


def test_bf16_has_no_numpy_dtype():
    assert dtypes.ITEMSIZE["BF16"] == 2
    with pytest.raises(InvalidArgument, match="BF16 has no numpy equivalent"):
        dtypes.numpy_dtype("BF16")


@pytest.mark.parametrize("bad", [np.complex64, np.dtype(">f4"), np.dtype("U4")])
def test_numpy_types_without_a_tensor_type(bad):
    with pytest.raises(InvalidArgument, match="has no tensor type"):
        dtypes.from_numpy(bad)


def test_unknown_names():
    with pytest.raises(InvalidArgument, match="unknown data type 'FP8'"):
        dtypes.numpy_dtype("FP8")
    with pytest.raises(InvalidArgument, match="unknown wire data type 0"):
        dtypes.name_of(0)
