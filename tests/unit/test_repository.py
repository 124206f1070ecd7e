"""mcp_worker.repository: listing in numeric order, loading plain and encrypted weights, and the errors for
missing files, missing or wrong keys, oversized weights and names that try to leave the repository."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mcp_worker.repository import ModelArtifact, ModelRepository
from mcpcore.errors import (
    DataLoss,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from mcpcore.keyring import Keyring
from mcpcore.model_encryption import encrypt_model_bytes

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
WEIGHTS = b"not really safetensors, any bytes will do" * 10


def _yaml(**extra: object) -> str:
    doc: dict[str, object] = {
        "backend": "numpy",
        "max_batch_size": 8,
        "inputs": [{"name": "INPUT0", "dtype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "OUTPUT0", "dtype": "FP32", "shape": [-1, 2]}],
        "weights": "weights.safetensors",
        "layers": [{"op": "dense", "in": 4, "out": 2, "weight": "fc.weight", "bias": "fc.bias"}],
    }
    doc.update(extra)
    return yaml.safe_dump(doc, sort_keys=False)


def _add(root: Path, model: str, version: str, files: dict[str, bytes], **extra: object) -> Path:
    d = root / model / version
    d.mkdir(parents=True)
    (d / "model.yaml").write_text(_yaml(**extra))
    for name, data in files.items():
        (d / name).write_bytes(data)
    return d


def _add_encrypted(root: Path, model: str, version: str, *, key: bytes = KEY, key_id: str = "k1") -> Path:
    blob = encrypt_model_bytes(WEIGHTS, key=key, key_id=key_id, model=model, version=version)
    return _add(
        root,
        model,
        version,
        {"weights.safetensors.enc": blob},
        weights="weights.safetensors.enc",
        encrypted=True,
        key_id=key_id,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for v in ("1", "2", "10"):
        _add(tmp_path, "mlp", v, {"weights.safetensors": WEIGHTS})
    _add_encrypted(tmp_path, "mlp-enc", "1")
    (tmp_path / "mlp" / "3").mkdir()  # no model.yaml yet: not a version
    (tmp_path / "mlp" / "latest").mkdir()  # not a version name
    (tmp_path / ".hidden" / "1").mkdir(parents=True)  # not a model name
    (tmp_path / "README.md").write_text("not a model")
    (tmp_path / "empty").mkdir()
    return tmp_path


def test_index_lists_models_with_numerically_sorted_versions(repo: Path) -> None:
    assert ModelRepository(repo).index() == {"mlp": ["1", "2", "10"], "mlp-enc": ["1"]}


def test_versions_and_latest(repo: Path) -> None:
    r = ModelRepository(repo)
    assert r.versions("mlp") == ["1", "2", "10"]
    assert r.latest("mlp") == "10"
    with pytest.raises(NotFound, match=f"'nope' has no versions in repository {repo}"):
        r.versions("nope")
    with pytest.raises(NotFound):
        r.latest("empty")


def test_missing_repository_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        ModelRepository(tmp_path / "missing").index()


def test_load_plain(repo: Path) -> None:
    art = ModelRepository(repo).load("mlp", "2")
    assert isinstance(art, ModelArtifact)
    assert (art.config.name, art.config.version, art.config.encrypted) == ("mlp", "2", False)
    assert art.weights == WEIGHTS
    assert art.path == repo / "mlp" / "2"
    assert "not really" not in repr(art)


def test_load_without_weights(tmp_path: Path) -> None:
    d = tmp_path / "relu" / "1"
    d.mkdir(parents=True)
    doc = yaml.safe_load(_yaml(layers=[{"op": "relu"}]))
    del doc["weights"]
    doc["outputs"][0]["shape"] = [-1, 4]
    (d / "model.yaml").write_text(yaml.safe_dump(doc))
    art = ModelRepository(tmp_path).load("relu", "1")
    assert art.weights is None and art.config.weights is None


def test_load_encrypted_with_the_right_keyring(repo: Path) -> None:
    art = ModelRepository(repo, Keyring.from_keys({"k1": KEY})).load("mlp-enc", "1")
    assert art.config.encrypted and art.config.key_id == "k1"
    assert art.weights == WEIGHTS


def test_encrypted_without_keyring_is_permission_denied(repo: Path) -> None:
    with pytest.raises(PermissionDenied, match="no keyring configured"):
        ModelRepository(repo).load("mlp-enc", "1")


def test_encrypted_with_another_key_or_missing_key_id(repo: Path) -> None:
    with pytest.raises(PermissionDenied, match="different key than keyring key 'k1'"):
        ModelRepository(repo, Keyring.from_keys({"k1": OTHER})).load("mlp-enc", "1")
    with pytest.raises(PermissionDenied, match="key id 'k1' is not in keyring"):
        ModelRepository(repo, Keyring.from_keys({"k2": KEY})).load("mlp-enc", "1")


def test_header_key_id_must_match_model_yaml(tmp_path: Path) -> None:
    d = _add_encrypted(tmp_path, "m", "1", key_id="k2")
    text = (d / "model.yaml").read_text().replace("key_id: k2", "key_id: k1")
    (d / "model.yaml").write_text(text)
    ring = Keyring.from_keys({"k1": KEY, "k2": KEY})
    with pytest.raises(PermissionDenied, match=r"key id 'k2' but model\.yaml declares key_id 'k1'"):
        ModelRepository(tmp_path, ring).load("m", "1")


def test_encrypted_file_copied_to_another_version_is_data_loss(tmp_path: Path) -> None:
    _add_encrypted(tmp_path, "m", "1")
    v2 = _add_encrypted(tmp_path, "m", "2")
    (v2 / "weights.safetensors.enc").write_bytes((tmp_path / "m/1/weights.safetensors.enc").read_bytes())
    ring = Keyring.from_keys({"k1": KEY})
    assert ModelRepository(tmp_path, ring).load("m", "1").weights == WEIGHTS
    with pytest.raises(DataLoss, match=r"m/2 \(.*\) failed authentication"):
        ModelRepository(tmp_path, ring).load("m", "2")


def test_encrypted_file_declared_plain_is_rejected(tmp_path: Path) -> None:
    blob = encrypt_model_bytes(WEIGHTS, key=KEY, key_id="k1", model="m", version="1")
    _add(tmp_path, "m", "1", {"weights.safetensors": blob})
    with pytest.raises(InvalidArgument, match="encrypted file"):
        ModelRepository(tmp_path).load("m", "1")


@pytest.mark.parametrize(
    ("model", "version"),
    [
        ("..", "1"),
        ("mlp/../mlp", "1"),
        ("/etc", "1"),
        ("mlp", "../1"),
        ("mlp", "1/.."),
        ("mlp", "0"),
        ("", "1"),
    ],
)
def test_traversal_names_are_invalid(repo: Path, model: str, version: str) -> None:
    r = ModelRepository(repo)
    with pytest.raises(InvalidArgument):
        r.load(model, version)
    if version == "1":
        with pytest.raises(InvalidArgument):
            r.versions(model)


def test_missing_model_version_and_weights(repo: Path) -> None:
    r = ModelRepository(repo)
    with pytest.raises(NotFound, match="model nope/1 is not in repository"):
        r.load("nope", "1")
    with pytest.raises(NotFound, match="mlp/3"):
        r.load("mlp", "3")  # a directory without model.yaml
    (repo / "mlp" / "2" / "weights.safetensors").unlink()
    with pytest.raises(NotFound, match=r"weights file not found: .*mlp/2/weights\.safetensors"):
        r.load("mlp", "2")


def test_weights_over_the_limit_are_resource_exhausted(repo: Path) -> None:
    with pytest.raises(ResourceExhausted, match=f"{len(WEIGHTS)} bytes, over this worker's limit of 100"):
        ModelRepository(repo, max_weights_bytes=100).load("mlp", "1")
    assert ModelRepository(repo, max_weights_bytes=len(WEIGHTS)).load("mlp", "1").weights == WEIGHTS


def test_invalid_model_yaml_is_invalid_argument(repo: Path) -> None:
    (repo / "mlp" / "1" / "model.yaml").write_text("backend: tensorflow\n")
    with pytest.raises(InvalidArgument, match=r"model\.yaml mlp/1"):
        ModelRepository(repo).load("mlp", "1")
