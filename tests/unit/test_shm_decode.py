"""System shared memory as the KServe adapter uses it, over a real mapping of a file (``SharedMemory``
pointed at a temporary directory instead of /dev/shm): raw and shared-memory inputs mixed in one
request, hostile keys and shapes, and an empty output written into a region."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mcp_router.dataplane import InferResult
from mcp_router.frontends.kserve_grpc_tensors import decode_inputs, encode_response
from mcp_router.frontends.shm_regions import SharedMemory
from mcpapi.kserve import grpc_service_pb2 as pb
from mcpcore.errors import InvalidArgument

A = np.arange(8, dtype=np.float32)


@pytest.fixture
def shm(tmp_path):
    (tmp_path / "obj").write_bytes(A.tobytes() + bytes(64))
    registry = SharedMemory(directory=tmp_path)
    registry.register("r", "/obj", 0, A.nbytes + 64)
    yield registry
    registry.close()


def _request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    a = request.inputs.add(name="A", datatype="FP32", shape=[8])
    a.parameters["shared_memory_region"].string_param = "r"
    a.parameters["shared_memory_byte_size"].int64_param = A.nbytes
    request.inputs.add(name="B", datatype="INT64", shape=[2])
    request.raw_input_contents.append(np.array([3, 4], dtype="<i8").tobytes())  # B's: A is in the region
    return request


def test_raw_entries_belong_to_the_inputs_not_in_shared_memory(shm):
    arrays = decode_inputs(_request(), shm)
    np.testing.assert_array_equal(arrays["A"], A)
    np.testing.assert_array_equal(arrays["B"], [3, 4])
    assert not arrays["A"].flags.writeable  # a view of the client's memory, never written by us


def test_one_raw_entry_too_many_is_refused(shm):
    request = _request()
    request.raw_input_contents.append(b"")
    with pytest.raises(InvalidArgument, match="2 entries but the request has 1 inputs not in shared memory"):
        decode_inputs(request, shm)


@pytest.mark.parametrize(
    "shape", [[0, 2**62], [2**32, 2**32], [2**31, 1], [0, 2**31 - 1, 2**31 - 1], [0, 2**25]]
)
def test_a_shape_numpy_cannot_hold_is_invalid_not_internal(shm, shape):
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="A", datatype="FP32", shape=shape)
    request.raw_input_contents.append(b"")
    with pytest.raises(InvalidArgument, match=r"spans \d+ bytes; the router takes tensors of at most"):
        decode_inputs(request, shm, max_bytes=64 << 20)


def test_more_dimensions_than_numpy_takes_are_invalid_not_internal(shm):
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="A", datatype="FP32", shape=[1] * 65)
    request.raw_input_contents.append(b"\0" * 4)
    with pytest.raises(InvalidArgument, match="shape has 65 dimensions; at most 64"):
        decode_inputs(request, shm)
    del request.inputs[0].shape[64:]  # 64 of them: numpy's limit, taken
    assert decode_inputs(request, shm)["A"].shape == (1,) * 64


def test_keys_that_leave_the_directory_or_name_no_object_are_refused(tmp_path):
    outside = tmp_path.parent / f"outside-{os.getpid()}"
    outside.write_bytes(bytes(16))
    (tmp_path / "link").symlink_to(outside)
    (tmp_path / "dir").mkdir()
    registry = SharedMemory(directory=tmp_path)
    for key, words in (("/link", "cannot open"), ("/dir", "cannot open|not a shared memory object"),
                       ("/a/b", "not a POSIX shared memory name"), ("x", "not a POSIX")):  # fmt: skip
        with pytest.raises(InvalidArgument, match=words):
            registry.register("r", key, 0, 16)
    assert registry.status() == []
    outside.unlink()


def test_an_empty_output_goes_into_its_region(shm):
    result = InferResult("m", "1", "w", {"OUT": np.zeros((0, 4), np.float32)})
    response, raw = encode_response(result, "id", ("OUT",), {"OUT": ("r", 32, 64)}, shm)
    assert [tuple(o.shape) for o in response.outputs] == [(0, 4)] and raw == [b""]
