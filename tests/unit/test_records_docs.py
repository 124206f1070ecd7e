"""The model, demand, worker and replica records (``mcpcore.records``) and the scheduler's views of them:
every field validated, errors name the key and the field, round trips hold."""

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_scheduler.state import replica_info, worker_info
from mcpcore.errors import InvalidArgument
from mcpcore.lifecycle import ReplicaRecord, ReplicaState, Transition
from mcpcore.records import Demand, ModelSpecDoc, TrafficDoc


def spec_key(model):
    return f"/mcp/models/{model}/spec"


def traffic_key(model, what="traffic"):
    return f"/mcp/models/{model}/{what}"


def parse_worker(worker, record, load, draining):
    return worker_info(f"/mcp/workers/{worker}", record, f"/mcp/workers/{worker}/load", load, draining)


def parse_replica(model, version, worker, raw, revision):
    return replica_info(f"/mcp/replicas/{model}/{version}/{worker}", raw, revision)


def j(**body):
    return json.dumps(body).encode()


# --- spec ------------------------------------------------------------------------------------------------


def test_spec_minimal_defaults_and_int_versions():
    spec = ModelSpecDoc.parse(spec_key("demo-mlp"), j(versions=[1, "2"]))
    assert spec == ModelSpecDoc(model="demo-mlp", versions=("1", "2"))


def test_spec_full_round_trip():
    spec = ModelSpecDoc(
        model="demo-mlp",
        versions=("1", "2", "3"),
        replicas=2,
        min_replicas=1,
        max_replicas=4,
        priority=-3,
        memory_bytes=1 << 30,
        labels={"gpu": "h200", "zone": "a"},
        fallback_version="1",
        load_on_demand=True,
        latency_sensitivity=0.9,
        max_batch_size=16,
        max_queue_delay_us=500,
        paused_versions=("3",),
    )
    raw = spec.to_json()
    assert ModelSpecDoc.parse(spec_key("demo-mlp"), raw) == spec
    assert "model" not in json.loads(raw)  # the key names the model


def test_spec_model_field_must_match_the_key():
    assert ModelSpecDoc.parse(spec_key("m"), j(model="m", versions=["1"])).model == "m"
    with pytest.raises(InvalidArgument, match='/mcp/models/m/spec: model: names "other"'):
        ModelSpecDoc.parse(spec_key("m"), j(model="other", versions=["1"]))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "/mcp/models/m/spec: versions: required"),
        ({"versions": []}, "versions: must list at least one version"),
        ({"versions": "1"}, "versions: expected a list of versions"),
        ({"versions": ["1", 1]}, "versions: version 1 is listed twice"),
        ({"versions": ["v1"]}, 'versions\\[0\\]: expected a version .* got "v1"'),
        ({"versions": [0]}, "versions\\[0\\]: expected a version"),
        ({"versions": [True]}, "versions\\[0\\]: expected a version .* got true"),
        ({"versions": [1.0]}, "versions\\[0\\]: expected a version"),
        ({"versions": ["1"], "replicas": -1}, "replicas: must be >= 0, got -1"),
        ({"versions": ["1"], "replicas": "2"}, 'replicas: expected an integer, got "2"'),
        ({"versions": ["1"], "replicas": 0}, "replicas: 0 needs load_on_demand: true"),
        ({"versions": ["1"], "replicas": 3, "max_replicas": 2}, "max_replicas: must be 0 .* or >= replicas"),
        ({"versions": ["1"], "max_replicas": -1}, "max_replicas: must be >= 0"),
        ({"versions": ["1"], "replicas": 2, "min_replicas": 3}, "min_replicas: must be 0 .* or <= replicas"),
        ({"versions": ["1"], "min_replicas": -1}, "min_replicas: must be >= 0"),
        ({"versions": ["1"], "priority": 1.5}, "priority: expected an integer, got 1.5"),
        ({"versions": ["1"], "priority": None}, "priority: expected an integer, got null"),
        ({"versions": ["1"], "memory_bytes": -5}, "memory_bytes: must be >= 0, got -5"),
        ({"versions": ["1"], "labels": ["gpu"]}, "labels: expected an object"),
        ({"versions": ["1"], "labels": {"gpu": 1}}, "labels.gpu: expected a string, got 1"),
        ({"versions": ["1"], "labels": {"": "x"}}, "labels.: a label name is non-empty"),
        ({"versions": ["1"], "fallback_version": "x"}, "fallback_version: expected a version"),
        ({"versions": ["1"], "load_on_demand": "yes"}, 'load_on_demand: expected true or false, got "yes"'),
        ({"versions": ["1"], "latency_sensitivity": 1.5}, "latency_sensitivity: must be 0..1, got 1.5"),
        ({"versions": ["1"], "latency_sensitivity": -0.1}, "latency_sensitivity: must be 0..1"),
        ({"versions": ["1"], "latency_sensitivity": "hi"}, "latency_sensitivity: expected a finite number"),
        ({"versions": ["1"], "max_batch_size": -1}, "max_batch_size: must be >= 0"),
        ({"versions": ["1"], "max_queue_delay_us": -1}, "max_queue_delay_us: must be >= 0"),
        ({"versions": ["1"], "paused_versions": ["2"]}, "paused_versions: version 2 is not in versions"),
        ({"versions": ["1"], "paused_versions": "1"}, "paused_versions: expected a list"),
        ({"versions": ["1"], "replica": 2}, "replica: unknown field \\(did you mean 'replicas'\\?\\)"),
        ({"versions": ["1"], "zzz": 2}, "zzz: unknown field \\(known fields: model, versions"),
    ],
)
def test_spec_errors_name_the_field(body, message):
    with pytest.raises(InvalidArgument, match=message):
        ModelSpecDoc.parse(spec_key("m"), json.dumps(body).encode())


