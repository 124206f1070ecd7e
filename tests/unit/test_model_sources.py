"""Remote model repositories at the ``ModelRepository`` level, against real servers: the published demo
repository over HTTP (``http.server`` in a thread) and in S3 (moto's server), the content-addressed cache
(one download, eviction, atomic writes), manifest checks in folders, and the errors a person acts on:
tampered files, 404s, an unreachable server, refused access, hostile manifests.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import make_demo_repository
from repo_servers import S3_ENV, RepoHTTPServer, S3Server, env_vars

from mcp_worker.repository import ModelRepository
from mcp_worker.repository import main as repository_main
from mcp_worker.repository.cache import ContentCache
from mcp_worker.repository.manifest import INDEX, MANIFEST, check, parse_manifest, publish
from mcpcore.errors import (
    DataLoss,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from mcpcore.keyring import Keyring
from mcpcore.model_encryption import MAGIC

W1 = "demo-mlp/1/weights.safetensors"
W2 = "demo-mlp/2/weights.safetensors"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo repository as make_models writes it (manifests and index included); never modified."""
    return make_demo_repository(tmp_path_factory.mktemp("demo") / "models")


@pytest.fixture
def served(demo: Path, tmp_path: Path) -> Iterator[tuple[RepoHTTPServer, Path]]:
    """A copy of the demo repository served at ``<server>/models/`` (the copy may be tampered with)."""
    root = tmp_path / "www"
    shutil.copytree(demo, root / "models")
    with RepoHTTPServer(root) as server:
        yield server, root / "models"


def _repo(url: str, tmp_path: Path, **kw: object) -> ModelRepository:
    keyring = (
        Keyring.load(tmp_path / "www" / "models" / "keyring.json") if (tmp_path / "www").exists() else None
    )
    return ModelRepository(url, keyring, cache_dir=tmp_path / "cache", **kw)  # type: ignore[arg-type]


def _cached_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "sha256").glob("*"))


# --- HTTP ---------------------------------------------------------------------------------------------------


def test_http_lists_and_loads_plain_and_encrypted_models(served, tmp_path: Path) -> None:
    server, folder = served
    repo = _repo(server.url + "models", tmp_path)
    assert repo.index() == ModelRepository(folder).index()
    assert repo.versions("demo-mlp") == ["1", "2"] and repo.latest("demo-onnx") == "2"
    art = repo.load("demo-mlp", "1")
    assert art.weights == (folder / W1).read_bytes()
    assert (art.config.name, art.config.version, art.path) == ("demo-mlp", "1", None)
    enc = repo.load("demo-mlp-enc", "1")
    assert enc.weights == (folder / W1).read_bytes()  # demo-mlp-enc/1 is demo-mlp/1, encrypted
    # the cache holds the repository's bytes: the encrypted file stays encrypted there
    blob = (folder / "demo-mlp-enc/1/weights.safetensors.enc").read_bytes()
    assert any(p.read_bytes() == blob for p in _cached_files(tmp_path))
    assert all(
        p.read_bytes() != enc.weights for p in _cached_files(tmp_path) if p.read_bytes().startswith(MAGIC)
    )
    assert not list((tmp_path / "cache" / "tmp").iterdir())


def test_second_load_is_served_from_the_cache(served, tmp_path: Path) -> None:
    server, _ = served
    repo = _repo(server.url + "models", tmp_path)
    repo.config("demo-mlp", "1")  # as the worker does: config first, then load
    first = repo.load("demo-mlp", "1")
    second = repo.load("demo-mlp", "1")
    # a new process on the same cache (a restarted worker) downloads nothing either
    third = _repo(server.url + "models", tmp_path).load("demo-mlp", "1")
    assert first.weights == second.weights == third.weights
    assert server.hits["models/" + W1] == 1
    assert server.hits["models/demo-mlp/1/model.yaml"] == 1
    assert server.hits["models/demo-mlp/1/manifest.json"] == 4  # what is current is asked every time


