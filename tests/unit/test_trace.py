"""Triton's request tracing (mcp_router.trace): the settings, the sampling, and the trace files."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest

from mcp_router import trace as trace_module
from mcp_router.trace import Tracer
from mcpcore.errors import InvalidArgument

DEFAULTS = {
    "trace_file": [""], "trace_level": ["OFF"], "trace_rate": ["1000"], "trace_count": ["-1"],
    "log_frequency": ["0"], "trace_mode": ["triton"],
}  # fmt: skip


@pytest.fixture
def tracer():
    ticks = itertools.count(1_000, 10)
    return Tracer(clock_ns=lambda: next(ticks))


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "trace.json")


def on(tracer, path, **more):
    """Tracing at TIMESTAMPS to ``path``, every request unless ``more`` says otherwise."""
    changes = {"trace_file": [path], "trace_level": ["TIMESTAMPS"], "trace_rate": ["1"]}
    tracer.update({**changes, **{k: [v] for k, v in more.items()}})


def run(tracer, n, model="m"):
    """``n`` requests to ``model``, each traced request marked and finished; returns the trace ids."""
    ids = []
    for i in range(n):
        trace = tracer.start(model, "1", f"r{i}")
        if trace is not None:
            trace.mark("REQUEST_START")
            trace.finish()
            ids.append(trace.id)
    return ids


def load(file):
    with open(file, encoding="utf-8") as f:
        return json.load(f)


def ids_in(records):
    return sorted({r["id"] for r in records})


def test_defaults_are_tritons(tracer):
    assert tracer.settings() == DEFAULTS
    assert tracer.settings("m") == DEFAULTS
    assert tracer.start("m", "1", "r") is None


def test_a_model_overrides_key_by_key_and_clearing_brings_the_global_back(tracer, path):
    on(tracer, path, trace_rate="10")
    after = tracer.update({"trace_rate": ["2"], "trace_level": ["TIMESTAMPS", "TENSORS"]}, model="m")
    assert after == {**tracer.settings(), "trace_rate": ["2"], "trace_level": ["TIMESTAMPS", "TENSORS"]}
    tracer.update({"trace_count": ["7"], "trace_rate": ["5"]})  # the model inherits count, keeps rate
    assert tracer.settings("m")["trace_count"] == ["7"]
    assert tracer.settings("m")["trace_rate"] == ["2"]
    assert tracer.settings("other") == tracer.settings()
    tracer.update({"trace_rate": None, "trace_level": []}, model="m")
    assert tracer.settings("m") == tracer.settings()
    assert tracer.update({"trace_rate": None, "trace_count": None})["trace_rate"] == ["1000"]
    assert tracer.settings()["trace_count"] == ["-1"]


def test_a_bare_string_is_one_value(tracer, path):
    after = tracer.update({"trace_file": path, "trace_level": ["TIMESTAMPS"], "trace_rate": "3"})
    assert after["trace_rate"] == ["3"]
    assert after["trace_file"] == [path]


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"trace_colour": ["red"]}, "unknown trace setting 'trace_colour'"),
        ({"trace_rate": ["often"]}, "trace_rate must be a whole number >= 1"),
        ({"trace_rate": ["0"]}, "trace_rate must be a whole number >= 1"),
        ({"trace_rate": ["2", "3"]}, "takes one value"),
        ({"trace_rate": [4]}, "takes a list of strings"),
        ({"trace_count": ["-2"]}, r"trace_count must be -1 \(no limit\)"),
        ({"log_frequency": ["-1"]}, "log_frequency must be a whole number >= 0"),
        ({"trace_level": ["LOUD"]}, "unknown trace_level 'LOUD'"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "OFF stands alone"),
        ({"trace_mode": ["opentelemetry"]}, "triton mode only"),
        ({"trace_file": ["DIR"]}, "is a directory"),
        ({"trace_file": ["DIR/missing/trace.json"]}, "does not exist"),
        ({"trace_file": [""]}, "set trace_file"),
    ],
)
def test_a_bad_change_is_refused_and_nothing_moves(tracer, tmp_path, path, changes, words):
    on(tracer, path, trace_rate="10")
    tracer.update({"trace_rate": ["2"]}, model="m")
    before = (tracer.settings(), tracer.settings("m"))
    changes = {k: [str(v).replace("DIR", str(tmp_path)) if k == "trace_file" else v for v in vs]
               for k, vs in changes.items()}  # fmt: skip
    for model in ("", "m"):
        with pytest.raises(InvalidArgument, match=words):
            tracer.update({"trace_count": ["5"], **changes}, model=model)
        assert (tracer.settings(), tracer.settings("m")) == before


def test_tracing_without_a_file_is_refused(tracer, path):
    with pytest.raises(InvalidArgument, match="set trace_file"):
        tracer.update({"trace_level": ["TIMESTAMPS"]})
    assert tracer.settings() == DEFAULTS
    tracer.update({"trace_file": [path]})
    tracer.update({"trace_level": ["TIMESTAMPS"]}, model="m")  # the model inherits the file
    with pytest.raises(InvalidArgument, match=r"model 'm' \(inheriting this change\) would trace"):
        tracer.update({"trace_file": [""]})
    assert tracer.settings()["trace_file"] == [path]


def test_every_rate_th_request_is_traced_while_the_count_lasts(tracer, path):
    on(tracer, path, trace_rate="3", trace_count="2")
    sampled = [i for i in range(1, 11) if tracer.start("m", "1", "") is not None]
    assert sampled == [3, 6]
    assert tracer.settings()["trace_count"] == ["0"]
    assert tracer.start("m", "1", "") is None


def test_a_model_samples_on_its_own(tracer, path):
    on(tracer, path, trace_rate="2")
    tracer.update({"trace_rate": ["1"], "trace_count": ["1"]}, model="m")
    assert [tracer.start("m", "1", "") is not None for _ in range(3)] == [True, False, False]
    assert [tracer.start("n", "1", "") is not None for _ in range(4)] == [False, True, False, True]
    assert tracer.settings("m")["trace_count"] == ["0"]
    assert tracer.settings()["trace_count"] == ["-1"]


def test_level_off_starts_nothing(tracer, path):
    on(tracer, path)
    assert tracer.start("m", "1", "") is not None
    tracer.update({"trace_level": ["OFF"]})
    assert all(tracer.start("m", "1", "") is None for _ in range(5))


def test_timestamps_file_is_tritons_json_with_the_marks_in_order(tracer, path):
    on(tracer, path)
    trace = tracer.start("simple", "1", "req-7")
    trace.attribute("worker", "w1")
    for event in ("REQUEST_START", "FORWARD_START", "FORWARD_END", "REQUEST_END"):
        trace.mark(event)
    trace.tensor("INPUT", "INPUT0", np.zeros(2, np.float32))  # not at TIMESTAMPS
    trace.finish()
    trace.finish()  # once only
    tracer.flush()
    assert load(path) == [
        {"id": 1, "model_name": "simple", "model_version": 1, "request_id": "req-7", "worker": "w1"},
        {"id": 1, "timestamps": [{"name": "REQUEST_START", "ns": 1000}]},
        {"id": 1, "timestamps": [{"name": "FORWARD_START", "ns": 1010}]},
        {"id": 1, "timestamps": [{"name": "FORWARD_END", "ns": 1020}]},
        {"id": 1, "timestamps": [{"name": "REQUEST_END", "ns": 1030}]},
    ]


def test_tensors_are_recorded_at_level_tensors(tracer, path):
    tracer.update({"trace_file": [path], "trace_level": ["TENSORS"], "trace_rate": ["1"]})
    trace = tracer.start("simple", "", "")
    trace.mark("REQUEST_START")  # not at TENSORS alone
    array = np.array([[0.5, 1.25, -2.0]], np.float32)
    trace.tensor("INPUT", "INPUT0", array)
    array[0, 0] = 9.0  # recorded when given, not when written
    trace.tensor("OUTPUT", "OUTPUT0", np.array([b"a", b'b"c'], dtype=object))
    trace.tensor("OUTPUT", "FLAGS", np.array([True, False]))
    trace.finish()
    tracer.flush()
    head, *tensors = load(path)
    assert head == {"id": 1, "model_name": "simple", "model_version": -1}
    assert tensors == [
        {"id": 1, "activity": "TENSOR_QUEUE_INPUT",
         "tensor": {"name": "INPUT0", "data": "0.5,1.25,-2.0", "shape": "1,3", "dtype": "FP32"}},
        {"id": 1, "activity": "TENSOR_BACKEND_OUTPUT",
         "tensor": {"name": "OUTPUT0", "data": '"a","b""c"', "shape": "2", "dtype": "BYTES"}},
        {"id": 1, "activity": "TENSOR_BACKEND_OUTPUT",
         "tensor": {"name": "FLAGS", "data": "1,0", "shape": "2", "dtype": "BOOL"}},
    ]  # fmt: skip
    data = tensors[0]["tensor"]  # read back as Triton's trace_summary.py does
    np.testing.assert_array_equal(
        np.array(list(map(float, data["data"].split(","))), np.float32).reshape(1, 3), [[0.5, 1.25, -2.0]]
    )
    with pytest.raises(ValueError, match="tensor kind 'SIDEWAYS'"):
        trace.tensor("SIDEWAYS", "x", array)


def test_a_large_tensor_is_recorded_without_its_data(tracer, path, monkeypatch):
    monkeypatch.setattr(trace_module, "MAX_TENSOR_ELEMENTS", 4)
    tracer.update({"trace_file": [path], "trace_level": ["TENSORS"], "trace_rate": ["1"]})
    trace = tracer.start("m", "1", "")
    trace.tensor("INPUT", "INPUT0", np.zeros((2, 3), np.int64))
    trace.finish()
    tracer.flush()
    assert load(path)[1]["tensor"] == {
        "name": "INPUT0", "data": "", "shape": "2,3", "dtype": "INT64", "data_left_out": 6
    }  # fmt: skip


def test_a_change_that_changes_nothing_leaves_the_sampling_alone(tracer, path):
    on(tracer, path, trace_rate="2")
    assert tracer.start("m", "1", "") is None
    assert tracer.update({"trace_mode": ["triton"]}) == tracer.update({})
    assert tracer.start("m", "1", "") is not None  # the 2nd request since the rate was set
    tracer.update({"trace_rate": ["2"]})  # a real update starts the count again, as in Triton
    assert tracer.start("m", "1", "") is None


def test_log_frequency_splits_the_traces_into_numbered_files(tracer, path):
    on(tracer, path, log_frequency="2")
    assert run(tracer, 5) == [1, 2, 3, 4, 5]
    assert ids_in(load(f"{path}.0")) == [1, 2]
    assert ids_in(load(f"{path}.1")) == [3, 4]
    tracer.flush()
    assert ids_in(load(f"{path}.2")) == [5]
    assert not os.path.exists(path)


def test_flush_writes_what_is_pending_and_the_file_stays_valid_json(tracer, path, tmp_path):
    on(tracer, path)
    run(tracer, 2)
    assert not (tmp_path / "trace.json").exists()
    tracer.flush()
    assert ids_in(load(path)) == [1, 2]
    run(tracer, 1)
    tracer.flush()
    assert ids_in(load(path)) == [1, 2, 3]
    tracer.flush()  # nothing pending: nothing written
    assert ids_in(load(path)) == [1, 2, 3]


def test_the_buffer_is_bounded(tracer, path, monkeypatch):
    monkeypatch.setattr(trace_module, "MAX_PENDING_TRACES", 3)
    on(tracer, path)
    run(tracer, 3)
    assert ids_in(load(path)) == [1, 2, 3]


def test_a_spent_count_writes_its_traces_to_a_numbered_file(tracer, path):
    on(tracer, path, trace_count="2")
    first, second = tracer.start("m", "1", ""), tracer.start("m", "1", "")
    first.finish()
    with pytest.raises(FileNotFoundError):
        load(f"{path}.0")
    second.finish()
    assert ids_in(load(f"{path}.0")) == [1, 2]


def test_a_trace_running_across_an_update_goes_to_the_file_it_started_with(tracer, path, tmp_path):
    on(tracer, path)
    running = tracer.start("m", "1", "")
    run(tracer, 1)  # id 2, buffered
    elsewhere = str(tmp_path / "other.json")
    tracer.update({"trace_file": [elsewhere]})
    assert not os.path.exists(path)  # the replaced setting writes when its last trace is done
    running.mark("REQUEST_END")
    running.finish()
    assert ids_in(load(path)) == [1, 2]
    run(tracer, 1)
    tracer.flush()
    assert ids_in(load(elsewhere)) == [3]


def test_a_failed_write_is_logged_and_counted_not_raised(tracer, tmp_path, caplog):
    folder = tmp_path / "gone"
    folder.mkdir()
    on(tracer, str(folder / "trace.json"))
    run(tracer, 2)
    folder.rmdir()
    tracer.flush()
    assert tracer.dropped == 2
    assert "could not write 2 traces" in caplog.text


def test_reserved_attributes_are_refused(tracer, path):
    on(tracer, path)
    with pytest.raises(ValueError, match="'model_name' is one of Triton's own fields"):
        tracer.start("m", "1", "").attribute("model_name", "x")
