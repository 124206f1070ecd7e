"""Triton's side of the KServe wire tests, run as a separate process.

Triton's generated `service_pb2` (shipped in tritonclient) and our `mcpapi.kserve.grpc_service_pb2`
both define `inference.*` in the default descriptor pool, so they cannot be imported into one process.
test_kserve_wire.py runs this file as a script for everything that needs Triton's classes; only
`describe` (which touches no generated module) is imported into the test process as well.

Commands (results are JSON on stdout):
  describe                 Triton's grpc_service.proto and model_config.proto, as `describe_all` renders
                           them
  roundtrip                stdin {"type", "b64"}: parse with Triton's class; return it as a dict, and
                           re-serialized after rebuilding it from that dict with Triton's class
  client HOST:PORT         drive a server with tritonclient.grpc's public API; return what it saw
"""

# Imports of tritonclient (and what only it needs) stay inside the commands, so that `describe` can be
# imported where tritonclient must not be.
# ruff: noqa: PLC0415

from __future__ import annotations

import base64
import json
import sys
from typing import Any

from google.protobuf import descriptor_pb2

_Field = descriptor_pb2.FieldDescriptorProto


def describe(file_descriptor: Any) -> dict[str, Any]:
    """Every message, enum and service of a generated file, as plain data that can be compared."""
    proto = descriptor_pb2.FileDescriptorProto()
    file_descriptor.CopyToProto(proto)
    messages: dict[str, Any] = {}
    enums: dict[str, dict[str, int]] = {}

    def walk(message_types: Any, enum_types: Any, scope: str) -> None:
        for enum in enum_types:
            enums[f"{scope}.{enum.name}"] = {v.name: v.number for v in enum.value}
        for msg in message_types:
            name = f"{scope}.{msg.name}"
            oneofs = [o.name for o in msg.oneof_decl]
            messages[name] = {
                "map_entry": msg.options.map_entry,
                "fields": {
                    f.name: {
                        "number": f.number,
                        "type": _Field.Type.Name(f.type),
                        "label": _Field.Label.Name(f.label),
                        "type_name": f.type_name.lstrip("."),
                        "oneof": oneofs[f.oneof_index] if f.HasField("oneof_index") else "",
                    }
                    for f in msg.field
                },
            }
            walk(msg.nested_type, msg.enum_type, name)

    walk(proto.message_type, proto.enum_type, proto.package)
    services = {
        f"{proto.package}.{svc.name}": {
            m.name: {
                "input": m.input_type.lstrip("."),
                "output": m.output_type.lstrip("."),
                "client_streaming": m.client_streaming,
                "server_streaming": m.server_streaming,
            }
            for m in svc.method
        }
        for svc in proto.service
    }
    return {"package": proto.package, "messages": messages, "enums": enums, "services": services}


def describe_all(*file_descriptors: Any) -> dict[str, Any]:
    """``describe`` of several files of one package, merged (Triton splits its protocol in two)."""
    merged: dict[str, Any] = {"package": "", "messages": {}, "enums": {}, "services": {}}
    for file_descriptor in file_descriptors:
        one = describe(file_descriptor)
        merged["package"] = merged["package"] or one["package"]
        for key in ("messages", "enums", "services"):
            merged[key].update(one[key])
    return merged


def _roundtrip(request: dict[str, str]) -> dict[str, Any]:
    from google.protobuf import json_format
    from tritonclient.grpc import service_pb2

    cls = getattr(service_pb2, request["type"])
    parsed = cls.FromString(base64.b64decode(request["b64"]))
    as_dict = json_format.MessageToDict(parsed, preserving_proto_field_name=True)
    rebuilt = json_format.ParseDict(as_dict, cls())
    return {
        "dict": as_dict,
        "rebuilt_b64": base64.b64encode(rebuilt.SerializeToString(deterministic=True)).decode(),
    }


def _client(url: str) -> dict[str, Any]:
    import numpy as np
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    client = triton.InferenceServerClient(url)
    seen: dict[str, Any] = {
        "live": client.is_server_live(client_timeout=10),
        "ready": client.is_server_ready(client_timeout=10),
        "model_ready": client.is_model_ready("demo-mlp", client_timeout=10),
        "server_metadata": client.get_server_metadata(as_json=True, client_timeout=10),
        "model_metadata": client.get_model_metadata("demo-mlp", as_json=True, client_timeout=10),
    }
    batch = np.arange(2 * 64, dtype=np.float32).reshape(2, 64)
    tensor = triton.InferInput("INPUT0", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)
    result = client.infer(
        "demo-mlp",
        [tensor],
        model_version="1",
        outputs=[triton.InferRequestedOutput("OUTPUT0")],
        request_id="req-7",
        priority=2,
        parameters={"tenant": "blue"},
        client_timeout=10,
    )
    output = result.as_numpy("OUTPUT0")
    seen["infer"] = {
        "id": result.get_response().id,
        "dtype": str(output.dtype),
        "shape": list(output.shape),
        "values": output.tolist(),
    }
    client.load_model("demo-onnx", client_timeout=10)
    client.unload_model("demo-onnx", client_timeout=10)
    seen["index"] = client.get_model_repository_index(as_json=True, client_timeout=10)
    try:
        client.infer("no-such-model", [tensor], client_timeout=10)
    except InferenceServerException as exc:
        seen["error"] = {"status": exc.status(), "message": exc.message()}
    client.close()
    return seen


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    if command == "describe":
        from tritonclient.grpc import model_config_pb2, service_pb2

        result = describe_all(service_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR)
    elif command == "roundtrip":
        result = _roundtrip(json.load(sys.stdin))
    elif command == "client" and len(argv) == 3:
        result = _client(argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
