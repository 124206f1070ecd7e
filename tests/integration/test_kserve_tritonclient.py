"""Wire compatibility end to end: Triton's own client against ``KServeServicer`` on a real grpc.aio server.

Two processes, because tritonclient's ``service_pb2`` and our ``grpc_service_pb2`` cannot share one:
kserve_fake_server.py (the servicer over a numpy DataPlane, behind the shared error mapping) and
triton_client_script.py (tritonclient.grpc, which prints a JSON report). This process imports only ours.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).parent
SERVER = HERE / "kserve_fake_server.py"
CLIENT = HERE / "triton_client_script.py"

_spec = importlib.util.spec_from_file_location("kserve_fake_server", SERVER)
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)


@pytest.fixture(scope="module")
def run() -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """The client's report and the server's CALL lines (what the DataPlane was given), from one run."""
    server = subprocess.Popen(
        [sys.executable, str(SERVER)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = server.stdout.readline().split()  # blocks until READY, or "" if the server died
        if line[:1] != ["READY"]:
            server.kill()
            pytest.fail(f"fake server did not start: {server.communicate(timeout=10)[1][-2000:]}")
        client = subprocess.run(
            [sys.executable, str(CLIENT), line[1]], capture_output=True, text=True, timeout=90, check=False
        )
        assert client.returncode == 0, client.stderr[-4000:]
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=10)
    calls = [json.loads(line.removeprefix("CALL ")) for line in out.splitlines() if line.startswith("CALL ")]
    yield json.loads(client.stdout), calls


def test_health_and_server_metadata(run):
    report, _ = run
    assert (report["live"], report["ready"], report["model_ready"]) == (True, True, True)
    assert report["unknown_model_ready"] is False
    assert report["server_metadata"] == {
        "name": "mcpmesh",
        "version": "0.1.0-test",
        "extensions": [
            "model_repository",
            "model_configuration",
            "statistics",
            "system_shared_memory",
            "binary_tensor_data",
            "parameters",
            "sequence",
            "trace",
            "logging",
        ],
    }


def test_model_metadata_and_not_found(run):
    report, _ = run
    meta = report["model_metadata"]
    assert (meta["name"], meta["versions"], meta["platform"]) == ("demo-mlp", ["1"], "numpy")
    # MessageToJson writes int64 as strings
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "64"]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": ["-1", "16"]}]
    assert report["unknown_model_metadata"]["status"] == "StatusCode.NOT_FOUND"
    assert "no-such-model" in report["unknown_model_metadata"]["message"]


def test_infer_matches_the_same_math_here(run):
    report, _ = run
    x = np.array(report["input"], dtype=np.float32)
    expected = fake.mlp(x, fake.mlp_weights())
    infer = report["infer"]
    assert (infer["id"], infer["model_name"], infer["model_version"]) == ("req-7", "demo-mlp", "1")
    assert (infer["outputs"], infer["dtype"], infer["shape"]) == (["OUTPUT0"], "float32", [4, 16])
    np.testing.assert_allclose(np.array(infer["values"]), expected, rtol=1e-5, atol=1e-6)
    every = report["infer_all_outputs"]
    assert every["outputs"] == ["OUTPUT0"]
    np.testing.assert_allclose(np.array(every["values"]), expected[:1], rtol=1e-5, atol=1e-6)


def test_tritonclient_parameters_reach_the_dataplane(run):
    _, calls = run
    first = calls[0]
    assert (first["model"], first["version"], first["request_id"], first["shape"]) == (
        "demo-mlp",
        "",
        "req-7",
        [4, 64],
    )
    assert (first["routing_key"], first["priority"], first["outputs"]) == ("user-42", 2, ["OUTPUT0"])
    assert first["timeout_s"] == pytest.approx(5.0)  # the timeout parameter, shorter than the deadline
    assert first["parameters"] == {"tenant": "blue"}
    second = calls[1]  # no ids, no parameters, no deadline
    assert second["request_id"] == "" and second["timeout_s"] is None  # no id is made up; none is echoed
    assert (second["routing_key"], second["priority"], second["outputs"]) == ("", 0, [])


def test_errors_arrive_as_statuses(run):
    errors = run[0]["errors"]
    assert errors["unknown_model"]["status"] == "StatusCode.NOT_FOUND"
    # BYTES travel now: the fake data plane checks the signature, as the router does
    assert errors["bytes_input"]["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "takes INPUT0 FP32 [-1, 64]; got {'INPUT0': ('object', [1])}" in errors["bytes_input"]["message"]
    assert errors["unknown_output"]["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "no output(s) ['NO_SUCH_OUTPUT']" in errors["unknown_output"]["message"]


def test_repository_index_load_and_unload(run):
    repo = run[0]["repository"]

    def states(index: list[dict[str, str]]) -> dict[str, str]:
        return {m["name"]: m["state"] for m in index}

    assert states(repo["index"]) == {"demo-mlp": "READY", "demo-onnx": "UNAVAILABLE"}
    assert repo["after_load"]["ready"] is True
    assert states(repo["after_load"]["index"])["demo-onnx"] == "READY"
    assert repo["after_unload"]["ready"] is False
    assert states(repo["after_unload"]["index"])["demo-onnx"] == "UNAVAILABLE"
    assert repo["load_with_config"]["status"] == "StatusCode.INVALID_ARGUMENT"
