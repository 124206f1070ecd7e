"""The demo repository from ``tools/make_models.py``: deterministic, valid model.yaml files, and the numpy and
onnx backends agreeing on the same MLP (DESIGN §13)."""

from __future__ import annotations

import importlib.util
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from mcp_worker.backends import Backend, create_backend
from mcp_worker.backends.numpy_backend import INJECTED_FAULT
from mcpcore.errors import Unavailable
from mcpcore.keyring import Keyring
from mcpcore.model_encryption import decrypt_file
from mcpcore.model_yaml import load_model_yaml
from mcpcore.modelspec import ModelConfig, TensorSpec

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "make_models.py"
VERSIONS = ("demo-mlp/1", "demo-mlp/2", "demo-onnx/1", "demo-onnx/2", "demo-mlp-enc/1", "demo-slow/1")
# demo-stateful/1 has its own I/O (a counter), checked on its own below


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_models", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_models = _load_script()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models")
    make_models.make_models(out)
    return out


def _load(repo: Path, version: str) -> tuple[ModelConfig, Backend]:
    config = load_model_yaml(repo / version / "model.yaml")
    if config.weights is None:
        return config, create_backend(config, None)
    path = repo / version / config.weights
    if config.encrypted:
        keyring = Keyring.load(repo / make_models.KEYRING)
        weights = decrypt_file(path, keyring=keyring, model=config.name, version=config.version)
    else:
        weights = path.read_bytes()
    return config, create_backend(config, weights)


def _x(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 64)).astype(np.float32)


def test_builds_are_byte_for_byte_identical(repo: Path, tmp_path: Path) -> None:
    digests = make_models.make_models(tmp_path)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert files == sorted(digests)
    assert set(make_models.VARYING_FILES) < set(files)
    for rel in files:
        if rel not in make_models.VARYING_FILES:  # a fresh random GCM nonce per encryption, by design
            assert (tmp_path / rel).read_bytes() == (repo / rel).read_bytes(), rel


def test_every_model_yaml_validates_with_the_demo_names(repo: Path) -> None:
    for version in VERSIONS:
        config = load_model_yaml(repo / version / "model.yaml")
        assert f"{config.name}/{config.version}" == version
        assert config.inputs == (TensorSpec("INPUT0", "FP32", (-1, 64)),)
        assert config.outputs == (
            TensorSpec("OUTPUT0", "FP32", (-1, 16)),
            TensorSpec("RANK0", "FP32", (-1, 8)),
        )
        assert config.idempotent
        assert config.dynamic_batching is not None and config.dynamic_batching.max_queue_size == 1024
        assert config.memory_bytes > 0
    slow = load_model_yaml(repo / "demo-slow/1")
    assert slow.max_batch_size == 8 and slow.layers[0].op == "sleep" and slow.layers[0].ms == 50
    enc = load_model_yaml(repo / "demo-mlp-enc/1")
    assert enc.encrypted and enc.key_id == "demo-key" and enc.weights == "weights.safetensors.enc"
    assert load_model_yaml(repo / "demo-onnx/2").fallback_version == "1"
    assert load_model_yaml(repo / "demo-mlp/1").qos.secondary_features == ("RANK0",)
    stateful = load_model_yaml(repo / "demo-stateful/1")
    assert not stateful.idempotent and stateful.outputs == (TensorSpec("COUNT", "FP32", (-1, 1)),)


def test_demo_stateful_counts_every_row_it_runs(repo: Path) -> None:
    """Its output numbers the rows its worker ran: a request run twice gets numbers nobody else has."""
    _, counter = _load(repo, "demo-stateful/1")
    first = counter.infer({"INPUT0": _x(3)})["COUNT"]
    second = counter.infer({"INPUT0": _x(2)})["COUNT"]
    assert first.ravel().tolist() == [1, 2, 3] and second.ravel().tolist() == [4, 5]


@pytest.mark.parametrize("version", ["1", "2"])
def test_numpy_and_onnx_agree(repo: Path, version: str) -> None:
    _, mlp = _load(repo, f"demo-mlp/{version}")
    _, onnx = _load(repo, f"demo-onnx/{version}")
    for batch in (1, 7, 64):
        x = _x(batch, seed=batch)
        got_numpy, got_onnx = mlp.infer({"INPUT0": x}), onnx.infer({"INPUT0": x})
        assert got_numpy["OUTPUT0"].shape == (batch, 16) and got_numpy["OUTPUT0"].dtype == np.float32
        assert got_numpy["RANK0"].shape == (batch, 8)
        np.testing.assert_allclose(got_numpy["RANK0"].sum(axis=1), 1.0, rtol=1e-5)  # a softmax head
        for name in ("OUTPUT0", "RANK0"):
            np.testing.assert_allclose(got_onnx[name], got_numpy[name], rtol=1e-5, atol=1e-5)
        # breaker level 2: both backends skip the secondary head and keep the primary output as it was
        for backend in (mlp, onnx):
            primary = backend.infer({"INPUT0": x}, skip=frozenset({"RANK0"}))
            assert list(primary) == ["OUTPUT0"]
            np.testing.assert_allclose(primary["OUTPUT0"], got_numpy["OUTPUT0"], rtol=1e-5, atol=1e-5)


