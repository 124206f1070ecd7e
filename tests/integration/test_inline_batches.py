"""Fast models' batches run on the worker's event loop (``mcp_worker.batching.inline``), against a real worker
process over ZeroMQ: the worker counts them (``mcp_worker_inline_batches_total``), every answer stays
right, a model behind a 50 ms sleep never runs there, and ``inline_batch_ms`` 0 keeps every batch on the
threads."""

from __future__ import annotations

import numpy as np
import pytest
from harness import TensorClient, make_demo_repository, metric, mlp_reference, serving_worker

from mcp_worker.batching.inline import WINDOW

FAST = ("demo-mlp", "demo-onnx")  # numpy and onnxruntime (same weights): both may run inline
RUNS = 3 * WINDOW  # one request at a time: each its own batch


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_demo_repository(tmp_path_factory.mktemp("repo") / "models")


@pytest.mark.parametrize("inline_batch_ms", [None, 0.0], ids=["default", "off"])
def test_fast_models_run_inline_slow_ones_never_and_zero_turns_it_off(
    tmp_path, etcd_endpoint, repo, inline_batch_ms
):
    flags = {} if inline_batch_ms is None else {"inline_batch_ms": inline_batch_ms}
    models = (*FAST, "demo-slow")
    with (
        serving_worker(tmp_path, etcd_endpoint, repo, models, **flags) as proc,
        TensorClient(proc.endpoints["zmq"]) as client,
    ):
        for model in FAST:
            for i in range(RUNS):
                x = np.full((1, 64), i / 10, np.float32)
                out = client.infer(model, {"INPUT0": x}).named()["OUTPUT0"]
                np.testing.assert_allclose(out, mlp_reference(repo, "demo-mlp", "1", x), rtol=1e-4, atol=1e-5)
        for _ in range(WINDOW + 2):
            client.infer("demo-slow", {"INPUT0": np.zeros((1, 64), np.float32)})
        text = proc.metrics_text()
    for model in FAST:
        assert metric(text, "mcp_batch_size_count", model=model) == RUNS
        inline = metric(text, "mcp_worker_inline_batches_total", model=model)
        if inline_batch_ms is None:  # a window on the threads first, then most on the loop
            assert 0 < inline <= RUNS - WINDOW, model
        else:
            assert inline == 0, model
    assert metric(text, "mcp_worker_inline_batches_total", model="demo-slow") == 0
