"""``mcpcore.records``: process documents tolerate and count unknown fields, operator documents are strict,
every writer's bytes parse back, and ``OperatorDocs`` applies the one rule for a malformed operator
document (the last good value stays, the rejection is counted and recorded, a fixed document clears it)."""

import json

import pytest

from mcpcore.errors import InvalidArgument
from mcpcore.keys import Keyspace
from mcpcore.records import (
    UNKNOWN_FIELDS,
    BreakerDoc,
    BreakerPolicy,
    Demand,
    DrainDoc,
    LoadReport,
    ModelSpecDoc,
    ModelStatusDoc,
    OperatorDocs,
    RejectionsDoc,
    ReplicaRecord,
    ReplicaState,
    RouterRecord,
    StatsDoc,
    TrafficDoc,
    WorkerRecord,
)
from mcpcore.records.breaker import DEFAULT_POLICY

K = Keyspace()

# what a worker writes today (mcp_worker.server._record / _report), as JSON
WORKER = {
    "worker_id": "w1", "grpc": "10.0.0.1:7001", "zmq": "tcp://10.0.0.1:7002", "metrics": "10.0.0.1:9110",
    "labels": {"gpu": "h200"}, "memory_capacity_bytes": 8 << 30,
    "devices": [{"index": 0, "memory_total_bytes": 80 << 30}], "started_at": 100.0,
    "curve_public_key": "", "incarnation": "i-1", "zmq_features": ["batch"], "capacity": 1.0, "draining": "",
}  # fmt: skip
LOAD = {
    "worker_id": "w1", "queue_depth": 2, "in_flight": 1, "batch_utilization": 0.5, "mean_exec_s": 0.01,
    "memory_used_bytes": 100, "memory_capacity_bytes": 8 << 30, "last_active": 5.0, "stopped": "",
    "exec_errors_total": 0, "buffer_pool_hits": 3, "device_error": "", "heartbeat_interval_s": 1.0,
    "last_beat": 6.0,
    "models": {"m/1": {"state": "RUNNING", "queue_depth": 2, "batch_utilization": 0.5, "memory_bytes": 100,
                       "mean_exec_s": 0.01, "max_batch_size": 8, "breaker_level": 0}},
}  # fmt: skip
INFO = {
    "memory_bytes": 4096, "platform": "numpy", "incarnation": "i-1", "zmq": "tcp://x:1", "grpc": "x:2",
    "inputs": [{"name": "INPUT0", "dtype": "FP32", "shape": [-1, 64]}],
    "outputs": [{"name": "OUTPUT0", "dtype": "FP32", "shape": [-1, 16]}],
    "secondary": ["RANK0"], "idempotent": True, "max_ongoing_requests": 64,
    "config": {"max_batch_size": 8, "instance_count": 1, "device": "cpu", "device_id": None,
               "cpu_fallback": "", "decoupled": False,
               "dynamic_batching": {"max_queue_delay_us": 100, "preferred_batch_sizes": [4, 8],
                                    "priority_levels": 1, "default_priority_level": 1,
                                    "default_queue_timeout_us": 0, "max_queue_size": 0}},
}  # fmt: skip


def raw(doc):
    return json.dumps(doc).encode()


# --- process documents: what a newer writer adds is ignored, and counted -------------------------------


PROCESS = [
    (WorkerRecord, K.worker("w1"), WORKER, "worker"),
    (LoadReport, K.worker_load("w1"), LOAD, "load"),
    (ReplicaRecord, K.replica("m", "1", "w1"), {"state": "RUNNING", "since": 1.0, "info": INFO}, "replica"),
    (TrafficDoc, K.model_routing("m"), {"stable": "1"}, "routing"),
    (ModelStatusDoc, K.model_status("m"), {"model": "m", "versions": {"1": {"running": 1, "required": 1}}},
     "status"),
    (Demand, K.demand("m", "r1"), {"requests": 3, "overflow": 0, "at": 1.0}, "demand"),
    (DrainDoc, K.drain("w1"), {"reason": "maintenance", "at": 1.0}, "drain"),
    (StatsDoc, K.stats("r1", "m"), {"router": "r1", "requests": 10, "timeout": 1, "window_s": 30, "at": 1.0},
     "stats"),
    (RouterRecord, K.router("r1"), {"router_id": "r1", "grpc": "h:1", "metrics": "h:2"}, "router"),
    (RejectionsDoc, K.rejected("router", "r1"), {"service": "router", "instance": "r1", "rejections": []},
     "rejected"),
]  # fmt: skip


@pytest.mark.parametrize(("cls", "key", "doc", "kind"), PROCESS, ids=[p[3] for p in PROCESS])
def test_a_process_document_tolerates_and_counts_unknown_fields(cls, key, doc, kind):
    known = cls.parse(key, raw(doc))
    before = UNKNOWN_FIELDS[kind]
    newer = cls.parse(key, raw({**doc, "from_a_newer_writer": {"x": 1}, "another": 2}))
    assert newer == known  # ignored...
    assert UNKNOWN_FIELDS[kind] == before + 2  # ...and counted


@pytest.mark.parametrize(("cls", "key", "doc", "kind"), PROCESS, ids=[p[3] for p in PROCESS])
def test_a_process_document_round_trips(cls, key, doc, kind):
    parsed = cls.parse(key, raw(doc))
    assert cls.parse(key, parsed.to_json()) == parsed


def test_the_worker_writes_the_bytes_it_always_wrote():
    # sorted keys, compact: what registration wrote with json.dumps(sort_keys=True) before the records
    for cls, key, doc in ((WorkerRecord, K.worker("w1"), WORKER), (LoadReport, K.worker_load("w1"), LOAD)):
        old = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        assert cls.parse(key, doc).to_json() == old