def test_skipping_the_secondary_head_skips_its_work(repo: Path) -> None:
    """The layer graph reports the multiply-accumulates it did: level 2 leaves out the ranking head's."""
    _, mlp = _load(repo, "demo-mlp/1")
    work: list[int] = []
    mlp.on_work = work.append  # type: ignore[attr-defined]
    mlp.infer({"INPUT0": _x(4)})
    mlp.infer({"INPUT0": _x(4)}, skip=frozenset({"RANK0"}))
    full, primary = work
    assert primary == 4 * (64 * 256 + 256 * 16)  # fc1, fc2
    assert full == primary + 4 * (256 * 64 + 64 * 8)  # + rank1, rank2


def test_versions_differ_and_memory_is_measured(repo: Path) -> None:
    x = _x(7)
    outs = {}
    for version in ("demo-mlp/1", "demo-mlp/2", "demo-onnx/1"):
        config, backend = _load(repo, version)
        backend.warmup()
        assert 0 < backend.memory_bytes <= config.memory_bytes
        outs[version] = backend.infer({"INPUT0": x})["OUTPUT0"]
        backend.close()
    assert np.abs(outs["demo-mlp/1"] - outs["demo-mlp/2"]).max() > 0.1
    assert np.abs(outs["demo-onnx/1"] - outs["demo-mlp/2"]).max() > 0.1


def test_slow_and_encrypted_copies_compute_demo_mlp_1(repo: Path) -> None:
    x = _x(8)
    want = _load(repo, "demo-mlp/1")[1].infer({"INPUT0": x})["OUTPUT0"]
    _, slow = _load(repo, "demo-slow/1")
    start = time.perf_counter()
    got = slow.infer({"INPUT0": x})["OUTPUT0"]
    assert time.perf_counter() - start >= 0.05
    np.testing.assert_array_equal(got, want)
    _, enc = _load(repo, "demo-mlp-enc/1")
    np.testing.assert_array_equal(enc.infer({"INPUT0": x})["OUTPUT0"], want)


def test_keyring_is_private_and_holds_the_demo_key(repo: Path) -> None:
    path = repo / make_models.KEYRING
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Keyring.load(path).get(make_models.DEMO_KEY_ID) == make_models.demo_key()


def test_existing_models_need_force_and_other_files_survive(tmp_path: Path) -> None:
    make_models.make_models(tmp_path)
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "keep.txt").write_text("mine")
    (tmp_path / "demo-mlp" / "3").mkdir()
    with pytest.raises(FileExistsError, match="--force"):
        make_models.make_models(tmp_path)
    make_models.make_models(tmp_path, force=True)
    assert (tmp_path / "my-model" / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "demo-mlp" / "3").exists()


def test_cli(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "demo-onnx/1/model.onnx" in run.stdout
    again = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert again.returncode == 1 and "--force" in again.stderr


def test_demo_flaky_fails_the_share_its_ratio_file_asks_for(repo: Path, tmp_path: Path) -> None:
    """demo-flaky/1 is demo-mlp/1 behind a ``fail`` layer: no faults until its ratio file says so (read
    again when it changes), then exactly that share of batches fail with the fixed message; version 2 is
    demo-mlp/2 with no fault layer, its static fallback."""
    config, flaky = _load(repo, "demo-flaky/1")
    _, mlp = _load(repo, "demo-mlp/1")
    assert config.fallback_version == "2" and config.idempotent
    x = _x(2)
    assert flaky.fault_directory is None  # unbound (the worker binds it after the warm-up): no faults
    flaky.fault_directory = tmp_path
    np.testing.assert_array_equal(flaky.infer({"INPUT0": x})["OUTPUT0"], mlp.infer({"INPUT0": x})["OUTPUT0"])
    ratio = tmp_path / make_models.FAULT_RATIO_FILE
    for share, failures in (("0.5", 10), ("1", 20), ("0.25", 5), ("0", 0)):
        ratio.write_text(share)
        failed = 0
        for _ in range(20):
            try:
                flaky.infer({"INPUT0": x})
            except Unavailable as err:
                assert err.message.startswith(INJECTED_FAULT), err.message
                failed += 1
        assert failed == failures, (share, failed)
    fallback = load_model_yaml(repo / "demo-flaky/2")
    assert not any(layer.op == "fail" for layer in fallback.layers)
    _, v2 = _load(repo, "demo-flaky/2")
    _, mlp2 = _load(repo, "demo-mlp/2")
    np.testing.assert_array_equal(v2.infer({"INPUT0": x})["OUTPUT0"], mlp2.infer({"INPUT0": x})["OUTPUT0"])
