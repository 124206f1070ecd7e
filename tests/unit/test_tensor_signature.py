"""The one input/output check (mcpcore.tensor_signature), which the router and the worker both run."""

from __future__ import annotations

import numpy as np
import pytest

from mcpcore.errors import InvalidArgument
from mcpcore.modelspec import TensorSpec
from mcpcore.tensor_signature import check_inputs, check_outputs

SPECS = (TensorSpec("a", "FP32", (-1, 4)), TensorSpec("input:0", "INT64", (-1,)))


def ok(rows: int = 2) -> dict[str, np.ndarray]:
    return {"a": np.zeros((rows, 4), np.float32), "input:0": np.zeros(rows, np.int64)}


def test_well_formed_inputs_pass_untouched():
    inputs = ok()
    check_inputs("m/1", SPECS, inputs, 8)
    check_inputs("m/1", SPECS, inputs, None)  # the batch bound not known (the router without a config)
    assert inputs["a"].shape == (2, 4)


@pytest.mark.parametrize(
    ("change", "max_batch", "words"),
    [
        (lambda x: x.pop("input:0"), 8, "m/1: expects inputs ['a', 'input:0']: missing ['input:0']"),
        (lambda x: x.update(b=x["a"]), 8, "unexpected ['b']"),
        (lambda x: x.update(a=x["a"].astype(np.float64)), 8, "input a: expected dtype FP32, got FP64"),
        (lambda x: x.update(a=np.zeros((2, 5), np.float32)), 8, "expected shape [-1, 4], got [2, 5]"),
        (lambda x: x.update(a=[[0.0] * 4]), 8, "expected a numpy array, got list"),
        (lambda x: x.update({"input:0": np.zeros(3, np.int64)}), 8, "has batch size 3 but a has 2"),
        (lambda x: None, 1, "input a: batch size 2 is outside 1..1"),
    ],
)
def test_each_fault_is_invalid_argument_naming_the_tensor(change, max_batch, words):
    inputs = ok()
    change(inputs)
    with pytest.raises(InvalidArgument) as info:
        check_inputs("m/1", SPECS, inputs, max_batch)
    assert words in info.value.message


def test_without_a_batch_dimension_rows_are_not_compared():
    check_inputs("m/1", SPECS, {"a": np.zeros((2, 4), np.float32), "input:0": np.zeros(3, np.int64)}, 0)


def test_outputs_asked_for_must_be_declared():
    check_outputs("m/1", SPECS, ["a"])
    with pytest.raises(InvalidArgument, match=r"m/1 has no output\(s\) \['z'\]; it has \['a', 'input:0'\]"):
        check_outputs("m/1", SPECS, ["a", "z"])


def test_a_signature_that_names_an_input_twice_still_refuses_an_input_it_does_not_name():
    twice = [SPECS[0], SPECS[0]]  # a malformed record (the router reads them from etcd): same name twice
    with pytest.raises(InvalidArgument, match=r"unexpected \['b'\]"):
        check_inputs("m/1", twice, {"a": ok()["a"], "b": ok()["a"]}, 8)