def test_spec_accepts_nulls_where_optional_and_load_on_demand_zero():
    spec = ModelSpecDoc.parse(
        spec_key("m"),
        j(versions=[2], replicas=0, load_on_demand=True, fallback_version=None, max_queue_delay_us=None),
    )
    assert (spec.replicas, spec.fallback_version, spec.max_queue_delay_us) == (0, None, None)
    assert ModelSpecDoc.parse(spec_key("m"), j(versions=[1], fallback_version=1)).fallback_version == "1"


def test_spec_to_json_rejects_an_invalid_doc():
    with pytest.raises(InvalidArgument, match="/mcp/models/m/spec: versions"):
        ModelSpecDoc(model="m", versions=()).to_json()


# --- traffic and routing ---------------------------------------------------------------------------------


def test_traffic_operator_format():
    raw = b'{"stable": "1", "canary": "2", "canary_percent": 10}'
    assert TrafficDoc.parse(traffic_key("demo-mlp"), raw) == TrafficDoc("1", "2", 10)
    assert TrafficDoc.parse(traffic_key("demo-mlp"), b'{"stable": 3}') == TrafficDoc("3")
    assert TrafficDoc.parse(traffic_key("m"), b'{"stable": 1, "canary": null}') == TrafficDoc("1")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"stable": "1", "canary": "2", "canary_percent": 150},
            "/mcp/models/demo-mlp/traffic: canary_percent: must be 0..100, got 150",
        ),
        ({"stable": "1", "canary": "2", "canary_percent": -1}, "canary_percent: must be 0..100, got -1"),
        ({"stable": "1", "canary": "2", "canary_percent": 5.5}, "canary_percent: expected an integer"),
        ({"stable": "1", "canary_percent": 10}, "canary_percent: 10 needs a canary version"),
        ({"stable": "1", "canary": 1}, "canary: must differ from stable \\(1\\)"),
        ({"canary": "2"}, "stable: required"),
        ({"stable": None}, "stable: expected a version"),
        ({"stable": "one"}, "stable: expected a version"),
        ({"stable": "1", "canary": "x"}, "canary: expected a version"),
        ({"stable": "1", "canary_pct": 3}, "canary_pct: unknown field \\(did you mean 'canary_percent'"),
    ],
)
def test_traffic_errors(body, message):
    with pytest.raises(InvalidArgument, match=message):
        TrafficDoc.parse(traffic_key("demo-mlp"), json.dumps(body).encode())


@pytest.mark.parametrize("doc", [TrafficDoc("1"), TrafficDoc("1", "2", 0), TrafficDoc("4", "12", 100)])
def test_traffic_and_routing_round_trip(doc):
    assert TrafficDoc.parse(traffic_key("m"), doc.to_json()) == doc
    assert TrafficDoc.parse(traffic_key("m", "routing"), doc.to_json()) == doc


def test_routing_errors_say_routing():
    with pytest.raises(InvalidArgument, match="/mcp/models/m/routing: canary_percent"):
        TrafficDoc.parse(traffic_key("m", "routing"), b'{"stable": "1", "canary_percent": 10}')


def test_traffic_to_json_validates():
    with pytest.raises(InvalidArgument, match="canary: must differ"):
        TrafficDoc("1", "1", 10).to_json()


