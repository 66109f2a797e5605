"""Start one configuration through the image's launcher, serve it, and record what it loaded.

Usage (on the device, repo root, PYTHONPATH = the kernel set's site, then SGLang's):
    python3 serve_run.py NAME OUT_DIR MODEL_DIR [--expect-refusal | --upstream] -- SERVER FLAGS...

Runs ``builder/image/data/sglang-sm120-serve --model-path MODEL_DIR FLAGS`` (no launch
profile: ``SGLANG_SM120_PROFILE=none``) in a session of its own, with
``FLASHINFER_DISABLE_JIT=1`` and a fresh ``FLASHINFER_WORKSPACE_BASE``. The launcher first
derives the model's and flags' FlashInfer set with the release's own selection and compares it
with the installed kernel wheel's manifest (issue 36).

- ``--expect-refusal``: the launcher must exit 2 before any server starts; its message is kept.
- ``--upstream`` (run 5): ``python3 -m sglang.launch_server`` itself, no launcher, FlashInfer's
  JIT left on (its default): upstream's cold start. Its compiles are counted the same way.
- Otherwise (a fresh ``TRITON_CACHE_DIR`` and ``SGLANG_CACHE_DIR`` too: the Triton cubins
  and the autotune files the start writes are its own; the launcher restores into them what
  ``SGLANG_SM120_JIT_CACHES`` and ``SGLANG_SM120_WARM_CACHE`` name): waits for
  ``/health``; then batch 1 (one request, 256 prompt ids, 64 new tokens, greedy, EOS
  ignored) and batch 256 (256 such requests at once: prefill chunks of thousands of tokens,
  decode at 256, the fused MoE's large-M tactics), each request checked to return 64
  ids; then lists every FlashInfer library mapped by the server's processes
  (``/proc/PID/maps``: the kernel wheel's modules, and anything under the JIT workspace, which
  must hold nothing), and stops the server.

Writes ``OUT_DIR/NAME.json`` and ``OUT_DIR/NAME.log`` (the launcher's and server's output).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PORT = 30000
PROMPT, NEW = 256, 64


def _post(ids: list[int]) -> tuple[float, int]:
    body = json.dumps({"input_ids": ids, "sampling_params": {
        "max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
    start = time.monotonic()
    with urllib.request.urlopen(request, timeout=600) as response:
        out = json.loads(response.read())
    return time.monotonic() - start, len(out.get("output_ids") or [])


def _batch(size: int, vocab: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(PROMPT)] for _ in range(size)]
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=size) as pool:
        results = list(pool.map(_post, prompts))
    wall = time.monotonic() - start
    tokens = [n for _, n in results]
    return {"requests": size, "prompt_tokens": PROMPT, "new_tokens": NEW,
            "all_returned_64": all(n == NEW for n in tokens), "wall_s": round(wall, 2),
            "output_tok_per_s": round(sum(tokens) / wall, 1),
            "latency_s_max": round(max(t for t, _ in results), 2)}


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:  # field 6 of stat: the session id
                pids.append(int(entry.name))
    return pids


def _mapped(pids: list[int], needle: str) -> list[str]:
    found = set()
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                path = line.split(None, 5)[-1] if len(line.split(None, 5)) == 6 else ""
                if needle in path and path.endswith(".so"):
                    found.add(path)
        except OSError:
            continue
    return sorted(found)


def _watched() -> dict[str, int] | None:
    """Counts from ``triton_watch.py``'s records, where ``SGLANG_SM120_TRITON_WATCH`` is set."""
    folder = os.environ.get("SGLANG_SM120_TRITON_WATCH")
    if not folder or not Path(folder).is_dir():
        return None
    records = [json.loads(line) for path in Path(folder).glob("*.jsonl")
               for line in path.read_text().splitlines() if line.strip()]
    return {"specializations": sum("spec" in r for r in records),
            "compiles": sum("compile" in r and not r["cache_hit"] for r in records),
            "cache_hits": sum("compile" in r and r["cache_hit"] for r in records)}


