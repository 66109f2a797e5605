"""Default against tuned tactic of FlashInfer's CUTLASS fused MoE at the shapes users serve.

Issue 27, part 1. For each model shape (DeepSeek-V3 and GLM-5 at the per-GPU expert width of
tensor parallelism 8 and 4, Qwen3-30B-A3B at TP 1), each dtype (bf16, fp8) and each token
count, ``flashinfer.fused_moe.cutlass_fused_moe`` is timed with its default tactic (nothing
tuned yet), then FlashInfer's autotuner (``flashinfer.autotuner.autotune``, with
``tuning_buckets`` set to the token counts timed) picks a tactic per GEMM and bucket, and the
same calls are timed again. Timing: CUDA events per call, ``--warmup`` calls first, then
``--iterations`` (at least 50) timed calls; the median with p10 and p90 is reported.

Weights and activations are random (a kernel's time does not depend on the values);
routing is uniform random top-k over the experts. The kernels come from the carried kernel
wheel with ``FLASHINFER_DISABLE_JIT=1`` (set by the caller), so nothing is compiled.

Model shapes, from each model's published configuration: DeepSeek-V3 ``hidden_size`` 7168,
``moe_intermediate_size`` 2048, ``n_routed_experts`` 256, ``num_experts_per_tok`` 8; GLM-5
hidden 6144, expert FFN 2048, 256 routed experts, top-8 (the GlmMoeDsa configuration in
transformers and slime's GLM-5 model script); Qwen3-30B-A3B hidden 2048,
``moe_intermediate_size`` 768, 128 experts, top-8. Under TP N each GPU holds every expert
with ``moe_intermediate_size / N`` columns (SGLang's default MoE sharding without expert
parallelism).

``--check`` validates the arguments and prints the plan (shapes, weight memory) without
importing torch: the CPU part, tested by ``tests/benchmarks/test_bench_moe_shapes.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

#: The token counts the issue asks for.
TOKENS: Final = (1, 16, 128, 1024, 8192)
DTYPES: Final = ("bf16", "fp8")
MIN_ITERATIONS: Final = 50
#: Bytes per weight element.
DTYPE_BYTES: Final = {"bf16": 2, "fp8": 1}
#: The lent GPU's memory (H200, 143771 MiB as nvidia-smi reads it), less a margin.
GPU_BYTES: Final = 139 * 2**30


@dataclass(frozen=True)
class MoeShape:
    """One model's MoE layer as one GPU holds it.

    Attributes:
        name: ``model-tpN``.
        hidden: the model's hidden size.
        experts: routed experts (all on each GPU: no expert parallelism).
        top_k: experts per token.
        intermediate: the per-GPU expert width (``moe_intermediate_size / tp``).
        tp: tensor parallelism the width is for.
    """

    name: str
    hidden: int
    experts: int
    top_k: int
    intermediate: int
    tp: int

    def weight_bytes(self, dtype: str) -> int:
        """Bytes of fc1 (gate and up, ``2 * intermediate x hidden``) and fc2 for all experts."""
        return self.experts * 3 * self.intermediate * self.hidden * DTYPE_BYTES[dtype]


def _shapes() -> dict[str, MoeShape]:
    table = [("deepseek-v3", 7168, 256, 8, 2048, (8, 4)),
             ("glm-5", 6144, 256, 8, 2048, (8, 4)),
             ("qwen3-30b-a3b", 2048, 128, 8, 768, (1,))]
    shapes = {}
    for model, hidden, experts, top_k, inter, tps in table:
        for tp in tps:
            name = f"{model}-tp{tp}"
            shapes[name] = MoeShape(name, hidden, experts, top_k, inter // tp, tp)
    return shapes


#: Every shape this benchmark knows, by name.
SHAPES: Final = _shapes()


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values`` by linear interpolation (numpy's default).

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise(times_ms: Sequence[float]) -> dict[str, float]:
    """Median, p10 and p90 (milliseconds) and the run count of one timing series."""
    return {"median_ms": statistics.median(times_ms), "p10_ms": percentile(times_ms, 0.1),
            "p90_ms": percentile(times_ms, 0.9), "runs": len(times_ms)}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate the command line; a bad value exits 2 with one message."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help=f"comma-separated, from: {', '.join(SHAPES)}")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--deadline-s", type=float, default=0.0,
                        help="stop starting new (shape, dtype) cases after this many seconds")
    parser.add_argument("--output", type=Path, help="append one JSON line per result here")
    parser.add_argument("--autotune-cache", type=Path,
                        help="FlashInfer's autotune config file (autotune(cache=...)): read "
                        "before tuning, written after; a second run with the same file "
                        "times the tuning with a warm cache")
    parser.add_argument("--check", action="store_true",
                        help="validate and print the plan as JSON; needs no GPU or torch")
    args = parser.parse_args(argv)
    args.shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown or not args.shapes:
        parser.error(f"unknown shape(s) {unknown or args.shapes}: choose from "
                     f"{', '.join(SHAPES)}")
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    if not args.dtypes or any(d not in DTYPES for d in args.dtypes):
        parser.error(f"--dtypes {args.dtypes}: choose from {', '.join(DTYPES)}")
    try:
        args.tokens = sorted({int(t) for t in args.tokens.split(",") if t})
    except ValueError:
        parser.error(f"--tokens must be comma-separated integers, got {args.tokens!r}")
    if not args.tokens or args.tokens[0] < 1:
        parser.error("--tokens must be positive integers")
    if args.iterations < MIN_ITERATIONS:
        parser.error(f"--iterations {args.iterations}: at least {MIN_ITERATIONS} runs "
                     "are needed for a median and spread")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1")
    for name in args.shapes:
        for dtype in args.dtypes:
            need = SHAPES[name].weight_bytes(dtype)
            if need > GPU_BYTES:
                parser.error(f"{name} {dtype}: weights need {need / 2**30:.1f} GiB, more "
                             f"than the GPU's {GPU_BYTES / 2**30:.0f} GiB")
    return args


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """What a run would measure, with each case's weight memory (GiB)."""
    return {"tokens": args.tokens, "iterations": args.iterations, "warmup": args.warmup,
            "cases": [{**asdict(SHAPES[s]), "dtype": d,
                       "weight_gib": round(SHAPES[s].weight_bytes(d) / 2**30, 3)}
                      for s in args.shapes for d in args.dtypes]}