def test_tampered_file_on_the_server_is_data_loss_and_caches_nothing(served, tmp_path: Path) -> None:
    server, folder = served
    repo = _repo(server.url + "models", tmp_path)
    data = bytearray((folder / W2).read_bytes())
    data[len(data) // 2] ^= 0x01
    (folder / W2).write_bytes(bytes(data))
    with pytest.raises(DataLoss) as caught:
        repo.load("demo-mlp", "2")
    message = caught.value.message
    assert message.startswith("model demo-mlp/2: ") and server.url + "models/" + W2 in message
    assert "manifest says" in message and "publish" in message
    (folder / W2).write_bytes(bytes(data) + b"more")  # longer than its manifest says
    with pytest.raises(DataLoss, match=r"larger than the \d+ bytes its manifest says"):
        repo.load("demo-mlp", "2")
    cached = {p.name for p in _cached_files(tmp_path)}
    entry = json.loads((folder / "demo-mlp/2/manifest.json").read_text())["files"]["weights.safetensors"]
    assert entry["sha256"] not in cached and not list((tmp_path / "cache" / "tmp").iterdir())
    assert repo.load("demo-mlp", "1").weights == (folder / W1).read_bytes()  # the rest still loads


def test_transfer_cut_short_leaves_nothing_that_passes_as_good(served, tmp_path: Path) -> None:
    server, folder = served
    server.cut.add("models/" + W1)
    repo = _repo(server.url + "models", tmp_path)
    with pytest.raises(Unavailable, match=f"{W1}: the transfer failed"):
        repo.load("demo-mlp", "1")
    assert [p.name for p in _cached_files(tmp_path)] == [
        json.loads((folder / "demo-mlp/1/manifest.json").read_text())["files"]["model.yaml"]["sha256"]
    ]
    assert not list((tmp_path / "cache" / "tmp").iterdir())
    server.cut.clear()
    assert repo.load("demo-mlp", "1").weights == (folder / W1).read_bytes()


def test_cached_copy_damaged_on_disk_is_downloaded_again(served, tmp_path: Path) -> None:
    server, folder = served
    repo = _repo(server.url + "models", tmp_path)
    repo.load("demo-mlp", "1")
    digest = json.loads((folder / "demo-mlp/1/manifest.json").read_text())["files"]["weights.safetensors"][
        "sha256"
    ]
    cached = tmp_path / "cache" / "sha256" / digest
    damaged = bytearray(cached.read_bytes())
    damaged[0] ^= 0xFF
    cached.write_bytes(bytes(damaged))
    assert repo.load("demo-mlp", "1").weights == (folder / W1).read_bytes()
    assert server.hits["models/" + W1] == 2


def test_missing_version_file_and_server_are_clear_errors(served, tmp_path: Path) -> None:
    server, folder = served
    repo = _repo(server.url + "models", tmp_path)
    with pytest.raises(NotFound, match=r"model demo-mlp/9 is not in repository .*HTTP 404.*publish"):
        repo.config("demo-mlp", "9")
    with pytest.raises(NotFound, match="has no versions"):
        repo.versions("nope")
    (folder / W2).unlink()  # listed in the manifest, gone from the server
    with pytest.raises(NotFound, match=f"model demo-mlp/2: {server.url}models/{W2}: HTTP 404"):
        repo.load("demo-mlp", "2")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = _repo(f"http://127.0.0.1:{port}/models/", tmp_path)
    with pytest.raises(
        Unavailable, match=rf"127\.0\.0\.1:{port}/models/demo-mlp/1/manifest\.json: cannot reach"
    ):
        down.load("demo-mlp", "1")
    with pytest.raises(Unavailable, match="cannot reach"):
        down.index()


def test_credentials_in_the_url_are_sent_and_never_shown(served, tmp_path: Path, caplog) -> None:
    server, _ = served
    server.auth = ("reader", "s3cr3t-pass")
    caplog.set_level(logging.DEBUG)
    repo = _repo(server.url.replace("http://", "http://reader:s3cr3t-pass@") + "models", tmp_path)
    assert repo.load("demo-mlp", "1").weights
    assert "s3cr3t" not in repr(repo) and "s3cr3t" not in repo.location
    wrong = _repo(server.url.replace("http://", "http://reader:wrong-pass@") + "models", tmp_path / "other")
    with pytest.raises(PermissionDenied, match="HTTP 401") as caught:
        wrong.load("demo-mlp", "2")
    assert "wrong-pass" not in caught.value.message and "reader" not in caught.value.message
    assert "s3cr3t" not in caplog.text and "wrong-pass" not in caplog.text


def test_cache_evicts_least_recently_used_beyond_its_limit(served, tmp_path: Path) -> None:
    server, folder = served
    w1, w2 = (folder / W1).stat().st_size, (folder / W2).stat().st_size
    limit = w1 + w2 + 1000  # both weights do not fit with two model.yaml files (~1.4 KiB each)
    repo = _repo(server.url + "models", tmp_path, cache_bytes=limit)
    repo.load("demo-mlp", "1")
    repo.load("demo-mlp", "2")
    cache = repo.cache
    assert cache is not None and cache.total_bytes() <= limit
    names = {p.name for p in _cached_files(tmp_path)}
    manifests = {v: json.loads((folder / f"demo-mlp/{v}/manifest.json").read_text())["files"] for v in "12"}
    assert manifests["2"]["weights.safetensors"]["sha256"] in names
    assert manifests["1"]["model.yaml"]["sha256"] not in names  # the least recently used went first
    repo.load("demo-mlp", "2")
    assert server.hits["models/" + W2] == 1
    # a file larger than the whole cache cannot load, and says which setting to raise
    small = _repo(server.url + "models", tmp_path / "small", cache_bytes=w1 // 2)
    with pytest.raises(ResourceExhausted, match="MCP_WORKER_REPOSITORY_CACHE_BYTES"):
        small.load("demo-mlp", "1")


def test_eviction_never_removes_a_pinned_file(tmp_path: Path) -> None:
    cache = ContentCache(tmp_path / "cache", max_bytes=100)
    blobs = {}
    for i, data in enumerate((b"a" * 60, b"b" * 60)):
        digest = hashlib.sha256(data).hexdigest()
        blobs[i] = digest
        with cache.pinned([digest]):
            cache.get(digest, len(data), lambda d=data: iter([d]), url=f"test://{i}")
            if i == 0:
                with cache.pinned([digest]):
                    assert cache.evict(room=100) == []  # pinned: kept, over the limit or not
    assert not (tmp_path / "cache/sha256" / blobs[0]).exists()  # 120 > 100: the older one went
    assert (tmp_path / "cache/sha256" / blobs[1]).exists()


def _rewrite_manifest(folder: Path, rel: str, change) -> None:  # type: ignore[no-untyped-def]
    path = folder / rel
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda d: d["files"].update({"../../keyring.json": d["files"]["model.yaml"]}), InvalidArgument,
         "not a plain file name"),
        (lambda d: d["files"].update({"/etc/passwd": d["files"]["model.yaml"]}), InvalidArgument,
         "not a plain file name"),
        (lambda d: d["files"]["weights.safetensors"].update(size=1 << 70), ResourceExhausted,
         "over this worker's limit"),
        (lambda d: d["files"]["weights.safetensors"].update(size=-1), InvalidArgument, "integer >= 0"),
        (lambda d: d["files"]["weights.safetensors"].update(sha256="../x"), InvalidArgument,
         "64 lowercase hex"),
        (lambda d: d["files"].pop("weights.safetensors"), DataLoss, "is not in its manifest"),
        (lambda d: d.update(model="demo-onnx"), DataLoss, "written for demo-onnx/1"),
        (lambda d: d.update(extra=1), InvalidArgument, "unknown keys"),
    ],
)  # fmt: skip
def test_hostile_manifests_are_refused_before_any_weights_are_fetched(served, tmp_path, change, error, match):  # type: ignore[no-untyped-def]
    server, folder = served
    _rewrite_manifest(folder, "demo-mlp/1/manifest.json", change)
    with pytest.raises(error, match=match):
        _repo(server.url + "models", tmp_path).load("demo-mlp", "1")
    assert server.hits["models/" + W1] == 0
    assert not any("keyring" in path for path in server.hits)