def test_an_unknown_field_nested_in_a_replicas_info_is_tolerated():
    doc = {"state": "RUNNING", "since": 1.0, "info": {**INFO, "config": {**INFO["config"], "new": 1}}}
    record = ReplicaRecord.parse(K.replica("m", "1", "w1"), raw(doc))
    assert record.details.config is not None and record.details.config.max_batch_size == 8
    assert record.details.inputs[0].shape == (-1, 64) and record.details.idempotent


def test_a_replica_record_with_a_malformed_info_does_not_exist():
    with pytest.raises(InvalidArgument, match=r"/mcp/replicas/m/1/w1: info: idempotent: expected true"):
        ReplicaRecord.parse(
            K.replica("m", "1", "w1"), raw({"state": "IDLE", "since": 1, "info": {"idempotent": 1}})
        )
    with pytest.raises(InvalidArgument, match="info: memory_bytes: must be >= 0"):
        ReplicaRecord(ReplicaState.IDLE, 1.0, info={"memory_bytes": -1})  # nor can a writer make one


def test_older_documents_still_parse():
    # a load report from before reasons were strings, a worker record without the later fields
    assert LoadReport.parse(K.worker_load("w1"), b'{"stopped": true}').stopped == "stopped"
    old = {"grpc": "h:1", "zmq": "tcp://h:2", "memory_capacity_bytes": 1}
    assert WorkerRecord.parse(K.worker("w1"), raw(old)).draining == ""
    assert (
        ReplicaRecord.parse(K.replica("m", "1", "w1"), b'{"state": "IDLE", "since": 1}').details.memory_bytes
        == 0
    )


# --- operator documents: strict ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parse", "key", "doc", "message"),
    [
        (TrafficDoc.parse, K.model_traffic("m"), {"stable": "1", "canary_percnt": 5},
         r"/mcp/models/m/traffic: canary_percnt: unknown field \(did you mean 'canary_percent'\?\)"),
        (ModelSpecDoc.parse, K.model_spec("m"), {"versions": ["1"], "replica": 2},
         r"/mcp/models/m/spec: replica: unknown field"),
        (BreakerDoc.parse, K.breaker("m"), {"level": 1, "untill": 5}, r"/mcp/breakers/m: unknown field"),
        (BreakerPolicy.parse, K.breaker_config(), {**json.loads(DEFAULT_POLICY.to_json()), "cooldown": "5m"},
         r"/mcp/config/breaker: unknown field\(s\) \['cooldown'\]"),
    ],
)  # fmt: skip
def test_an_operator_document_rejects_unknown_fields_naming_the_key(parse, key, doc, message):
    with pytest.raises(InvalidArgument, match=message):
        parse(key, raw(doc))


def test_traffic_and_routing_share_one_format_but_not_the_strictness():
    doc = raw({"stable": "1", "canary": "2", "canary_percent": 10, "note": "x"})
    assert TrafficDoc.parse(K.model_routing("m"), doc) == TrafficDoc("1", "2", 10)
    with pytest.raises(InvalidArgument, match="note: unknown field"):
        TrafficDoc.parse(K.model_traffic("m"), doc)


def test_the_policy_round_trips_through_its_writer():
    assert BreakerPolicy.parse(K.breaker_config(), DEFAULT_POLICY.to_json()) == DEFAULT_POLICY


# --- the one rule for a malformed operator document --------------------------------------------------


def test_the_last_good_value_stays_and_the_rejection_is_counted_recorded_and_cleared():
    counted, changes = [], []
    docs = OperatorDocs("router", "r1", on_rejected=counted.append, on_change=lambda: changes.append(1),
                        clock=lambda: 42.0)  # fmt: skip
    key = K.model_traffic("m")
    good = docs.apply(
        key, b'{"stable": "1", "canary": "2", "canary_percent": 10}', TrafficDoc.parse, "traffic"
    )
    assert good == TrafficDoc("1", "2", 10) and not docs.rejections and not changes
    kept = docs.apply(key, b'{"stable": "1", "canary_percent": 150}', TrafficDoc.parse, "traffic")
    assert kept == good and docs.get(key) == good  # the last good value stays in force
    assert counted == ["traffic"] and len(changes) == 1
    rejection = docs.rejections[key]
    assert (rejection.kind, rejection.at) == ("traffic", 42.0)
    assert "canary_percent" in rejection.reason and key in rejection.reason
    published = docs.doc()
    assert RejectionsDoc.parse(K.rejected("router", "r1"), published.to_json()) == published
    assert docs.apply(key, b'{"stable": "2"}', TrafficDoc.parse, "traffic") == TrafficDoc("2")
    assert not docs.rejections and len(changes) == 2  # a fixed document clears it


def test_with_no_good_value_yet_a_malformed_document_counts_as_absent():
    docs: OperatorDocs[BreakerDoc] = OperatorDocs("worker", "w1")
    key = K.breaker("m")
    assert docs.apply(key, b"{not json", BreakerDoc.parse, "breaker") is None
    assert docs.get(key) is None and key in docs.rejections
    assert docs.apply(key, None, BreakerDoc.parse, "breaker") is None  # deleted: absent, no longer rejected
    assert not docs.rejections


def test_rejections_are_published_under_a_key_per_service_instance():
    assert K.rejected("health", "h-1") == "/mcp/rejected/health/h-1"
    assert K.parse_rejected_key("/mcp/rejected/health/h-1") == ("health", "h-1")
    assert K.parse_rejected_key("/mcp/rejected/nobody/h-1") is None
    with pytest.raises(InvalidArgument, match="service 'gateway'"):
        K.rejected("gateway", "g1")
