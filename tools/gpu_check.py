"""make gpu-check: the cuda backend on a real GPU, in one run of a few minutes (DESIGN sections 9 and 12).

    python3 tools/gpu_check.py [--out DIR] [--wheels .whl]

1. Finds a GPU (nvidia-smi, else pycuda); without one it prints "no GPU on this machine: make gpu-check
   needs one" and exits 2.
2. Makes pycuda importable without a network when it is not: installs the wheels in ``--wheels`` (made by
   tools/prepare_gpu_wheels.sh on a machine with one) into a temporary target directory, and builds
   pycuda's source distribution from there against this machine's CUDA (about a minute and a half).
3. Builds the kernels (libs/native/cuda/build.sh) and runs tests/gpu with pytest.
4. Measures: the demo MLP on the cuda and numpy backends at batch 1, 16 and 64 (rows/s, p50/p99 of infer
   calls, max abs difference); device memory before load, after load and after unload; two models on two
   streams, alone and at once (wall-clock timestamps, with CUDA events timing each stream); host-to-device
   bandwidth from page-locked and from pageable memory at 64 MiB; demo-onnx on onnxruntime's CUDA
   provider against its CPU provider where this onnxruntime has one ("not measured" otherwise).
5. Writes ``gpu_check_report.json`` and ``gpu_check_report.md`` under ``--out`` (default ``$OUT`` when set,
   else ``.run/gpu-check``). Exit 0 when the tests pass, outputs match within 1e-4, unloading returns the
   memory and two streams overlap; 1 otherwise, with the failures listed in the report.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import importlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = [
    ROOT / "libs" / "contracts",
    ROOT / "libs" / "core",
    ROOT / "libs" / "native",
    ROOT / "services" / "worker",
]
NO_GPU = "no GPU on this machine: make gpu-check needs one"
TOL = 1e-4
MIB = 1 << 20
BATCHES = (1, 16, 64)


# --- finding the GPU and making pycuda importable -------------------------------------------------------


def detect_gpu() -> dict[str, str] | None:
    """The first GPU as nvidia-smi (else pycuda) describes it, or None."""
    query = "--query-gpu=name,memory.total,driver_version,pci.bus_id"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        if out:
            name, memory, driver, bus = (part.strip() for part in out.splitlines()[0].split(","))
            return {"name": name, "memory": memory, "driver": driver, "pci_bus_id": bus}
    with contextlib.suppress(Exception):
        cuda = importlib.import_module("pycuda.driver")
        cuda.init()
        if cuda.Device.count() > 0:
            return {"name": cuda.Device(0).name(), "memory": f"{cuda.Device(0).total_memory() // MIB} MiB"}
    return None


def _run(cmd: list[str], *, timeout: float, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {done.returncode}:\n{tail}")
    return done.stdout + done.stderr


def _cuda_root() -> Path:
    """The CUDA toolkit holding ``include/cuda.h``: $CUDA_HOME, $CUDA_PATH, nvcc's, or /usr/local/cuda."""
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    candidates += [str(Path(os.path.realpath(nvcc)).parent.parent) if nvcc else None, "/usr/local/cuda"]
    for root in filter(None, candidates):
        if (Path(root) / "include" / "cuda.h").is_file():
            return Path(root)
    raise RuntimeError(f"no CUDA toolkit with include/cuda.h among {[c for c in candidates if c]}")


def _libcuda_dir(cuda_root: Path, scratch: Path) -> Path:
    """A directory with a ``libcuda.so`` to link pycuda against: the toolkit's stub, else the driver's."""
    for lib in ("lib64/stubs", "lib/stubs", "targets/x86_64-linux/lib/stubs", "lib64"):
        if (cuda_root / lib / "libcuda.so").exists():
            return cuda_root / lib
    candidates = [
        "/usr/local/nvidia/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/local/cuda/compat",
    ]
    for directory in candidates:
        found = sorted(Path(directory).glob("libcuda.so*"))
        if found:
            (scratch / "libcuda").mkdir(exist_ok=True)
            link = scratch / "libcuda" / "libcuda.so"
            link.unlink(missing_ok=True)
            link.symlink_to(found[0])
            return link.parent
    raise RuntimeError(f"no libcuda.so under {cuda_root} or {candidates}: is the NVIDIA driver installed?")


