"""Benchmark the start of ``kernels --request FILE``: what a build container runs.

The request path reads a saved request and builds it; it needs neither the upstream source
nor the source stage (gitpython, remotezip, ``builder.source``). Measured as the median of
``--runs`` fresh processes of ``kernels plan --request R --output OUT`` (the request is
read, checked and written back: every module of the build is imported, nothing compiles),
reported as a ratio to ``python -c 'import builder'`` in the same run, with the source-stage
modules the process imported (from ``-X importtime``).

Measured here (2 cores shared with a loaded machine, load average 8-10, so compare the
ratios, two runs of 9 and 15 processes each): before (fc3af64, the request path imported
43 source-stage modules: git, remotezip, builder.source ...) 1.40 s and 1.83 s,
12.7x and 16.5x ``import builder``; after, none of them: 0.59 s and 0.85 s, 4.8x and 5.6x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ONLY = ("git", "remotezip", "builder.source")
REQUEST = {"target": "sglang-0.5.9", "version": "0.6.3+sm120.1.cu129", "arch_list": ["12.0a"],
           "cuda_lane": "12.9", "groups": ["norm"], "head_dims": [], "epoch": 1771834439,
           "pins": {"flashinfer_python": "0.6.3", "flashinfer_cubin": "0.6.3",
                    "kernel": ["sgl-kernel", "0.3.21"], "torch": "torch==2.9.1",
                    "cuda_python": "cuda-python==12.9"}}


def median_seconds(argv: list[str], runs: int) -> float:
    """Median wall time of ``runs`` fresh processes of ``argv`` (run from the project root)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def source_modules(argv: list[str]) -> list[str]:
    """The source-stage modules ``argv`` imports (``python -X importtime`` lines)."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], cwd=ROOT, check=True,
                          capture_output=True, text=True)
    names = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
             if line.startswith("import time:") and line.count("|") == 2}
    return sorted(n for n in names if any(n == top or n.startswith(top + ".")
                                          for top in SOURCE_ONLY))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15, help="processes per figure")
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-kernels-start-") as scratch:
        request = Path(scratch) / "request.json"
        request.write_text(json.dumps(REQUEST))
        command = [python, "-m", "builder", "kernels", "plan", "--request", str(request),
                   "--output", str(Path(scratch) / "again.json"),
                   "--cache-dir", str(Path(scratch) / "cache")]
        for warm in (command, [python, "-c", "import builder"]):
            subprocess.run(warm, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)  # .pyc
        imported = source_modules(command)
        start = median_seconds(command, args.runs)
        bare = median_seconds([python, "-c", "import builder"], args.runs)
    print(json.dumps({"kernels_request_s": round(start, 3),
                      "import_builder_s": round(bare, 3),
                      "kernels_request_vs_import_builder": round(start / bare, 2),
                      "source_stage_modules": len(imported),
                      "source_stage_imported": imported[:10],
                      "runs": args.runs}, indent=2))


if __name__ == "__main__":
    main()
