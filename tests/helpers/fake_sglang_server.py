"""A real HTTP server process that behaves like ``sglang.launch_server`` from the outside.

For the smoke test's server check (builder/smoke/server.py). It prints SGLang's start-up and
autotune log lines (texts from SGLang 0.5.9 and FlashInfer 0.6.3), answers ``GET /health``
with 503 while "loading" and 200 after, and ``POST /generate`` with ``{"text", "meta_info"}``.
Like SGLang it starts a child process (its scheduler), in the same process group.

Usage: fake_sglang_server.py --port N --pid-file FILE --mode MODE [--skip-tokenizer-init],
where MODE is ``ok``, ``hang`` (never ready), ``crash`` (exits 1 while loading),
``no-autotune`` (ready, but never logs the autotune), ``untuned`` (the autotune skips every
tactic for a module missing from the jit-cache, as FlashInfer 0.6.14 logs it),
``stubborn`` (it and its child ignore SIGTERM) or ``empty-text`` (``/generate`` answers an
empty text, or no token ids). Like FlashInfer under SGLang 0.5.16, the per-tactic autotuner
lines are printed only with ``FLASHINFER_LOGGING_LEVEL=debug`` and a logging configuration
in ``SGLANG_LOGGING_CONFIG_PATH``; with ``--skip-tokenizer-init`` ``/generate``
takes ``input_ids`` and answers ``output_ids``, as SGLang does, with
``meta_info.output_top_logprobs`` when asked (``return_logprob``, ``top_logprobs_num``).
``--tp-size``/``--ep-size`` are taken as SGLang takes them and change nothing, unless
``FAKE_SGLANG_DIFFER=TP,EP,POSITION`` plants a different token at that position for that
leg (check 7's tests). Beside the pid file, ``NAME.leg.json`` records the parallel sizes
and environment it was given.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SKIPPED = ("[Autotuner]: Skipping tactic <flashinfer.fused_moe.core.get_cutlass_fused_moe_"
           "module.<locals>.MoERunner object at 0x7f2c5d1e4b10> 17, due to failure while "
           "profiling: [TensorRT-LLM][ERROR] Assertion failed: Failed to initialize cutlass "
           "TMA WS grouped gemm. Error: Error Internal (/opt/flashinfer/data/csrc/nv_internal/"
           "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/"
           "moe_gemm_tma_ws_launcher.inl:698)")

RUNNER = "<flashinfer.fused_moe.core.get_cutlass_fused_moe_module.<locals>.MoERunner object>"
PROFILED = (f"[Autotuner]: profiling {RUNNER} 3, shapes=[torch.Size([8, 1024]), "
            "torch.Size([8, 2])], avg_time 0.0213")
CHOSEN = (f"[Autotuner]: profiling chosen runner: {RUNNER} 3 for "
          "('trtllm::fused_moe::gemm1', 'MoERunner', (8,))")
#: What check 7 sets in the server's environment (recorded in the pid file).
PARALLEL_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
                "FLASHINFER_DISABLE_JIT")

MISSING = (f"[Autotuner]: Skipping tactic {RUNNER} 0, due to failure while profiling: "
           "trtllm_utils: the required module is not found in the JIT cache and JIT "
           "compilation is disabled (FLASHINFER_DISABLE_JIT=1)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid-file", type=Path, required=True)
    parser.add_argument("--mode", default="ok")
    parser.add_argument("--load-seconds", type=float, default=0.2)
    parser.add_argument("--skip-tokenizer-init", action="store_true")
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--ep-size", type=int, default=1)
    args = parser.parse_args()
    # SGLang sets FlashInfer's logger to ERROR unless SGLANG_LOGGING_CONFIG_PATH is set.
    config = os.environ.get("SGLANG_LOGGING_CONFIG_PATH")
    debug = os.environ.get("FLASHINFER_LOGGING_LEVEL", "info").lower() == "debug" and \
        bool(config) and Path(config).is_file()
    if args.mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child_code = ("import signal, time\n"
                  + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                     if args.mode == "stubborn" else "")
                  + "time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", child_code])
    args.pid_file.write_text(json.dumps({"server": os.getpid(), "child": child.pid}))
    args.pid_file.with_suffix(".leg.json").write_text(json.dumps({
        "tp": args.tp_size, "ep": args.ep_size,
        "env": {k: os.environ.get(k) for k in PARALLEL_ENV}}))
    planted = os.environ.get("FAKE_SGLANG_DIFFER", "")
    differ = tuple(int(v) for v in planted.split(",")) if planted else None
    state = {"ready": False}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *values: object) -> None:
            print(f"INFO:     127.0.0.1 - {format % values}", flush=True)

        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate"):
                self.send_response(200 if state["ready"] else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self.send_error(404)

        def do_POST(self) -> None:
            if self.path != "/generate":
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if args.skip_tokenizer_init:
                ids = [] if args.mode == "empty-text" else \
                    [7 + i for i in range(body["sampling_params"]["max_new_tokens"])]
                if differ and differ[:2] == (args.tp_size, args.ep_size):
                    ids[differ[2]] += 1
                meta: dict[str, object] = {"prompt_tokens": len(body["input_ids"]),
                                           "completion_tokens": len(ids)}
                if body.get("return_logprob"):
                    meta["output_top_logprobs"] = [
                        [(-0.25 - 0.5 * k, i + k, None)
                         for k in range(body["top_logprobs_num"])] for i in ids]
                answer = json.dumps({"output_ids": ids, "meta_info": meta}).encode()
            else:
                text = "" if args.mode == "empty-text" else " Paris. It is known for"
                answer = json.dumps({"text": text, "meta_info": {
                    "prompt_tokens": len(body["text"].split()),
                    "completion_tokens": 6}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log = lambda text: print(f"[2026-11-30 10:00:00] {text}", flush=True)  # noqa: E731
    log("server_args=ServerArgs(model_path='/models/fake', moe_runner_backend="
        "'flashinfer_cutlass', ...)")
    log("Load weight begin. avail mem=139.20 GB")
    time.sleep(args.load_seconds)
    if args.mode == "crash":
        log("Scheduler hit an exception: Traceback (most recent call last):")
        print("RuntimeError: CUDA error: no kernel image is available for execution on the "
              "device", flush=True)
        child.kill()
        return 1
    if args.mode == "hang":
        time.sleep(3600)
    if args.mode != "no-autotune":
        log("Running FlashInfer autotune...")
        print("2026-11-30 10:00:01,000 - INFO - autotuner.py:256 - flashinfer.jit: "
              "[Autotuner]: Autotuning process starts ...", flush=True)
        if args.mode == "untuned":
            if debug:
                for _ in range(3):
                    print(f"2026-11-30 10:00:02,000 - DEBUG - autotuner.py:1306 - "
                          f"flashinfer.jit: {MISSING}", flush=True)
            print("2026-11-30 10:00:02,000 - INFO - autotuner.py:1351 - flashinfer.jit: "
                  "[Autotuner]: Skipped 3 unsupported tactic(s) for trtllm::fused_moe::gemm1 "
                  "(enable debug logs to see details)", flush=True)
        else:
            print(f"2026-11-30 10:00:02,000 - WARNING - autotuner.py:497 - flashinfer.jit: "
                  f"{SKIPPED}", flush=True)
            if debug:
                for line in (PROFILED, CHOSEN):
                    print(f"2026-11-30 10:00:02,500 - DEBUG - autotuner.py:1496 - "
                          f"flashinfer.jit: {line}", flush=True)
        print("2026-11-30 10:00:03,000 - INFO - autotuner.py:262 - flashinfer.jit: "
              "[Autotuner]: Autotuning process ends", flush=True)
        log("FlashInfer autotune completed.")
    state["ready"] = True
    log("The server is fired up and ready to roll!")
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