# --- not JSON at all -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b"\xff\xfe\x00", "not UTF-8 text"),
        (b"[1, 2]", "expected a JSON object, got a list"),
        (b'"1"', 'expected a JSON object, got "1"'),
        (b"null", "expected a JSON object, got null"),
        (b'{"stable": NaN}', "not JSON \\(NaN is not allowed\\)"),
        (b"[" * 100000, "not JSON"),
    ],
)
def test_non_json_is_invalid_argument(raw, message):
    for parse in (
        lambda r: ModelSpecDoc.parse(spec_key("m"), r),
        lambda r: TrafficDoc.parse(traffic_key("m"), r),
        lambda r: Demand.parse("/mcp/demand/m/r1", r),
        lambda r: parse_worker("w1", r, None, False),
        lambda r: parse_replica("m", "1", "w1", r, 3),
    ):
        with pytest.raises(InvalidArgument, match=message):
            parse(raw)


@given(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_garbage_only_ever_raises_invalid_argument(raw):
    for parse in (
        lambda r: ModelSpecDoc.parse(spec_key("m"), r),
        lambda r: TrafficDoc.parse(traffic_key("m"), r),
        lambda r: Demand.parse("/mcp/demand/m/r1", r),
        lambda r: parse_worker("w1", b'{"grpc": "g", "zmq": "z", "memory_capacity_bytes": 1}', r, False),
        lambda r: parse_replica("m", "1", "w1", r, 3),
    ):
        with contextlib.suppress(InvalidArgument):
            parse(raw)


FIELDS = (
    *("versions", "replicas", "labels", "latency_sensitivity", "stable", "canary", "state", "since", "info"),
    *("requests", "at", "grpc", "zmq", "memory_capacity_bytes", "stopped", "last_beat"),
)


@given(
    st.dictionaries(
        st.sampled_from(FIELDS),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
            ),
            max_leaves=6,
        ),
        max_size=4,
    )
)
def test_wrong_types_only_ever_raise_invalid_argument(body):
    raw = json.dumps(body).encode()
    for parse in (
        lambda r: ModelSpecDoc.parse(spec_key("m"), r),
        lambda r: TrafficDoc.parse(traffic_key("m"), r),
        lambda r: Demand.parse("/mcp/demand/m/r1", r),
        lambda r: parse_worker("w1", r, r, False),
        lambda r: parse_replica("m", "1", "w1", r, 3),
    ):
        with contextlib.suppress(InvalidArgument):
            parse(raw)


# --- demand ----------------------------------------------------------------------------------------------


def test_demand_round_trip_and_defaults():
    d = Demand(model="m", router="r1", requests=3, overflow=2, at=12.5)
    assert Demand.parse("/mcp/demand/m/r1", d.to_json()) == d
    assert Demand.parse("/mcp/demand/m/r1", b"{}") == Demand(model="m", router="r1")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"requests": -1}, "/mcp/demand/m/r1: requests: must be >= 0"),
        ({"overflow": "x"}, "overflow: expected an integer"),
        ({"at": "now"}, "at: expected a finite number"),
        ({"at": 10**400}, "at: expected a finite number"),
        ({"at": -1}, "at: must be >= 0"),
    ],
)
def test_demand_errors(body, message):
    with pytest.raises(InvalidArgument, match=message):
        Demand.parse("/mcp/demand/m/r1", json.dumps(body).encode())


# --- worker record and load report -----------------------------------------------------------------------

RECORD = {
    "worker_id": "w1",
    "grpc": "10.0.0.1:7001",
    "zmq": "tcp://10.0.0.1:7002",
    "metrics": "10.0.0.1:9100",
    "labels": {"gpu": "h200"},
    "memory_capacity_bytes": 8 << 30,
    "devices": [],
    "started_at": 100.0,
    "curve_public_key": "",
}


def test_worker_from_the_workers_record_and_report():
    load = {"worker_id": "w1", "queue_depth": 3, "stopped": "", "last_beat": 123.5, "models": {}}
    w = parse_worker("w1", json.dumps(RECORD).encode(), json.dumps(load).encode(), draining=True)
    assert (w.id, w.grpc, w.zmq, w.capacity_bytes) == ("w1", "10.0.0.1:7001", "tcp://10.0.0.1:7002", 8 << 30)
    assert (dict(w.labels), w.stopped, w.draining, w.last_beat) == ({"gpu": "h200"}, False, True, 123.5)


def test_worker_stopped_and_no_report():
    raw = json.dumps(RECORD).encode()
    assert parse_worker("w1", raw, b'{"stopped": "operator said so"}', False).stopped
    w = parse_worker("w1", raw, None, False)
    assert (w.stopped, w.last_beat) == (False, 0.0)


