"""Time SGLang 0.5.16's start: launch -> /health 200 -> first /generate token, per case.

Run on the device from the repo root: python3 cold_start.py OUT_DIR MODEL_DIR CASE...
A case is NAME:AUTOTUNE:TRITON where AUTOTUNE is 'empty' or 'restore' (the warm-cache
artifact of the first 'empty' case, written back by builder.smoke.warm_cache.restore) and
TRITON is 'empty' or 'keep' (the Triton cache of the previous case). Writes OUT/NAME.log
and prints one JSON object per case.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.getcwd())
spec = importlib.util.spec_from_file_location("warm_cache", "builder/smoke/warm_cache.py")
assert spec and spec.loader
wc = importlib.util.module_from_spec(spec)
sys.modules["warm_cache"] = wc  # dataclasses look their module up
spec.loader.exec_module(wc)

OUT, MODEL = Path(sys.argv[1]), Path(sys.argv[2])
PORT = 31000
MARKS = {
    "torch_cuda_ready": re.compile(r"Init torch distributed"),
    "weights_begin": re.compile(r"Load weight begin"),
    "weights_end": re.compile(r"Load weight end"),
    "autotune_begin": re.compile(r"Running FlashInfer autotune"),
    "autotune_end": re.compile(r"FlashInfer autotune completed"),
    "server_up": re.compile(r"Uvicorn running|Application startup complete"),
}


def get(url: str, data: bytes | None = None, timeout: float = 5) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except Exception as exc:  # server not up yet
        return -1, str(exc).encode()


def start(name: str, cache: Path, triton: Path) -> dict:
    env = dict(os.environ, SGLANG_CACHE_DIR=str(cache), TRITON_CACHE_DIR=str(triton),
               CUDA_CACHE_PATH="/tmp/cuda-cache", TORCHINDUCTOR_CACHE_DIR="/tmp/inductor-cache",
               FLASHINFER_DISABLE_JIT="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(MODEL),
           "--skip-tokenizer-init", "--moe-runner-backend", "flashinfer_cutlass",
           "--attention-backend", "triton", "--disable-cuda-graph", "--tp", "1",
           "--port", str(PORT), "--log-level", "info"]
    log = open(OUT / f"{name}.log", "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    marks: dict[str, float] = {}
    hits: list[str] = []

    def reader() -> None:
        assert proc.stdout
        for line in proc.stdout:
            t = time.monotonic() - t0
            log.write(f"[{t:8.2f}] {line}")
            for k, rx in MARKS.items():
                if k not in marks and rx.search(line):
                    marks[k] = round(t, 2)
            if "Config cache hit" in line or "cache miss" in line.lower():
                hits.append(line.strip()[-200:])
    th = threading.Thread(target=reader, daemon=True)
    th.start()
    result: dict = {"case": name}
    deadline = t0 + 200
    while time.monotonic() < deadline and proc.poll() is None:
        if get(f"http://127.0.0.1:{PORT}/health", timeout=2)[0] == 200:
            result["health_s"] = round(time.monotonic() - t0, 2)
            break
        time.sleep(0.2)
    if "health_s" in result:
        body = json.dumps({"input_ids": [1, 2, 3, 4, 5, 6, 7, 8],
                           "sampling_params": {"max_new_tokens": 1, "temperature": 0}}).encode()
        status, data = get(f"http://127.0.0.1:{PORT}/generate", body, timeout=60)
        result["first_token_s"] = round(time.monotonic() - t0, 2)
        result["generate_status"] = status
        result["generate"] = data.decode()[:200]
    else:
        result["error"] = f"no /health 200 (exit {proc.poll()})"
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    th.join(5)
    log.close()
    result["marks_s"] = marks
    result["autotune_file_hits"] = hits[:4]
    time.sleep(2)  # the port is free again
    return result


def main() -> None:
    import torch
    gpu = torch.cuda.get_device_name(0)
    cap = "%d.%d" % torch.cuda.get_device_capability(0)
    import flashinfer
    key = wc.WarmCacheKey(gpu_name=gpu, compute_capability=cap,
                          flashinfer_version=flashinfer.__version__, release="sglang-0.5.16",
                          hidden=1024, experts=8, top_k=2, intermediate=512, tp=1,
                          dtype="bf16")
    artifact_path = OUT / "warm-cache-artifact.json"
    triton = Path("/tmp/triton-cache")
    rel: Path | None = None
    for n, case in enumerate(sys.argv[3:]):
        name, autotune, tr = case.split(":")
        cache = Path(f"/tmp/sglang-cache-{name}")
        shutil.rmtree(cache, ignore_errors=True)
        if tr == "empty":  # with Triton's: the CUDA driver's and Inductor's caches
            for d in (triton, Path("/tmp/cuda-cache"), Path("/tmp/inductor-cache")):
                shutil.rmtree(d, ignore_errors=True)
        info: dict = {"autotune": autotune, "triton": tr}
        if autotune == "restore":
            assert rel is not None, "an 'empty' case must come first"
            t = time.monotonic()
            wrong = wc.WarmCacheKey(**{**wc.asdict(key), "tp": 2})
            info["restore_wrong_key_written"] = wc.restore(artifact_path, wrong, cache / rel)
            info["restored"] = wc.restore(artifact_path, key, cache / rel)
            info["restore_s"] = round(time.monotonic() - t, 4)
        r = {**start(name, cache, triton), **info}
        files = sorted(cache.glob("flashinfer/autotune/*/*/*/rank_*.json"))
        r["autotune_files"] = [str(f.relative_to(cache)) for f in files]
        if autotune == "empty" and files and rel is None:
            rel = files[0].relative_to(cache)
            shutil.copy(files[0], OUT / "sglang-autotune-cache.json")
            wc.write_artifact(wc.capture(files[0], key), artifact_path)
            r["artifact_entries"] = len(json.loads(artifact_path.read_text())
                                        ["flashinfer_cache"]) - 1
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
