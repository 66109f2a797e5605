"""Benchmark the CLI's start: stages imported on first use (PEP 562, per-command imports).

Reported as figures measured in one run on one machine (ratios within that run), each the
median of ``--runs`` fresh processes:

1. ``python -m builder targets --json`` against a bare interpreter start (``python -c
   pass``), as a ratio of wall times and of CPU times (user + system; the steadier one
   on a shared machine): what the builder itself costs. Goal: <= 4x (wall). Its
   yardstick is pypa/build's ``python -m build --version`` against the same bare start.
2. ``import builder`` against importing every stage module eagerly (what ``import
   builder`` used to do), as a ratio: what the lazy surface saves.

The commands of one figure run in turn, ``--runs`` rounds, so load from other work on a
shared machine falls on all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RATIO_GOAL = 4.0
EVERY_STAGE = ("import builder.cli.main, builder.source.fetch, builder.patching.apply, "
               "builder.patching.matrix, builder.patching.refresh, builder.wheel.build, "
               "builder.kernels.run, builder.kernels.preflight, builder.image.run, "
               "builder.smoke.gpu, builder.smoke.static, builder.release.run, "
               "builder.targets.plan, builder.targets.upstream")


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one fresh process of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def medians(commands: dict[str, list[str]], runs: int) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds of each command, the commands run in turn ``runs`` times."""
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            figures[name].append(timed(argv))
    return {name: (statistics.median(w for w, _ in runs_),
                   statistics.median(c for _, c in runs_))
            for name, runs_ in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15, help="processes per figure")
    args = parser.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed builder has bytecode
    python = sys.executable
    commands = {"bare": [python, "-c", "pass"],
                "targets": [python, "-m", "builder", "targets", "--json"],
                "build_version": [python, "-m", "build", "--version"]}
    imports = {"lazy": [python, "-c", "import builder"], "eager": [python, "-c", EVERY_STAGE]}
    for warm in (*commands.values(), *imports.values()):
        subprocess.run(warm, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)  # .pyc, caches
    start = medians(commands, args.runs)
    imported = medians(imports, args.runs)
    (bare, bare_cpu), (targets, targets_cpu) = start["bare"], start["targets"]
    build_version, build_cpu = start["build_version"]
    result: dict[str, Any] = {
        "targets_s": round(targets, 3), "targets_cpu_s": round(targets_cpu, 3),
        "bare_interpreter_s": round(bare, 3), "bare_interpreter_cpu_s": round(bare_cpu, 3),
        "targets_vs_bare_interpreter": round(targets / bare, 2),
        "targets_vs_bare_interpreter_cpu": round(targets_cpu / bare_cpu, 2),
        "goal": RATIO_GOAL, "goal_met": targets / bare <= RATIO_GOAL,
        "build_version_s": round(build_version, 3),
        "build_version_vs_bare_interpreter": round(build_version / bare, 2),
        "build_version_vs_bare_interpreter_cpu": round(build_cpu / bare_cpu, 2),
        "import_builder_s": round(imported["lazy"][0], 3),
        "import_every_stage_s": round(imported["eager"][0], 3),
        "import_builder_vs_every_stage": round(imported["lazy"][0] / imported["eager"][0], 2),
        "runs": args.runs,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
