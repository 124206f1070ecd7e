"""LoadModel right after an unload, on a worker that still has the model's idle record: the load goes
there (a record that holds nothing is no obstacle) instead of failing RESOURCE_EXHAUSTED "already holds a
copy". Found by the load_to_running bench, which unloads by hand on the worker, then loads and unloads
through the scheduler five times."""

from __future__ import annotations

import uuid

from harness import SchedulerProcess, WorkerProcess

from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2, worker_pb2


def test_load_after_unloads_by_hand_and_through_the_scheduler(tmp_path, etcd_endpoint, repo):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    worker = WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=prefix).start()
    scheduler = None
    try:
        direct = worker.control()  # by hand, before any scheduler: leaves an IDLE record behind
        direct.Load(worker_pb2.LoadRequest(model="demo-mlp", version="1"), timeout=30)
        direct.Unload(worker_pb2.UnloadRequest(model="demo-mlp", version="1"), timeout=30)
        scheduler = SchedulerProcess(tmp_path, etcd_endpoint, prefix=prefix).start()
        control = control_pb2_grpc.ModelControlStub(scheduler.channel())
        spec = model_pb2.ModelSpec(model="demo-mlp", versions=["1"], replicas=1)
        for _ in range(3):
            status = control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
            assert [r.state for r in status.status.replicas] == [model_pb2.ModelState.RUNNING]
            control.UnloadModel(control_pb2.UnloadModelRequest(model="demo-mlp"), timeout=60)
    finally:
        if scheduler is not None:
            scheduler.stop()
        worker.stop()