def test_manifest_json_tricks_are_refused(served, tmp_path: Path) -> None:
    server, folder = served
    path = folder / "demo-mlp/1/manifest.json"
    text = path.read_text()
    path.write_text(
        text.replace('"files": {', '"files": {"model.yaml": {"sha256": "' + "0" * 64 + '", "size": 1},', 1)
    )
    with pytest.raises(InvalidArgument, match=r"duplicate key 'model\.yaml'"):
        _repo(server.url + "models", tmp_path).config("demo-mlp", "1")
    path.write_bytes(b" " * (2 << 20))
    with pytest.raises(InvalidArgument, match="larger than 1048576 bytes"):
        _repo(server.url + "models", tmp_path).config("demo-mlp", "1")
    (folder / INDEX).write_text('{"format": "mcpmesh-index/1", "models": {"../x": ["1"]}}')
    with pytest.raises(InvalidArgument, match="not a valid model name"):
        _repo(server.url + "models", tmp_path).index()


def test_repository_urls_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="no query or fragment"):
        ModelRepository("https://example.invalid/models?token=x", cache_dir=tmp_path)
    with pytest.raises(InvalidArgument, match="expected s3://bucket/prefix"):
        ModelRepository("s3:///prefix", cache_dir=tmp_path)
    folder = ModelRepository(f"file://{tmp_path}")
    assert folder.root == tmp_path and folder.source is None


