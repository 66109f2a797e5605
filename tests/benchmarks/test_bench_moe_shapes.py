"""The CPU part of ``benchmarks/bench_moe_shapes.py``: its shape table, argument refusals,
spread statistics and report table. The GPU part ran on a lent H200
(``reports/2026-12-01-h200-moe-shapes/``); nothing here needs torch or a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
from types import ModuleType

import pytest

from tests.helpers.paths import REPO

ROOT = REPO
SCRIPT = ROOT / "benchmarks" / "bench_moe_shapes.py"
REPORT = ROOT / "reports" / "2026-12-01-h200-moe-shapes"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_moe_shapes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bench = _module()


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--check", *args],
                          capture_output=True, text=True, check=False, timeout=60)


def test_shapes_are_the_issues_models_at_their_per_gpu_width() -> None:
    # moe_intermediate_size / TP, all experts on each GPU (no expert parallelism).
    got = {name: (s.hidden, s.experts, s.top_k, s.intermediate, s.tp)
           for name, s in bench.SHAPES.items()}
    assert got == {
        "deepseek-v3-tp8": (7168, 256, 8, 2048 // 8, 8),
        "deepseek-v3-tp4": (7168, 256, 8, 2048 // 4, 4),
        "glm-5-tp8": (6144, 256, 8, 2048 // 8, 8),
        "glm-5-tp4": (6144, 256, 8, 2048 // 4, 4),
        "qwen3-30b-a3b-tp1": (2048, 128, 8, 768, 1),
    }


def test_plan_gives_each_cases_weight_memory() -> None:
    done = _check("--shapes", "deepseek-v3-tp4", "--dtypes", "bf16,fp8")
    assert done.returncode == 0, done.stderr
    cases = json.loads(done.stdout)["cases"]
    # fc1 holds gate and up (2 x 512 x 7168), fc2 512 x 7168, for 256 experts.
    elements = 256 * (2 * 512 * 7168 + 7168 * 512)
    assert [(c["dtype"], c["weight_gib"]) for c in cases] == [
        ("bf16", round(elements * 2 / 2**30, 3)), ("fp8", round(elements / 2**30, 3))]
    assert json.loads(done.stdout)["tokens"] == [1, 16, 128, 1024, 8192]


@pytest.mark.parametrize(("args", "message"), [
    (["--shapes", "llama-70b"], "unknown shape(s) ['llama-70b']: choose from deepseek-v3-tp8"),
    (["--dtypes", "nvfp4"], "--dtypes ['nvfp4']: choose from bf16, fp8"),
    (["--tokens", "1,x"], "--tokens must be comma-separated integers"),
    (["--tokens", "0,16"], "--tokens must be positive integers"),
    (["--iterations", "20"], "at least 50 runs are needed"),
    (["--warmup", "0"], "--warmup must be at least 1"),
])
def test_bad_arguments_exit_2_with_one_message(args: list[str], message: str) -> None:
    done = _check(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""


def test_a_shape_larger_than_the_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # The refusal's arithmetic, on the real table: DeepSeek-V3 unsharded (TP 1) in bf16 is
    # 256 x 3 x 2048 x 7168 x 2 bytes = 21 GiB; a 16 GiB budget must refuse it.
    full = bench.MoeShape("deepseek-v3-tp1", 7168, 256, 8, 2048, 1)
    monkeypatch.setitem(bench.SHAPES, full.name, full)
    monkeypatch.setattr(bench, "GPU_BYTES", 16 * 2**30)
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--shapes", full.name, "--dtypes", "bf16", "--check"])
    assert exit_info.value.code == 2
    assert full.weight_bytes("bf16") == 256 * 3 * 2048 * 7168 * 2


def test_spread_matches_the_standard_librarys_quantiles() -> None:
    values = [float(v) for v in (9, 1, 7, 3, 5, 8, 2, 6, 4, 10, 11)]
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    got = bench.summarise(values)
    assert got["median_ms"] == statistics.median(values)
    assert got["p10_ms"] == pytest.approx(cuts[0])
    assert got["p90_ms"] == pytest.approx(cuts[-1])
    assert got["runs"] == len(values)
    with pytest.raises(ValueError, match="no values"):
        bench.percentile([], 0.5)


def test_report_table_of_the_h200_run_has_one_row_per_timing() -> None:
    rows = [json.loads(line) for line in
            (REPORT / "moe-shapes-1.jsonl").read_text().splitlines()]
    timings = [r for r in rows if r["kind"] == "timing"]
    table = bench.report_table(timings).splitlines()
    assert len(table) == 2 + len(timings) == 2 + 5 * 2 * 5
    first = timings[0]
    ratio = first["default"]["median_ms"] / first["tuned"]["median_ms"]
    assert table[2].startswith(f"| {first['name']} | {first['dtype']} | {first['tokens']} |")
    assert table[2].endswith(f"| {ratio:.2f}x |")
