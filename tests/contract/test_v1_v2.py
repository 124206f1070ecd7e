"""mcpapi v1 stays frozen, and v2 stays a superset of it.

The golden table below is the record of released v1 field numbers. Changing a row breaks every deployed
v1 client; a new v1 field (additive change) gets a new row in the same change.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor

import mcpapi
from mcpapi.v1 import control_pb2 as v1_control
from mcpapi.v1 import inference_pb2 as v1_inference
from mcpapi.v2 import control_pb2 as v2_control
from mcpapi.v2 import inference_pb2 as v2_inference
from mcpapi.v2 import model_pb2 as v2_model

PROTO_DIR = Path(__file__).resolve().parents[2] / "protos"

V1_MODULES = (v1_control, v1_inference)
V2_MODULES = (v2_control, v2_inference)

# (message, field, number, type): every field of every mcpapi.v1 message.
V1_FIELDS = {
    ("ReplicaStatus", "model", 1, "string"),
    ("ReplicaStatus", "version", 2, "string"),
    ("ReplicaStatus", "worker_id", 3, "string"),
    ("ReplicaStatus", "state", 4, "ModelState"),
    ("ReplicaStatus", "since_unix_ms", 5, "int64"),
    ("ReplicaStatus", "reason", 6, "string"),
    ("ModelStatus", "model", 1, "string"),
    ("ModelStatus", "state", 2, "ModelState"),
    ("ModelStatus", "replicas", 3, "repeated ReplicaStatus"),
    ("LoadModelRequest", "model", 1, "string"),
    ("LoadModelRequest", "version", 2, "string"),
    ("LoadModelRequest", "replicas", 3, "uint32"),
    ("LoadModelResponse", "status", 1, "ModelStatus"),
    ("UnloadModelRequest", "model", 1, "string"),
    ("UnloadModelRequest", "version", 2, "string"),
    ("UnloadModelResponse", "status", 1, "ModelStatus"),
    ("GetModelStatusRequest", "model", 1, "string"),
    ("GetModelStatusRequest", "version", 2, "string"),
    ("GetModelStatusResponse", "status", 1, "ModelStatus"),
    ("ListModelsResponse", "models", 1, "repeated ModelStatus"),
    ("RouteRequest", "model", 1, "string"),
    ("RouteRequest", "version", 2, "string"),
    ("RouteRequest", "routing_key", 3, "string"),
    ("RouteResponse", "worker_id", 1, "string"),
    ("RouteResponse", "data_endpoint", 2, "string"),
    ("RouteResponse", "version", 3, "string"),
    ("RouteResponse", "breaker_level", 4, "uint32"),
    ("Tensor", "name", 1, "string"),
    ("Tensor", "dtype", 2, "string"),
    ("Tensor", "shape", 3, "repeated int64"),
    ("Tensor", "data", 4, "bytes"),
    ("InferRequest", "model", 1, "string"),
    ("InferRequest", "version", 2, "string"),
    ("InferRequest", "request_id", 3, "string"),
    ("InferRequest", "routing_key", 4, "string"),
    ("InferRequest", "inputs", 5, "repeated Tensor"),
    ("InferResponse", "model", 1, "string"),
    ("InferResponse", "version", 2, "string"),
    ("InferResponse", "request_id", 3, "string"),
    ("InferResponse", "outputs", 4, "repeated Tensor"),
}

V1_MODEL_STATES = {
    "STATE_UNSPECIFIED": 0,
    "IDLE": 1,
    "LOADING": 2,
    "READY": 3,
    "RUNNING": 4,
    "PAUSED": 5,
    "UNLOADING": 6,
    "ERROR": 7,
    "RECOVERING": 8,
}

# Same-named v1 and v2 fields that deliberately differ: v2 types the element type as an enum (field 5)
# and reserves v1's number.
V1_V2_RENAMED = {("Tensor", "dtype")}


def _type_of(field: FieldDescriptor) -> str:
    """The type as a golden row records it: "uint32", "repeated int64", "ModelState", "repeated Tensor"."""
    kind = descriptor_pb2.FieldDescriptorProto.Type.Name(field.type).removeprefix("TYPE_").lower()
    if field.message_type is not None:
        kind = field.message_type.name
    elif field.enum_type is not None:
        kind = field.enum_type.name
    return f"repeated {kind}" if field.is_repeated else kind


def _messages(modules: tuple[ModuleType, ...]) -> dict[str, Descriptor]:
    return {name: desc for m in modules for name, desc in m.DESCRIPTOR.message_types_by_name.items()}


def _fields(modules: tuple[ModuleType, ...]) -> set[tuple[str, str, int, str]]:
    return {
        (name, f.name, f.number, _type_of(f))
        for name, desc in _messages(modules).items()
        for f in desc.fields
    }


def test_released_v1_fields_never_change() -> None:
    actual = _fields(V1_MODULES)
    changed = sorted(V1_FIELDS - actual)
    assert not changed, f"released v1 fields were renumbered, retyped, renamed or removed: {changed}"


def test_new_v1_fields_are_recorded() -> None:
    new = sorted(_fields(V1_MODULES) - V1_FIELDS)
    assert not new, f"new v1 fields: add them to V1_FIELDS so their numbers are frozen too: {new}"


def test_v1_model_states_never_change() -> None:
    assert dict(v1_control.ModelState.items()) == V1_MODEL_STATES


def test_v1_and_v2_model_states_convert_by_number() -> None:
    assert dict(v2_model.ModelState.items()) == dict(v1_control.ModelState.items())


def test_v1_packages_and_services() -> None:
    for module in V1_MODULES:
        assert module.DESCRIPTOR.package == "mcpapi.v1"
    services = {s for m in V1_MODULES for s in m.DESCRIPTOR.services_by_name}
    assert services == {"ModelControl", "Inference"}


def _service(modules: tuple[ModuleType, ...], name: str) -> ServiceDescriptor:
    (service,) = [
        m.DESCRIPTOR.services_by_name[name] for m in modules if name in m.DESCRIPTOR.services_by_name
    ]
    return service


@pytest.mark.parametrize("service", ["ModelControl", "Inference"])
def test_v2_serves_every_v1_rpc(service: str) -> None:
    v1, v2 = _service(V1_MODULES, service), _service(V2_MODULES, service)
    for method in v1.methods:
        assert method.name in v2.methods_by_name, f"v2 {service} lacks v1 RPC {method.name}"
        other = v2.methods_by_name[method.name]
        assert (other.input_type.name, other.output_type.name) == (
            method.input_type.name,
            method.output_type.name,
        )
        assert (other.client_streaming, other.server_streaming) == (
            method.client_streaming,
            method.server_streaming,
        )


def test_shared_field_names_keep_v1_numbers_and_types() -> None:
    # So that v1 handlers are plain adapters, and v1 bytes read as v2 keep their meaning.
    v2_messages = _messages((v2_control, v2_inference, v2_model))
    problems = []
    for name, v1_desc in _messages(V1_MODULES).items():
        v2_desc = v2_messages.get(name)
        if v2_desc is None:
            continue
        for field in v1_desc.fields:
            other = v2_desc.fields_by_name.get(field.name)
            if other is None or (name, field.name) in V1_V2_RENAMED:
                continue
            if (other.number, _type_of(other)) != (field.number, _type_of(field)):
                problems.append(
                    f"{name}.{field.name}: v1 {field.number} {_type_of(field)}, "
                    f"v2 {other.number} {_type_of(other)}"
                )
    assert not problems, "\n".join(problems)


def test_v2_tensor_reserves_the_v1_dtype_number() -> None:
    assert v2_inference.Tensor.DESCRIPTOR.fields_by_name["dtype"].number != 2
    assert 2 not in v2_inference.Tensor.DESCRIPTOR.fields_by_number


def test_v1_infer_request_bytes_read_as_v2() -> None:
    v1 = v1_inference.InferRequest(model="demo-mlp", version="2", request_id="r1", routing_key="user-9")
    v1.inputs.add(name="INPUT0", dtype="FP32", shape=[1, 64], data=b"\x00" * 256)
    v2 = v2_inference.InferRequest.FromString(v1.SerializeToString())
    assert (v2.model, v2.version, v2.request_id, v2.routing_key) == ("demo-mlp", "2", "r1", "user-9")
    (tensor,) = v2.inputs
    assert (tensor.name, list(tensor.shape), tensor.data) == ("INPUT0", [1, 64], b"\x00" * 256)


def test_v1_route_and_status_bytes_read_as_v2() -> None:
    route = v1_inference.RouteRequest(model="demo-mlp", version="1", routing_key="k")
    assert v2_inference.RouteRequest.FromString(route.SerializeToString()) == v2_inference.RouteRequest(
        model="demo-mlp", version="1", routing_key="k"
    )
    replica = v1_control.ReplicaStatus(
        model="m", version="1", worker_id="w1", state=v1_control.RUNNING, since_unix_ms=5, reason="ok"
    )
    as_v2 = v2_model.ReplicaStatus.FromString(replica.SerializeToString())
    assert (as_v2.worker_id, as_v2.state, as_v2.since_unix_ms) == ("w1", v2_model.RUNNING, 5)


def _generated_modules() -> list[str]:
    return sorted(info.name for info in pkgutil.walk_packages(mcpapi.__path__, prefix="mcpapi."))


def test_generated_code_is_importable() -> None:
    modules = _generated_modules()
    for proto in sorted(PROTO_DIR.rglob("*.proto")):
        module = proto.relative_to(PROTO_DIR).with_suffix("").as_posix().replace("/", ".") + "_pb2"
        assert module in modules, f"{proto} has no generated module {module}"
    for name in modules:
        module = importlib.import_module(name)
        if name.endswith("_pb2"):
            for service in module.DESCRIPTOR.services_by_name:
                stubs = importlib.import_module(name + "_grpc")
                assert hasattr(stubs, f"{service}Stub")
                assert hasattr(stubs, f"{service}Servicer")
                assert hasattr(stubs, f"add_{service}Servicer_to_server")