# --- folders: the manifest is checked when there is one -----------------------------------------------------


def test_folder_checks_its_manifests(demo: Path, tmp_path: Path) -> None:
    folder = tmp_path / "models"
    shutil.copytree(demo, folder)
    repo = ModelRepository(folder, Keyring.load(folder / "keyring.json"))
    assert repo.load("demo-mlp-enc", "1").weights == (folder / W1).read_bytes()
    (folder / W2).write_bytes((folder / W2).read_bytes() + b"x")
    with pytest.raises(DataLoss, match=r"demo-mlp/2/weights\.safetensors: .* its manifest says .*publish"):
        repo.load("demo-mlp", "2")
    problems = check(folder)
    assert len(problems) == 1 and problems[0].startswith(f"{folder / W2}: sha256 "), problems
    # a version directory copied with its manifest is not that manifest's version: loaded unchecked
    shutil.copytree(folder / "demo-mlp/1", folder / "my-copy/1")
    (folder / "my-copy/1/model.yaml").write_text((folder / "my-copy/1/model.yaml").read_text() + "\n# mine\n")
    assert repo.load("my-copy", "1").weights == (folder / W1).read_bytes()
    (folder / "demo-mlp/1" / MANIFEST).unlink()  # without a manifest: as before manifests existed
    assert repo.load("demo-mlp", "1").weights
    publish(folder)
    assert check(folder) == [] and repo.load("demo-mlp", "2").weights.endswith(b"x")
    doc = parse_manifest((folder / "my-copy/1" / MANIFEST).read_bytes(), where="m", max_file_bytes=1 << 30)
    assert (doc.model, doc.version) == ("my-copy", "1")
    assert json.loads((folder / INDEX).read_text())["models"]["my-copy"] == ["1"]


