"""Serve one model in several SGLang configurations back to back; benchmark each with SGLang's
own ``sglang.bench_serving``; report tok/s, TTFT and ITL per concurrency and the ratios.

Issue 27, part 2, and the warm autotune cache of part 3 shown at a real model width. Run on
a GPU machine by the interpreter that has our wheels (the patched sglang, FlashInfer, our
kernel wheel) and the builder importable: every configuration starts from the launch
profile's command as ``python -m builder serve-command`` prints it (so the figures are of
the command users run), with ``FLASHINFER_DISABLE_JIT=1`` and a fresh ``SGLANG_CACHE_DIR``.

Configurations, in the order given by ``--configs``:

- ``profile``: the target's launch profile for ``--gpu`` / ``--tp`` (MoE autotune on, as
  SGLang runs it with ``--moe-runner-backend flashinfer_cutlass``). Its autotune file is
  then captured by ``python -m builder warm-cache capture`` into ``OUT/warm-cache.json``.
- ``profile-no-autotune``: the same and ``--disable-flashinfer-autotune``.
- ``profile-restored``: the same as ``profile``, its cache folder empty but for the file
  ``python -m builder warm-cache restore`` wrote from the capture (start time only unless
  ``--bench-restored``).
- ``defaults``: ``python -m sglang.launch_server --model-path M --tp-size N``: SGLang's
  own defaults for everything else.

For each: seconds from launch to ``/health`` and to the first token of one request, then
``python -m sglang.bench_serving --backend sglang --dataset-name random-ids
--tokenize-prompt`` at each ``--concurrency`` (fixed input and output lengths,
``--random-range-ratio 1``, ``max(--min-prompts, --prompts-per-slot * concurrency)``
prompts, one warm-up request), ``--repeat`` times each. The model needs a tokenizer
(``tiny_model.py --tokenizer``).

Writes ``OUT/results.json`` (every figure, the commands, the ratios) and ``OUT/logs/``.
Ratios: ``profile`` / ``profile-no-autotune`` and ``profile`` / ``defaults`` for output
tok/s (higher is better) and median TTFT and ITL (lower is better), per concurrency.

    python benchmarks/bench_serving.py --model /root/qwen3-30b-a3b-4l --out OUT \\
        --target sglang-0.5.16 --gpu rtx-pro-6000 --tp 1 --concurrency 1,16,256 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

CONFIGS = ("profile", "profile-no-autotune", "profile-restored", "defaults")
#: NVLink multicast off (KINDS.md of the lent machines; harmless on one GPU).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def profile_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The launch profile's argv and environment, from ``builder serve-command --json``."""
    done = subprocess.run(
        [sys.executable, "-m", "builder", "serve-command", "--json", "--target", args.target,
         "--gpu", args.gpu, "--tp", str(args.tp), "--model", str(args.model)],
        capture_output=True, text=True, check=True)
    answer = json.loads(done.stdout)
    argv = [sys.executable if a == "python" else a for a in answer["argv"]]
    return argv, dict(answer["env"])