def install_pycuda(wheels: Path, scratch: Path) -> tuple[list[Path], str]:
    """Install ``wheels/*.whl`` and build ``wheels/pycuda-*.tar.gz`` into ``scratch/site``, offline."""
    site = scratch / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-cache-dir"]
    whls = sorted(str(p) for p in wheels.glob("*.whl"))
    sdists = sorted(wheels.glob("pycuda-*.tar.gz"))
    if not sdists:
        raise RuntimeError(f"no pycuda-*.tar.gz in {wheels}: run tools/prepare_gpu_wheels.sh where pip works")
    if whls:
        _run([*pip, "--no-compile", "--upgrade", "--target", str(site), *whls], timeout=300)
    with tarfile.open(sdists[-1]) as tar:
        tar.extractall(scratch, filter="data")
    src = scratch / sdists[-1].name.removesuffix(".tar.gz")
    cuda_root = _cuda_root()
    configure = [sys.executable, "configure.py", f"--cuda-root={cuda_root}", "--no-cuda-enable-curand"]
    _run([*configure, f"--cudadrv-lib-dir={_libcuda_dir(cuda_root, scratch)}"], cwd=src, timeout=120)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    _run([*pip, "--no-build-isolation", "--target", str(site), str(src)], cwd=src, env=env, timeout=900)
    return [site], f"pycuda built from {sdists[-1].name} against {cuda_root}; {len(whls)} wheels"


# --- kernels and tests ----------------------------------------------------------------------------------


def build_kernels() -> str:
    return _run(["bash", str(ROOT / "libs" / "native" / "cuda" / "build.sh")], timeout=600).strip()


