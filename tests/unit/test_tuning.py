"""``mcpcore.tuning``: the defaults follow the core count (given, not read: ``Tuning.for_cores``), every
knob is a setting like any other (YAML, env, flags, ``MCP_BATCH_HELPER_THREADS``), and ``after_start``
applies them (in a fresh interpreter, so this process's collector is left alone)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mcp_router.config import RouterConfig
from mcpcore.config import load_config
from mcpcore.errors import InvalidArgument
from mcpcore.tuning import PYTHON_SWITCH_INTERVAL_S, Tuning, available_cores, tune_allocator

PREFIX = "MCP_ROUTER_"


@pytest.mark.parametrize("cores", [1, 2, 4, 64])
def test_every_core_count_hands_the_gil_over_sooner_and_batches_the_helpers(cores):
    """Measured on a 1-core and a 2-core view, the same choices win (docs/design/process-tuning.md)."""
    tuning = Tuning.for_cores(cores)
    assert tuning.switch_interval_s == 0.001 < PYTHON_SWITCH_INTERVAL_S
    assert tuning.batch_helper_threads


@pytest.mark.parametrize("cores", [1, 2, 64])
def test_the_core_independent_knobs_are_the_same_for_any_count(cores):
    tuning = Tuning.for_cores(cores)
    assert tuning.gc_freeze and tuning.gc_young_objects == 20_000
    assert (tuning.heap_mmap_threshold_bytes, tuning.heap_trim_threshold_bytes) == (32 << 20, 256 << 20)


def test_no_cores_is_a_bug():
    with pytest.raises(ValueError, match="cores"):
        Tuning.for_cores(0)


def test_a_service_config_defaults_to_this_processs_cores():
    cores = available_cores()
    assert cores >= 1
    assert load_config(RouterConfig, env={}, env_prefix=PREFIX).process.tuning == Tuning.for_cores(cores)


def test_every_knob_from_yaml_env_and_flags(tmp_path: Path):
    yaml_path = tmp_path / "router.yaml"
    yaml_path.write_text("tuning:\n  gc_young_objects: 700\n  heap_trim_threshold_bytes: 0\n")
    env = {f"{PREFIX}TUNING__GC_FREEZE": "false", f"{PREFIX}TUNING__HEAP_MMAP_THRESHOLD_BYTES": "0"}
    overrides = {"tuning.switch_interval_s": "2ms", "tuning.batch_helper_threads": False}
    cfg = load_config(RouterConfig, yaml_path=yaml_path, env=env, env_prefix=PREFIX, overrides=overrides)
    assert cfg.process.tuning == Tuning(
        gc_freeze=False,
        gc_young_objects=700,
        switch_interval_s=0.002,
        heap_mmap_threshold_bytes=0,
        heap_trim_threshold_bytes=0,
        batch_helper_threads=False,
    )


def test_a_knob_not_set_keeps_its_core_count_default():
    cfg = load_config(RouterConfig, env={f"{PREFIX}TUNING__GC_FREEZE": "0"}, env_prefix=PREFIX)
    assert cfg.process.tuning == replace(Tuning.for_this_process(), gc_freeze=False)


def test_mcp_batch_helper_threads_is_read_below_the_services_own_variable():
    def batched(**env: str) -> bool:
        return load_config(RouterConfig, env=env, env_prefix=PREFIX).process.tuning.batch_helper_threads

    assert not batched(MCP_BATCH_HELPER_THREADS="0")
    assert batched(MCP_BATCH_HELPER_THREADS="1")
    assert batched(MCP_BATCH_HELPER_THREADS="0", MCP_ROUTER_TUNING__BATCH_HELPER_THREADS="1")
    with pytest.raises(InvalidArgument, match="MCP_BATCH_HELPER_THREADS: not a boolean"):
        batched(MCP_BATCH_HELPER_THREADS="maybe")


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("GC_YOUNG_OBJECTS", "-1", "tuning.gc_young_objects: must be >= 0"),
        ("SWITCH_INTERVAL_S", "0", "tuning.switch_interval_s: must be in (0, 1] s"),
        ("HEAP_MMAP_THRESHOLD_BYTES", str(64 << 20), "tuning.heap_mmap_threshold_bytes: must be within"),
        ("HEAP_TRIM_THRESHOLD_BYTES", "-1", "tuning.heap_trim_threshold_bytes: must be >= 0"),
    ],
)
def test_bad_knobs_are_refused_with_their_name(name, value, needle):
    with pytest.raises(InvalidArgument) as exc:
        load_config(RouterConfig, env={f"{PREFIX}TUNING__{name}": value}, env_prefix=PREFIX)
    assert needle in exc.value.message


APPLY = """
import gc, json, sys
from mcpcore.tuning import Tuning, after_start
after_start(Tuning(**json.loads(sys.argv[1])))
print(json.dumps({"young": gc.get_threshold()[0], "frozen": gc.get_freeze_count(),
                  "switch": sys.getswitchinterval()}))
"""


def _applied(tuning: Tuning) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", APPLY, json.dumps(tuning.__dict__)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_after_start_applies_the_knobs():
    on = _applied(Tuning.for_cores(2))
    assert on["young"] == 20_000 and on["frozen"] > 0 and on["switch"] == pytest.approx(0.001)
    off = _applied(
        replace(
            Tuning.for_cores(1),
            gc_freeze=False,
            gc_young_objects=0,
            switch_interval_s=PYTHON_SWITCH_INTERVAL_S,
        )
    )
    assert (
        off["young"] == 700
        and off["frozen"] == 0
        and off["switch"] == pytest.approx(PYTHON_SWITCH_INTERVAL_S)
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_the_allocator_takes_the_thresholds():
    assert tune_allocator(Tuning.for_cores(2))  # glibc takes them (it answers 0 to a value it refuses)