def command_for(config: str, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The server's argv and extra environment for one configuration."""
    if config == "defaults":
        return ([sys.executable, "-m", "sglang.launch_server", "--model-path", str(args.model),
                 "--tp-size", str(args.tp)], {"FLASHINFER_DISABLE_JIT": "1"})
    argv, env = profile_command(args)
    if config == "profile-no-autotune":
        argv.append("--disable-flashinfer-autotune")
    return argv, env


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, SIGKILL after 30 s; wait until it is gone."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                process.wait()
                return
            time.sleep(0.5)


def first_token(url: str, input_ids: list[int]) -> float:
    """Seconds for one ``/generate`` of ``input_ids`` with one new token."""
    started = time.monotonic()
    answer = requests.post(f"{url}/generate", timeout=600, json={
        "input_ids": input_ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    answer.raise_for_status()
    return time.monotonic() - started


def level(url: str, port: int, concurrency: int, args: argparse.Namespace,
          out: Path) -> dict[str, Any]:
    """``--repeat`` runs at one concurrency; each figure's runs, lowest first, as the spread."""
    runs = [bench(url, port, concurrency, args, out.with_name(f"{out.name}-r{i}"))
            for i in range(args.repeat)]
    good = [r for r in runs if "error" not in r]
    row: dict[str, Any] = {"concurrency": concurrency, "runs": runs}
    if len(good) < len(runs):
        row["error"] = "; ".join(r["error"] for r in runs if "error" in r)
    for key in FIGURES:
        values = sorted(r[key] for r in good if isinstance(r.get(key), (int, float)))
        if values:
            row[key] = values
    return row


#: The figures of each run kept in the results (names of bench_serving's JSON line).
FIGURES = ("output_throughput", "total_throughput", "request_throughput", "median_ttft_ms",
           "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "mean_itl_ms", "median_tpot_ms",
           "duration", "completed", "total_output_tokens")


def bench(url: str, port: int, concurrency: int, args: argparse.Namespace,
          out: Path) -> dict[str, Any]:
    """One ``sglang.bench_serving`` run; its JSON line (or an ``error``)."""
    prompts = max(args.min_prompts, args.prompts_per_slot * concurrency)
    result = out.with_suffix(".jsonl")
    command = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang",
               "--host", "127.0.0.1", "--port", str(port), "--model", str(args.model),
               "--tokenizer", str(args.model), "--dataset-name", "random-ids",
               "--tokenize-prompt", "--random-input-len", str(args.input_len),
               "--random-output-len", str(args.output_len), "--random-range-ratio", "1",
               "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
               "--request-rate", "inf", "--warmup-requests", "1", "--seed", "1",
               "--disable-tqdm", "--output-file", str(result)]
    with out.with_suffix(".log").open("w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False,
                              timeout=args.bench_timeout)
    if done.returncode != 0 or not result.exists():
        return {"concurrency": concurrency, "prompts": prompts,
                "error": f"bench_serving exited {done.returncode}", "command": command}
    line = json.loads(result.read_text().splitlines()[-1])
    return {"concurrency": concurrency, "prompts": prompts,
            **{k: line.get(k) for k in FIGURES}, "command": command}


def warm_key(args: argparse.Namespace) -> dict[str, Any]:
    """The warm-cache key of this machine, FlashInfer and model (the tested interpreter's)."""
    import importlib.metadata

    import torch

    config = json.loads((args.model / "config.json").read_text())
    major, minor = torch.cuda.get_device_capability()
    return {"gpu_name": torch.cuda.get_device_name(), "compute_capability": f"{major}.{minor}",
            "flashinfer_version": importlib.metadata.version("flashinfer-python"),
            "release": args.target, "hidden": config["hidden_size"],
            "experts": config["num_experts"] // args.ep, "top_k": config["num_experts_per_tok"],
            "intermediate": config["moe_intermediate_size"] // (args.tp // args.ep),
            "tp": args.tp, "dtype": "bf16"}


def builder(*command: str) -> dict[str, Any]:
    """``python -m builder COMMAND --json``'s answer; raises on a non-zero exit."""
    done = subprocess.run([sys.executable, "-m", "builder", *command, "--json"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"builder {command[0]} exited {done.returncode}: "
                           f"{done.stderr.strip()[-400:]}")
    return dict(json.loads(done.stdout))


def run_config(config: str, args: argparse.Namespace, state: dict[str, Any]) -> dict[str, Any]:
    """Start one configuration, time its start, benchmark it, stop it."""
    cache = args.out / "sglang-cache" / config
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    row: dict[str, Any] = {"config": config}
    if config == "profile-restored":
        relative = state.get("autotune_relative")
        if relative is None:
            return {**row, "error": "no captured autotune file (run 'profile' first)"}
        row["restore"] = builder("warm-cache", "restore", "--key", str(args.out / "key.json"),
                                 "--artifact", str(args.out / "warm-cache.json"),
                                 "--dest", str(cache / relative))
    argv, env = command_for(config, args)
    port = free_port()
    argv += ["--host", "127.0.0.1", "--port", str(port), *args.server_arg]
    row["command"] = argv
    row["env"] = env
    url = f"http://127.0.0.1:{port}"
    log = (args.out / "logs" / f"{config}.log").open("w")
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True,
                               env={**os.environ, **NO_MULTICAST, **env,
                                    "SGLANG_CACHE_DIR": str(cache)})
    try:
        while True:
            if process.poll() is not None:
                return {**row, "error": f"the server exited {process.returncode} at start"}
            if time.monotonic() - started > args.start_timeout:
                return {**row, "error": f"no /health within {args.start_timeout} s"}
            try:
                if requests.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        row["seconds_to_health"] = round(time.monotonic() - started, 2)
        first_token(url, list(range(3, 11)))
        row["seconds_to_first_token"] = round(time.monotonic() - started, 2)
        if config == "profile-restored" and not args.bench_restored:
            row["levels"] = []
        else:
            row["levels"] = [level(url, port, c, args, args.out / "logs" / f"{config}-c{c}")
                             for c in args.concurrency]
    finally:
        stop_group(process)
        log.close()
    if config == "profile":
        files = sorted(cache.glob("flashinfer/autotune/*/*/*/rank_*.json"))
        row["autotune_files"] = [str(f.relative_to(cache)) for f in files]
        if len(files) == 1:
            state["autotune_relative"] = files[0].relative_to(cache)
            row["capture"] = builder("warm-cache", "capture", "--key",
                                     str(args.out / "key.json"), "--sglang-cache-dir",
                                     str(cache), "--output", str(args.out / "warm-cache.json"))
    return row


def ratios(rows: dict[str, dict[str, Any]], a: str, b: str) -> list[dict[str, Any]]:
    """Per concurrency: a/b of the mean of output tok/s, median TTFT and median ITL, and
    the lowest and highest ratio of any run of ``a`` to any run of ``b`` (the spread)."""
    found = []
    first = {r["concurrency"]: r for r in rows.get(a, {}).get("levels", []) if "error" not in r}
    second = {r["concurrency"]: r for r in rows.get(b, {}).get("levels", []) if "error" not in r}
    for c in sorted(first.keys() & second.keys()):
        entry: dict[str, Any] = {"concurrency": c}
        for k in ("output_throughput", "median_ttft_ms", "median_itl_ms"):
            x, y = first[c].get(k), second[c].get(k)
            if x and y and min(y) > 0:
                entry[k] = {"mean": round(sum(x) / len(x) / (sum(y) / len(y)), 3),
                            "low": round(min(x) / max(y), 3), "high": round(max(x) / min(y), 3)}
        found.append(entry)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target", default="sglang-0.5.16")
    parser.add_argument("--gpu", default="rtx-pro-6000")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--concurrency", default="1,16,256")
    parser.add_argument("--repeat", type=int, default=2, help="runs per concurrency")
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--min-prompts", type=int, default=16)
    parser.add_argument("--prompts-per-slot", type=int, default=2)
    parser.add_argument("--start-timeout", type=float, default=900.0)
    parser.add_argument("--bench-timeout", type=float, default=900.0)
    parser.add_argument("--bench-restored", action="store_true")
    parser.add_argument("--server-arg", action="append", default=[])
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    configs = args.configs.split(",")
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configurations {unknown}; choose from {', '.join(CONFIGS)}")
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    (args.out / "key.json").write_text(json.dumps(warm_key(args), indent=2) + "\n")
    rows: dict[str, dict[str, Any]] = {}
    state: dict[str, Any] = {}
    for config in configs:
        print(f"[{time.strftime('%H:%M:%S')}] {config} ...", flush=True)
        try:
            rows[config] = run_config(config, args, state)
        except Exception as exc:  # one configuration's fault must not lose the others
            rows[config] = {"config": config, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({k: v for k, v in rows[config].items()
                          if k not in ("command", "env")}, default=str), flush=True)
        (args.out / "results.json").write_text(json.dumps(
            {"configs": rows, "autotune_on_over_off": ratios(rows, "profile",
                                                             "profile-no-autotune"),
             "profile_over_defaults": ratios(rows, "profile", "defaults"),
             "key": json.loads((args.out / "key.json").read_text()),
             "settings": {k: v for k, v in vars(args).items()
                          if k in ("target", "gpu", "tp", "ep", "input_len", "output_len",
                                   "min_prompts", "prompts_per_slot", "concurrency",
                                   "repeat")}},
            indent=2, default=str) + "\n")
    return 0 if all("error" not in r and not any("error" in lv for lv in r.get("levels", []))
                    for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