def run_gpu_tests(paths: list[Path], log: Path) -> tuple[bool, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in paths)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "--noconftest", "-p", "no:cacheprovider", "tests/gpu"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    log.write_text(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else f"pytest exited {done.returncode}"
    return done.returncode == 0 and "passed" in summary and "skipped" not in summary, summary  # skips fail


# --- measurements ---------------------------------------------------------------------------------------


def _percentile_ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return 1e3 * ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _time_calls(
    call: Callable[[], object], *, warmup: int = 20, seconds: float = 1.0, cap: int = 5000
) -> list[float]:
    for _ in range(warmup):
        call()
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline and len(samples) < cap:
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def bench_mlp(repo: Path, figures: dict[str, Any]) -> None:
    """The demo MLP: both backends at each batch size, and device memory around a load."""
    import numpy as np  # noqa: PLC0415 - after the paths are set up

    from mcp_worker.backends.cuda_backend import CudaBackend  # noqa: PLC0415
    from mcp_worker.backends.cuda_device import device_memory_info  # noqa: PLC0415
    from mcp_worker.backends.numpy_backend import NumpyBackend  # noqa: PLC0415
    from mcpcore.model_yaml import load_model_yaml  # noqa: PLC0415

    config = load_model_yaml(repo / "demo-mlp" / "1")
    weights = (repo / "demo-mlp" / "1" / "weights.safetensors").read_bytes()
    rng = np.random.default_rng(0)
    ref = NumpyBackend(config, weights)
    free_before, total = device_memory_info()
    cuda = CudaBackend(dataclasses.replace(config, backend="cuda"), weights)
    free_loaded, _ = device_memory_info()
    figures.update(mlp_memory_bytes=cuda.memory_bytes, mlp_measured_device_bytes=cuda.measured_device_bytes)
    worst = 0.0
    try:
        for batch in BATCHES:
            inputs = [{"INPUT0": rng.standard_normal((batch, 64)).astype(np.float32)} for _ in range(5)]
            err = max(float(np.abs(cuda.infer(x)["OUTPUT0"] - ref.infer(x)["OUTPUT0"]).max()) for x in inputs)
            worst = max(worst, err)
            figures[f"mlp_b{batch}_max_abs_err"] = err
            for name, backend in (("numpy", ref), ("cuda", cuda)):
                samples = _time_calls(lambda b=backend, x=inputs[0]: b.infer(x))
                figures[f"mlp_b{batch}_{name}_rows_per_s"] = round(batch * len(samples) / sum(samples), 1)
                figures[f"mlp_b{batch}_{name}_p50_ms"] = round(_percentile_ms(samples, 50), 4)
                figures[f"mlp_b{batch}_{name}_p99_ms"] = round(_percentile_ms(samples, 99), 4)
    finally:
        cuda.close()
    free_after, _ = device_memory_info()
    figures["cuda_vs_numpy_max_abs_err"] = worst
    figures.update(
        device_total_mib=round(total / MIB, 1),
        device_free_before_load_mib=round(free_before / MIB, 3),
        device_free_after_load_mib=round(free_loaded / MIB, 3),
        device_free_after_unload_mib=round(free_after / MIB, 3),
        device_unload_diff_bytes=free_before - free_after,
    )


def _wide_model(seed: int) -> tuple[Any, bytes]:
    """A model whose one big dense layer runs long on few blocks (8 of 16x16 threads at batch 16), so two
    streams can run side by side: input 16384 -> 128 -> relu -> 16."""
    import numpy as np  # noqa: PLC0415
    import safetensors.numpy  # noqa: PLC0415

    from mcpcore.model_yaml import model_config_from_dict  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    tensors = {
        "w1": (rng.standard_normal((16384, 128)) / 128).astype(np.float32),
        "w2": (rng.standard_normal((128, 16)) / 11).astype(np.float32),
    }
    data = {
        "backend": "cuda",
        "max_batch_size": 16,
        "inputs": [{"name": "X", "dtype": "FP32", "shape": [-1, 16384]}],
        "outputs": [{"name": "Y", "dtype": "FP32", "shape": [-1, 16]}],
        "weights": "w.safetensors",
        "layers": [
            {"op": "dense", "in": 16384, "out": 128, "weight": "w1"},
            {"op": "relu"},
            {"op": "dense", "in": 128, "out": 16, "weight": "w2"},
        ],
    }
    return model_config_from_dict(data, model=f"wide{seed}", version="1"), safetensors.numpy.save(tensors)


def bench_two_streams(figures: dict[str, Any], calls: int = 200) -> None:
    """Two models, each on its own stream: alone one after the other, then both at once from two threads."""
    import numpy as np  # noqa: PLC0415

    from mcp_worker.backends.cuda_backend import CudaBackend  # noqa: PLC0415
    from mcp_worker.backends.cuda_device import device_context  # noqa: PLC0415

    models = [CudaBackend(*_wide_model(seed)) for seed in (1, 2)]
    x = {"X": np.random.default_rng(5).standard_normal((16, 16384)).astype(np.float32)}
    try:
        for model in models:
            model.warmup()
        spans: dict[int, tuple[float, float]] = {}

        def drive(i: int, start: threading.Barrier | None) -> None:
            if start is not None:
                start.wait()
            t0 = time.perf_counter()
            for _ in range(calls):
                models[i].infer(x)
            spans[i] = (t0, time.perf_counter())

        solo = []
        with device_context() as cuda:
            for i, model in enumerate(models):
                first, last = cuda.Event(), cuda.Event()
                first.record(model.stream)
                drive(i, None)
                last.record(model.stream)
                last.synchronize()
                solo.append(spans[i][1] - spans[i][0])
                figures[f"two_streams_solo_{'ab'[i]}_gpu_s"] = round(last.time_since(first) / 1e3, 4)
                del first, last  # events belong to the context: freed while it is pushed
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=drive, args=(i, barrier)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        concurrent = max(end for _, end in spans.values()) - min(start for start, _ in spans.values())
    finally:
        for model in models:
            model.close()
    figures.update(
        two_streams_calls_each=calls,
        two_streams_solo_a_s=round(solo[0], 4),
        two_streams_solo_b_s=round(solo[1], 4),
        two_streams_concurrent_s=round(concurrent, 4),
        two_streams_overlap_ratio=round(concurrent / (solo[0] + solo[1]), 3),
    )


def bench_h2d(figures: dict[str, Any], nbytes: int = 64 * MIB, reps: int = 10) -> None:
    """Host-to-device copies of 64 MiB from page-locked and from pageable (already touched) memory."""
    from mcp_worker.backends.cuda_device import device_context  # noqa: PLC0415

    with device_context() as cuda:
        figures.update(_h2d_rates(cuda, nbytes, reps))  # its CUDA objects are freed with the context pushed
    figures["h2d_pinned_over_pageable"] = round(
        figures["h2d_pinned_gb_per_s_64mib"] / figures["h2d_pageable_gb_per_s_64mib"], 2
    )


def _h2d_rates(cuda: Any, nbytes: int, reps: int) -> dict[str, float]:
    import numpy as np  # noqa: PLC0415

    dev = cuda.mem_alloc(nbytes)
    pinned = cuda.pagelocked_empty(nbytes, np.uint8)
    pinned.fill(1)
    pageable = np.ones(nbytes, np.uint8)
    stream = cuda.Stream()
    copies = {
        "pinned": lambda: cuda.memcpy_htod_async(dev, pinned, stream),
        "pageable": lambda: cuda.memcpy_htod(dev, pageable),
    }
    rates = {}
    try:
        for label, copy in copies.items():
            copy()
            cuda.Context.synchronize()
            start = time.perf_counter()
            for _ in range(reps):
                copy()
            cuda.Context.synchronize()
            rates[f"h2d_{label}_gb_per_s_64mib"] = round(
                reps * nbytes / (time.perf_counter() - start) / 1e9, 2
            )
    finally:
        dev.free()
        pinned.base.free()
    return rates


# --- the report ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _step(report: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    """Time a step; an exception fails the step (and the check) but not the report."""
    entry: dict[str, Any] = {"ok": None}  # a step may set it; else it passed unless it raised
    report["steps"][name] = entry
    start = time.monotonic()
    try:
        yield entry
        entry["ok"] = entry["ok"] is not False
    except Exception as err:
        entry["ok"], entry["error"] = False, f"{type(err).__name__}: {err}"[-2000:]
    finally:
        entry["seconds"] = round(time.monotonic() - start, 1)


def judge(report: dict[str, Any]) -> list[str]:
    figures, failures = report["figures"], []
    failures += [
        f"step {name} failed: {s.get('error', s.get('detail', ''))}"
        for name, s in report["steps"].items()
        if not s["ok"]
    ]
    if figures.get("cuda_vs_numpy_max_abs_err", 1.0) >= TOL:
        failures.append(
            f"cuda and numpy outputs differ by {figures.get('cuda_vs_numpy_max_abs_err')} (>= {TOL})"
        )
    if abs(figures.get("device_unload_diff_bytes", 1 << 40)) > 4 * MIB:
        failures.append(
            f"unloading left {figures.get('device_unload_diff_bytes')} bytes of device memory taken"
        )
    if figures.get("onnx_cuda_vs_cpu_max_abs_err", 0.0) >= TOL:
        failures.append(f"ONNX on CUDA and on the CPU differ by {figures['onnx_cuda_vs_cpu_max_abs_err']}")
    if figures.get("two_streams_overlap_ratio", 1.0) >= 1.0:
        failures.append(f"two streams did not overlap: ratio {figures.get('two_streams_overlap_ratio')}")
    return failures


def write_report(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check_report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    gpu = report.get("gpu") or {}
    verdict = "PASSED" if report["ok"] else "FAILED"
    python = platform.python_version()
    lines = [
        f"# gpu-check {verdict}: {gpu.get('name', '?')} ({gpu.get('memory', '?')})",
        "",
        f"{report['when']} on {report['machine']}, driver {gpu.get('driver', '?')}, Python {python}",
        "",
        "| step | ok | seconds | detail |",
        "| --- | --- | --- | --- |",
    ]
    for name, step in report["steps"].items():
        detail = str(step.get("error") or step.get("detail") or "").replace("\n", " ")[:200]
        lines.append(f"| {name} | {'yes' if step['ok'] else 'NO'} | {step['seconds']} | {detail} |")
    lines += ["", "| figure | value |", "| --- | --- |"]
    lines += [f"| {key} | {value} |" for key, value in sorted(report["figures"].items())]
    if report["failures"]:
        lines += ["", "Failures:", *(f"- {failure}" for failure in report["failures"])]
    (out / "gpu_check_report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="report directory (default $OUT, else .run/gpu-check)")
    parser.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="from tools/prepare_gpu_wheels.sh")
    args = parser.parse_args(argv)
    out = args.out or Path(os.environ.get("OUT") or ROOT / ".run" / "gpu-check")
    gpu = detect_gpu()
    if gpu is None:
        print(NO_GPU, file=sys.stderr)
        return 2
    report: dict[str, Any] = {
        "machine": platform.node(),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": gpu,
        "steps": {},
        "figures": {},
    }
    paths = list(SOURCE_DIRS)
    with tempfile.TemporaryDirectory(prefix="mcp-gpu-check-") as scratch:
        with _step(report, "pycuda") as step:
            if importlib.util.find_spec("pycuda") is None:
                extra, step["detail"] = install_pycuda(args.wheels, Path(scratch))
                paths = extra + paths
            else:
                step["detail"] = "pycuda already importable"
        sys.path[:0] = [str(p) for p in paths]
        importlib.invalidate_caches()
        with _step(report, "kernels") as step:
            step["detail"] = build_kernels().splitlines()[-1]
        with _step(report, "tests") as step:
            out.mkdir(parents=True, exist_ok=True)
            step["ok"], step["detail"] = run_gpu_tests(paths, out / "gpu_tests.log")
        _measure(report, Path(scratch))
    report["failures"] = judge(report)
    report["ok"] = not report["failures"]
    write_report(out, report)
    print((out / "gpu_check_report.md").read_text())
    return 0 if report["ok"] else 1


def _measure(report: dict[str, Any], scratch: Path) -> None:
    figures = report["figures"]
    with _step(report, "bench_mlp"):
        spec = importlib.util.spec_from_file_location("make_models", ROOT / "tools" / "make_models.py")
        assert spec is not None and spec.loader is not None
        make_models = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(make_models)
        make_models.make_models(scratch / "models")
        bench_mlp(scratch / "models", figures)
    with _step(report, "bench_two_streams"):
        bench_two_streams(figures)
    with _step(report, "bench_h2d"):
        bench_h2d(figures)
    with _step(report, "bench_onnx_cuda") as step:
        step["detail"] = bench_onnx_cuda(scratch / "models", figures)


def bench_onnx_cuda(repo: Path, figures: dict[str, Any]) -> str:
    """demo-onnx on onnxruntime's CUDA provider against its CPU provider, where this onnxruntime has it
    (onnxruntime-gpu matching the machine's CUDA); otherwise the figure says "not measured" and why."""
    import numpy as np  # noqa: PLC0415 - after the paths are set up

    from mcp_worker.backends import create_backend  # noqa: PLC0415
    from mcp_worker.backends.onnx_backend import CUDA_PROVIDER, ort  # noqa: PLC0415
    from mcpcore.model_yaml import load_model_yaml  # noqa: PLC0415

    if ort is None or CUDA_PROVIDER not in ort.get_available_providers():
        figures["onnx_cuda"] = "not measured: this onnxruntime has no CUDAExecutionProvider"
        return figures["onnx_cuda"]
    config = load_model_yaml(repo / "demo-onnx" / "1")
    weights = (repo / "demo-onnx" / "1" / "model.onnx").read_bytes()
    cpu = create_backend(config, weights)
    gpu = create_backend(dataclasses.replace(config, device="gpu"), weights)
    figures["onnx_cuda_measured_device_bytes"] = getattr(gpu, "measured_device_bytes", 0)
    rng, worst = np.random.default_rng(1), 0.0
    try:
        for batch in BATCHES:
            x = {"INPUT0": rng.standard_normal((batch, 64)).astype(np.float32)}
            worst = max(worst, float(np.abs(gpu.infer(x)["OUTPUT0"] - cpu.infer(x)["OUTPUT0"]).max()))
            for name, backend in (("onnx_cpu", cpu), ("onnx_cuda", gpu)):
                samples = _time_calls(lambda b=backend, x=x: b.infer(x))
                figures[f"mlp_b{batch}_{name}_rows_per_s"] = round(batch * len(samples) / sum(samples), 1)
                figures[f"mlp_b{batch}_{name}_p99_ms"] = round(_percentile_ms(samples, 99), 4)
    finally:
        gpu.close()
        cpu.close()
    figures["onnx_cuda_vs_cpu_max_abs_err"] = worst
    return f"{gpu.device}, max abs err {worst:.2e}"


if __name__ == "__main__":
    sys.exit(main())