def main(argv: list[str]) -> int:
    split = argv.index("--")
    head, flags = argv[:split], argv[split + 1:]
    refusal = "--expect-refusal" in head
    upstream = "--upstream" in head
    name, out_dir, model = [a for a in head if a not in ("--expect-refusal", "--upstream")]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    workspace = Path(tempfile.mkdtemp(prefix=f"fi-{name}-"))
    triton = Path(tempfile.mkdtemp(prefix=f"triton-{name}-"))
    sglang_cache = Path(tempfile.mkdtemp(prefix=f"sglang-{name}-"))
    env = {**os.environ, "SGLANG_SM120_PROFILE": "none", "FLASHINFER_DISABLE_JIT": "1",
           "FLASHINFER_WORKSPACE_BASE": str(workspace), "TRITON_CACHE_DIR": str(triton),
           "SGLANG_CACHE_DIR": str(sglang_cache), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "builder/image/data/sglang-sm120-serve", "--model-path", model,
               "--port", str(PORT), *flags]
    if upstream:
        del env["FLASHINFER_DISABLE_JIT"]
        command = [sys.executable, "-m", "sglang.launch_server", "--model-path", model,
                   "--port", str(PORT), *flags]
    record: dict[str, object] = {"name": name, "command": command, "model": model,
                                 "sglang_cache_dir": str(sglang_cache)}
    log = (out / f"{name}.log").open("w")
    start = time.monotonic()
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                              start_new_session=True)
    if refusal:
        try:
            code = server.wait(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            code = None
        record.update(exit=code, seconds=round(time.monotonic() - start, 1),
                      launcher_lines=[line for line in (out / f"{name}.log").read_text()
                                      .splitlines() if "sglang-sm120-serve" in line
                                      or line.startswith(("  ", "hint"))][-20:])
        (out / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
        print(json.dumps(record))
        return 0 if code == 2 else 1
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    ok = False
    try:
        while time.monotonic() - start < 900:
            if server.poll() is not None:
                record["exit"] = server.returncode
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=5) as r:
                    if r.status == 200:
                        ok = True
                        break
            except OSError:
                pass
            time.sleep(1)
        record["ready_s"] = round(time.monotonic() - start, 1) if ok else None
        if ok:
            record["batch_1"] = _batch(1, vocab, 1)
            record["first_token_by_s"] = round(time.monotonic() - start, 1)
            record["batch_256"] = _batch(256, vocab, 2)
            pids = _session_pids(server.pid)
            record["flashinfer_libraries"] = _mapped(pids, "flashinfer")
            record["jit_workspace_files"] = sorted(
                str(p.relative_to(workspace)) for p in workspace.rglob("*.so"))
            record["autotune_files"] = sorted(
                str(p.relative_to(sglang_cache)) for p in sglang_cache.rglob("*.json"))
            # Triton compiles at first use (issue 37): one cubin per compiled kernel
            record["triton_kernels_compiled"] = len(list(triton.rglob("*.cubin")))
            record["triton_watch"] = _watched()
    except Exception as error:  # the record says what broke
        record["error"] = f"{type(error).__name__}: {error}"
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
        log.close()
    text = (out / f"{name}.log").read_text(errors="replace")
    record["log_mentions"] = {k: text.count(k) for k in (
        "MissingJITCacheError", "JIT compilation is disabled", "Traceback",
        "kernel coverage", "Compiling", "Capture cuda graph end")}
    record["launcher_lines"] = [line for line in text.splitlines()
                                if line.startswith("sglang-sm120-serve")][:5]
    # run 5: autotune phases profiled (FlashInfer's progress bar starts each at 0%), and
    # the start's phases as SGLang logs them
    record["autotune_phases_profiled"] = sorted(set(re.findall(
        r"\[AutoTuner\]: Tuning (\S+):\s+0%", text)))
    record["phases_s"] = {phase: [float(x) for x in re.findall(pattern, text)] for phase, pattern in (
        ("load_weight", r"Load weight end\. elapsed=([0-9.]+) s"),
        ("capture_prefill", r"Capture target prefill CUDA graph end\. elapsed=([0-9.]+) s"),
        ("capture_decode", r"Capture target decode CUDA graph end\. elapsed=([0-9.]+) s"))}
    (out / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: record.get(k) for k in ("name", "ready_s", "batch_1", "batch_256",
                                                  "error", "exit")}))
    passed = ok and all(isinstance(record.get(b), dict) and record[b]["all_returned_64"]
                        for b in ("batch_1", "batch_256"))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