def test_worker_measured_free_device_memory_from_the_report():
    def measured(load):
        return parse_worker("w1", json.dumps(RECORD).encode(), load, False).device_room_bytes

    assert measured(b'{"device_room_bytes": 3221225472}') == 3 << 30
    assert measured(b'{"device_room_bytes": 0}') == 0
    # not measured (no NVML, an older worker, no report yet): placement goes by capacity alone
    for load in (b'{"last_beat": 1.0}', b'{"device_room_bytes": null}', None):
        assert measured(load) is None


@pytest.mark.parametrize(
    ("change", "load", "message"),
    [
        ({"grpc": None}, None, "/mcp/workers/w1: grpc: expected a non-empty string"),
        ({"zmq": ""}, None, "zmq: expected a non-empty string"),
        ({"memory_capacity_bytes": -1}, None, "memory_capacity_bytes: must be >= 0"),
        ({"memory_capacity_bytes": "8G"}, None, "memory_capacity_bytes: expected an integer"),
        ({"labels": {"gpu": 1}}, None, "labels.gpu: expected a string"),
        ({"worker_id": "w2"}, None, 'worker_id: names "w2"'),
        ({}, {"stopped": 1}, "/mcp/workers/w1/load: stopped: expected the stopped reason"),
        ({}, {"last_beat": "x"}, "/mcp/workers/w1/load: last_beat: expected a finite number"),
        ({}, {"device_room_bytes": -1}, "/mcp/workers/w1/load: device_room_bytes: must be >= 0, got -1"),
        ({}, {"device_room_bytes": 1.5}, "device_room_bytes: expected an integer, got 1.5"),
        ({}, {"device_room_bytes": "8G"}, 'device_room_bytes: expected an integer, got "8G"'),
        ({}, {"device_room_bytes": True}, "device_room_bytes: expected an integer, got true"),
        ({}, {"device_room_bytes": [1]}, "device_room_bytes: expected an integer, got a list"),
    ],
)
def test_worker_errors(change, load, message):
    record = {**RECORD, **change}
    with pytest.raises(InvalidArgument, match=message):
        raw_load = None if load is None else json.dumps(load).encode()
        parse_worker("w1", json.dumps(record).encode(), raw_load, False)


def test_worker_record_missing_field():
    record = {k: v for k, v in RECORD.items() if k != "memory_capacity_bytes"}
    with pytest.raises(InvalidArgument, match="memory_capacity_bytes: required"):
        parse_worker("w1", json.dumps(record).encode(), None, False)


# --- replica records -------------------------------------------------------------------------------------


def test_replica_from_a_lifecycle_record():
    record = ReplicaRecord(
        ReplicaState.RUNNING,
        since=50.0,
        reason="running",
        history=(Transition(ReplicaState.READY, ReplicaState.RUNNING, 50.0, "running"),),
        info={"memory_bytes": 4096, "zmq": "tcp://x"},
    )
    r = parse_replica("demo-mlp", "2", "w1", record.to_json(), 17)
    assert (r.key, r.state, r.since, r.reason, r.revision, r.memory_bytes) == (
        ("demo-mlp", "2", "w1"),
        ReplicaState.RUNNING,
        50.0,
        "running",
        17,
        4096,
    )
    assert parse_replica("m", "1", "w1", b'{"state": "IDLE", "since": 1}', 1).memory_bytes == 0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"state": "BOGUS", "since": 1}', "/mcp/replicas/m/1/w1: state: expected one of IDLE, "),
        (b'{"since": 1}', "/mcp/replicas/m/1/w1: state: required"),
        (b'{"state": "READY", "since": "soon"}', "/mcp/replicas/m/1/w1: since: expected a finite number"),
        (b'{"state": "READY", "since": 1e999}', "since: expected a finite number"),
        (b'{"state": "READY", "since": 1' + b"0" * 400 + b"}", "/mcp/replicas/m/1/w1: since: expected a"),
        (b'{"state": "READY", "since": 1, "transitions": [1]}', "transitions\\[0\\]: expected a JSON object"),
        (b'{"state": "READY", "since": 1, "info": {"memory_bytes": -1}}', "info: memory_bytes: must be >= 0"),
        (
            b'{"state": "READY", "since": 1, "info": {"memory_bytes": "1G"}}',
            "info: memory_bytes: expected an",
        ),
        (b'{"state": "READY", "since": 1, "info": []}', "/mcp/replicas/m/1/w1: info: expected an object"),
    ],
)
def test_replica_errors(raw, message):
    with pytest.raises(InvalidArgument, match=message):
        parse_replica("m", "1", "w1", raw, 1)