def report_table(rows: Iterable[dict[str, Any]]) -> str:
    """A Markdown table of result rows (the ``kind == "timing"`` lines of ``--output``).

    Columns: shape (``name``), dtype, tokens, default and tuned median with p10-p90 (ms), and
    default/tuned (the ratio of medians; above 1 means tuning helped).
    """
    lines = ["| shape | dtype | tokens | default ms (p10-p90) | tuned ms (p10-p90) | "
             "default/tuned |", "| --- | --- | ---: | --- | --- | ---: |"]
    for r in rows:
        d, t = r["default"], r["tuned"]
        lines.append(f"| {r['name']} | {r['dtype']} | {r['tokens']} | "
                     f"{d['median_ms']:.4f} ({d['p10_ms']:.4f}-{d['p90_ms']:.4f}) | "
                     f"{t['median_ms']:.4f} ({t['p10_ms']:.4f}-{t['p90_ms']:.4f}) | "
                     f"{d['median_ms'] / t['median_ms']:.2f}x |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The GPU part: imports torch and FlashInfer only when run.


def _time_series(run: Callable[[], object], warmup: int, iterations: int) -> list[float]:
    import torch

    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _case(shape: MoeShape, dtype: str, args: argparse.Namespace,
          emit: Callable[[dict[str, Any]], None]) -> None:
    import torch
    from flashinfer.autotuner import AutoTuner, autotune
    from flashinfer.fused_moe import cutlass_fused_moe
    from flashinfer.jit.core import logger

    gen = torch.Generator(device="cuda").manual_seed(0)
    e, h, i, k = shape.experts, shape.hidden, shape.intermediate, shape.top_k
    w31 = torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16, generator=gen) / 5
    w2 = torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16, generator=gen) / 5
    scales = None
    if dtype == "fp8":
        # Per-tensor scales of 1: the values are random, only the kernel's time is measured.
        w31, w2 = w31.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn)
        one_e = torch.ones(e, device="cuda", dtype=torch.float32)
        one = torch.ones((), device="cuda", dtype=torch.float32)
        scales = [one_e, one, one_e, one]
    max_tokens = max(args.tokens)
    inputs = {}
    for n in args.tokens:
        x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, generator=gen) / 5
        if dtype == "fp8":
            x = x.to(torch.float8_e4m3fn)
        logits = torch.randn(n, e, device="cuda", generator=gen)
        weights, experts = torch.topk(torch.softmax(logits, -1), k, dim=-1)
        inputs[n] = (x, experts.to(torch.int32), (weights / weights.sum(-1, keepdim=True)),
                     torch.empty(n, h, device="cuda", dtype=torch.bfloat16))

    def runner(n: int) -> Callable[[], object]:
        x, experts, weights, out = inputs[n]
        return lambda: cutlass_fused_moe(x, experts, weights, w31, w2, torch.bfloat16,
                                         quant_scales=scales, output=out,
                                         tune_max_num_tokens=max_tokens)

    default = {}
    default_out = {}
    for n in args.tokens:
        default[n] = summarise(_time_series(runner(n), args.warmup, args.iterations))
        default_out[n] = inputs[n][3].clone()
    collect = _Collect()
    level = logger.level
    logger.addHandler(collect)
    logger.setLevel(logging.DEBUG)
    # FlashInfer's logger is made by its constructor, not logging.getLogger, so setLevel
    # does not clear its isEnabledFor cache: a debug call made before would stay disabled.
    getattr(logger, "_cache", {}).clear()
    tuner = AutoTuner.get()
    before = set(tuner.profiling_cache)
    started = time.monotonic()
    try:
        cache = str(args.autotune_cache) if args.autotune_cache else None
        with autotune(cache=cache, tuning_buckets=tuple(args.tokens)):
            runner(max_tokens)()
        torch.cuda.synchronize()
    finally:
        logger.removeHandler(collect)
        logger.setLevel(level)
        getattr(logger, "_cache", {}).clear()
    tune_s = time.monotonic() - started
    chosen = {str(key): repr(value[1]) for key, value in tuner.profiling_cache.items()
              if key not in before}
    profiled = sum(1 for line in collect.lines
                   if line.startswith("[Autotuner]: profiling ") and ", avg_time " in line)
    skipped = sum(1 for line in collect.lines if "Skipping tactic" in line)
    emit({"kind": "autotune", "shape": shape.name, "dtype": dtype, "seconds": tune_s,
          "cache_file": str(args.autotune_cache) if args.autotune_cache else None,
          "tactics_profiled": profiled, "tactics_skipped": skipped,
          "profiles": len(chosen), "chosen": chosen,
          "log_sample": [ln for ln in collect.lines if "profiling" in ln][:6]})
    for n in args.tokens:
        tuned = summarise(_time_series(runner(n), args.warmup, args.iterations))
        out = inputs[n][3].float()
        ref = default_out[n].float()
        diff = float((out - ref).abs().max()) / (float(ref.abs().max()) or 1.0)
        emit({"kind": "timing", **asdict(shape), "dtype": dtype, "tokens": n,
              "default": default[n], "tuned": tuned,
              "default_over_tuned": default[n]["median_ms"] / tuned["median_ms"],
              "tuned_vs_default_rel_diff": diff})
    torch.cuda.empty_cache()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with ``--check``, print its plan); returns the exit status."""
    args = parse_args(argv)
    if args.check:
        print(json.dumps(plan(args), indent=2))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_moe_shapes: no CUDA device; run it on a GPU machine", file=sys.stderr)
        return 3
    sink = args.output.open("a") if args.output else None

    def emit(row: dict[str, Any]) -> None:
        line = json.dumps(row)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")
            sink.flush()

    emit({"kind": "environment", "gpu": torch.cuda.get_device_name(),
          "capability": list(torch.cuda.get_device_capability()),
          "torch": torch.__version__, "plan": plan(args)})
    started = time.monotonic()
    for name in args.shapes:
        for dtype in args.dtypes:
            if args.deadline_s and time.monotonic() - started > args.deadline_s:
                emit({"kind": "not_run", "shape": name, "dtype": dtype,
                      "reason": f"deadline of {args.deadline_s} s passed"})
                continue
            try:
                _case(SHAPES[name], dtype, args, emit)
            except Exception as exc:  # one case's failure is reported, the rest still run
                emit({"kind": "error", "shape": name, "dtype": dtype,
                      "error": f"{type(exc).__name__}: {exc}"[:2000]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