def test_publish_check_and_list_on_the_command_line(demo: Path, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "models"
    shutil.copytree(demo, folder)
    (folder / INDEX).unlink()
    assert repository_main(["check", str(folder)]) == 1
    assert f"{folder / INDEX}: missing" in capsys.readouterr().out
    assert repository_main(["publish", str(folder)]) == 0
    assert repository_main(["check", str(folder)]) == 0
    capsys.readouterr()
    assert repository_main(["list", f"file://{folder}"]) == 0
    assert "demo-mlp: 1 2" in capsys.readouterr().out
    assert repository_main(["list", str(tmp_path / "nope")]) == 1
    assert "does not exist" in capsys.readouterr().err


# --- S3 -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3(demo: Path) -> Iterator[S3Server]:
    with S3Server() as server:
        only = ("index.json", "demo-mlp-enc/1", "demo-onnx/2", "demo-mlp/1", "demo-mlp/2")
        server.upload(demo, "mcp-models", "fleet/v1", only=only)
        with env_vars(server.env):
            yield server


def test_s3_lists_and_loads_through_the_cache(s3: S3Server, demo: Path, tmp_path: Path) -> None:
    repo = ModelRepository(
        "s3://mcp-models/fleet/v1", Keyring.load(demo / "keyring.json"), cache_dir=tmp_path
    )
    assert repo.index() == ModelRepository(demo).index()
    assert repo.load("demo-mlp-enc", "1").weights == (demo / W1).read_bytes()
    assert repo.load("demo-onnx", "2").weights == (demo / "demo-onnx/2/model.onnx").read_bytes()
    assert repo.cache is not None and repo.cache.downloads == 4
    repo.load("demo-onnx", "2")
    assert repo.cache.downloads == 4


def test_s3_missing_key_bucket_and_refused_access(s3: S3Server, demo: Path, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(NotFound, match=r"s3://mcp-models/fleet/v1/demo-mlp/7/manifest\.json: S3 NoSuchKey"):
        ModelRepository("s3://mcp-models/fleet/v1", cache_dir=tmp_path).load("demo-mlp", "7")
    with pytest.raises(NotFound, match="there is no bucket 'no-such-bucket'"):
        ModelRepository("s3://no-such-bucket/x", cache_dir=tmp_path).load("demo-mlp", "1")
    s3.client().put_object(
        Bucket="mcp-models", Key="fleet/v1/demo-mlp/2/weights.safetensors", Body=b"tampered"
    )
    with pytest.raises(DataLoss, match=r"s3://mcp-models/fleet/v1/demo-mlp/2/weights\.safetensors: 8 bytes"):
        ModelRepository("s3://mcp-models/fleet/v1", cache_dir=tmp_path).load("demo-mlp", "2")
    s3.client().put_object(Bucket="mcp-models", Key="fleet/v1/" + W2, Body=(demo / W2).read_bytes())
    # a user with no policy, then an unknown key, once the server checks credentials
    import boto3  # noqa: PLC0415

    iam = boto3.session.Session().client("iam", endpoint_url=s3.endpoint, region_name="us-east-1")
    iam.create_user(UserName="no-rights")
    key = iam.create_access_key(UserName="no-rights")["AccessKey"]
    with s3.auth_enforced():
        denied = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        for creds in (
            denied,
            {"AWS_ACCESS_KEY_ID": "AKIAUNKNOWN000000000", "AWS_SECRET_ACCESS_KEY": "nope-secret"},
        ):
            with env_vars(creds), pytest.raises(PermissionDenied, match="access denied") as caught:
                ModelRepository("s3://mcp-models/fleet/v1", cache_dir=tmp_path).load("demo-mlp", "1")
            assert "s3://mcp-models/fleet/v1/demo-mlp/1/manifest.json" in caught.value.message
            ours = [
                r.getMessage() for r in caplog.records if not r.name.startswith("moto")
            ]  # not the server's
            for secret in (*creds.values(), S3_ENV["AWS_SECRET_ACCESS_KEY"]):
                assert secret not in caught.value.message
                assert not any(secret in line for line in ours)
