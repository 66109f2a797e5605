"""Benchmark the CLI's start: stages imported on first use (PEP 562, per-command imports).

Reported as figures measured in one run on one machine (ratios within that run), each the
median of ``--runs`` fresh processes:

1. ``python -m builder targets --json`` wall time. Goal: < 0.15 s (issue "A house a
   newcomer can read": it took 0.52 s when ``import builder`` imported every stage).
2. The same command against a bare interpreter start (``python -c pass``), as a ratio:
   what the builder itself costs.
3. ``import builder`` against importing every stage module eagerly (what ``import
   builder`` used to do), as a ratio: what the lazy surface saves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGETS_GOAL_S = 0.15
EVERY_STAGE = ("import builder.cli.main, builder.source.fetch, builder.patching.apply, "
               "builder.patching.matrix, builder.patching.refresh, builder.wheel.build, "
               "builder.kernels.run, builder.kernels.preflight, builder.image.run, "
               "builder.smoke.gpu, builder.smoke.static, builder.release.run, "
               "builder.targets.plan, builder.targets.upstream")


def median_seconds(argv: list[str], runs: int) -> float:
    """Median wall time of ``runs`` fresh processes of ``argv`` (run from the project root)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15, help="processes per figure")
    args = parser.parse_args()
    python = sys.executable
    for warm in ([python, "-m", "builder", "targets", "--json"], [python, "-c", EVERY_STAGE]):
        subprocess.run(warm, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)  # .pyc, caches
    bare = median_seconds([python, "-c", "pass"], args.runs)
    targets = median_seconds([python, "-m", "builder", "targets", "--json"], args.runs)
    lazy = median_seconds([python, "-c", "import builder"], args.runs)
    eager = median_seconds([python, "-c", EVERY_STAGE], args.runs)
    result: dict[str, Any] = {
        "targets_s": round(targets, 3), "goal_s": TARGETS_GOAL_S,
        "goal_met": targets < TARGETS_GOAL_S,
        "bare_interpreter_s": round(bare, 3),
        "targets_vs_bare_interpreter": round(targets / bare, 2),
        "import_builder_s": round(lazy, 3), "import_every_stage_s": round(eager, 3),
        "import_builder_vs_every_stage": round(lazy / eager, 2),
        "runs": args.runs,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
