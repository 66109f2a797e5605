"""Benchmark the wheel stage as a user runs it: whole processes against their yardsticks.

Measured in one run, on one machine, and reported as ratios within that run (absolute
seconds depend on the machine and are given only for context). Every figure is the
median of its repetitions; the two sides of a ratio run alternately, so load from other
work on a shared machine falls on both.

1. Cold build: ``python -m builder wheel`` with a brand-new cache that holds only the
   already-downloaded sdist (unpacking, patching, building and packing are timed; the
   network download is not), against ``python -m build --wheel`` (same interpreter,
   same version override, ``SOURCE_DATE_EPOCH`` and build pins through
   ``PIP_CONSTRAINT``) on a fresh copy of the same unpacked sdist tree.
   Goal: builder / plain <= 1.2 (wall); the peak memory (``ru_maxrss`` of each process
   and the children it waited for, from ``wait4``) of both is reported beside it.
2. No-op rebuild: the same ``python -m builder wheel`` again, everything cached (start-up
   and imports included; bytecode written by an untimed first run, as an installed
   builder has it), against ``python -c pass``. Goal: <= 0.3 s wall (median).

Every builder run prints ``--json``; the cold builds must give the same sha256 and the
no-op runs must say ``cached``. The script reports; it never fails on a missed goal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from builder import Options, load_targets, run_fetch
from builder.wheel.build import build_constraints

ROOT = Path(__file__).resolve().parent.parent
RATIO_GOAL = 1.2
NOOP_GOAL_S = 0.3


#: Runs its arguments as one child and writes the child's figures as JSON to argv[1]. A
#: forked child starts with its parent's peak memory (Linux copies the high-water mark at
#: fork and keeps it across exec), so the measured command is started from this small
#: process, not from the benchmark, which has imported the builder.
_MEASURE = """
import json, os, subprocess, sys, time
start = time.perf_counter()
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
json.dump({"wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime,
           "peak_mib": usage.ru_maxrss / 1024, "status": os.waitstatus_to_exitcode(status)},
          open(sys.argv[1], "w"))
"""


def run_process(cmd: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """Run ``cmd`` to completion as one process, from a small measuring parent.

    Returns:
        ``wall_s``, ``cpu_s`` (user + system of it and the children it waited for),
        ``peak_mib`` (their largest ``ru_maxrss``, from ``wait4(2)``; KiB on Linux) and
        ``stdout``.

    Raises:
        SystemExit: the command failed (its stderr's tail is shown).
    """
    with tempfile.TemporaryDirectory() as folder:
        figures = Path(folder) / "figures.json"
        done = subprocess.run([sys.executable, "-c", _MEASURE, str(figures), *cmd], cwd=cwd,
                              env=env, capture_output=True, text=True, check=False)
        result: dict[str, Any] = json.loads(figures.read_text()) if figures.is_file() else {}
    if done.returncode != 0 or result.get("status") != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return {**result, "stdout": done.stdout}


def median(runs: list[dict[str, Any]], field: str) -> float:
    """The median of ``field`` over ``runs``."""
    return float(statistics.median(float(run[field]) for run in runs))


def measure(target: str | None, rounds: int, noop_runs: int, work: Path,
            seed: Path | None = None) -> dict[str, Any]:
    """Run the cold comparison and the no-op rebuilds; return the figures.

    ``seed``: a cache's ``downloads`` folder copied in first (a machine offline).
    """
    t0 = time.perf_counter()
    download = work / "download"
    if seed is not None:
        shutil.copytree(seed, download / "downloads")
    chosen = load_targets(ROOT / "targets.toml").get(target)
    source = run_fetch(Options(targets_file=ROOT / "targets.toml", target=chosen.name,
                               cache_dir=download))
    version = f"{source.upstream_version}+{chosen.local_label}"
    constraints = work / "constraints.txt"
    constraints.write_text("\n".join(build_constraints()) + "\n")
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    plain_env = {**base, "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG": version,
                 "SOURCE_DATE_EPOCH": str(source.source_date_epoch),
                 "PIP_CONSTRAINT": str(constraints)}
    builder_env = {**base, "PYTHONPATH": str(ROOT)}

    def builder_cmd(cache: Path, dist: Path) -> list[str]:
        return [sys.executable, "-m", "builder", "wheel", "--json", "--target", chosen.name,
                "--targets-file", str(ROOT / "targets.toml"), "--cache-dir", str(cache),
                "--dist", str(dist)]

    builder_runs: list[dict[str, Any]] = []
    plain_runs: list[dict[str, Any]] = []
    for run in range(rounds):
        cache = work / f"cache-{run}"
        shutil.copytree(download / "downloads", cache / "downloads")
        builder_runs.append(run_process(builder_cmd(cache, work / f"dist-builder-{run}"),
                                        builder_env, ROOT))
        copy = work / f"plain-{run}"
        shutil.copytree(source.tree, copy, symlinks=True)
        for stale in [*copy.glob("*.egg-info"), copy / "build"]:
            if stale.is_dir():
                shutil.rmtree(stale)
        plain_runs.append(run_process(
            [sys.executable, "-m", "build", "--wheel", "--outdir",
             str(work / f"dist-plain-{run}"), str(copy)], plain_env, work))
        shutil.rmtree(copy)
        if run:  # keep the last cache for the no-op runs
            shutil.rmtree(work / f"cache-{run - 1}")
    digests = {json.loads(r["stdout"])["wheels"][0]["sha256"] for r in builder_runs}

    cache, dist = work / f"cache-{rounds - 1}", work / "dist-noop"
    noop_cmd, bare_cmd = builder_cmd(cache, dist), [sys.executable, "-c", "pass"]
    run_process(noop_cmd, builder_env, ROOT)  # writes bytecode, as an installed builder has
    noop_runs_: list[dict[str, Any]] = []
    bare_runs: list[dict[str, Any]] = []
    for _ in range(noop_runs):
        noop_runs_.append(run_process(noop_cmd, builder_env, ROOT))
        bare_runs.append(run_process(bare_cmd, builder_env, ROOT))
    cached = all(w["cached"] for r in noop_runs_ for w in json.loads(r["stdout"])["wheels"])

    cold_builder, cold_plain = median(builder_runs, "wall_s"), median(plain_runs, "wall_s")
    noop_wall, bare_wall = median(noop_runs_, "wall_s"), median(bare_runs, "wall_s")
    return {
        "target": chosen.name, "version": version, "rounds": rounds, "noop_runs": noop_runs,
        "cold_builder_s": [round(r["wall_s"], 2) for r in builder_runs],
        "cold_plain_s": [round(r["wall_s"], 2) for r in plain_runs],
        "cold_builder_median_s": cold_builder, "cold_plain_median_s": cold_plain,
        "cold_ratio": cold_builder / cold_plain, "cold_ratio_goal": RATIO_GOAL,
        "cold_ratio_goal_met": cold_builder / cold_plain <= RATIO_GOAL,
        "cold_cpu_ratio": median(builder_runs, "cpu_s") / median(plain_runs, "cpu_s"),
        "cold_builder_peak_mib": median(builder_runs, "peak_mib"),
        "cold_plain_peak_mib": median(plain_runs, "peak_mib"),
        "cold_peak_ratio": median(builder_runs, "peak_mib") / median(plain_runs, "peak_mib"),
        "cold_builds_identical": len(digests) == 1,
        "noop_s": noop_wall, "noop_cpu_s": median(noop_runs_, "cpu_s"),
        "noop_peak_mib": median(noop_runs_, "peak_mib"), "noop_cached": cached,
        "bare_interpreter_s": bare_wall, "bare_interpreter_cpu_s": median(bare_runs, "cpu_s"),
        "noop_vs_bare_interpreter": noop_wall / bare_wall,
        "noop_goal_s": NOOP_GOAL_S, "noop_goal_met": noop_wall <= NOOP_GOAL_S,
        "total_s": time.perf_counter() - t0,
    }


def verdict(met: bool) -> str:
    return "goal met" if met else "goal missed"


def print_table(r: dict[str, Any]) -> None:
    print(f"target {r['target']} ({r['version']}); medians of {r['rounds']} alternating cold "
          f"run(s) and {r['noop_runs']} no-op runs per side; ratios within this one run")
    print(f"{'measure':<36}{'value':>9}{'ratio':>8}  {'goal':<9}verdict")
    print(f"{'cold python -m builder wheel (s)':<36}{r['cold_builder_median_s']:>9.2f}"
          f"{'':>8}  {'':<9}runs: {', '.join(map(str, r['cold_builder_s']))}")
    print(f"{'cold python -m build --wheel (s)':<36}{r['cold_plain_median_s']:>9.2f}"
          f"{'':>8}  {'':<9}runs: {', '.join(map(str, r['cold_plain_s']))}")
    print(f"{'cold builder / plain (wall)':<36}{'':>9}{r['cold_ratio']:>7.2f}x  "
          f"{'<= 1.2x':<9}{verdict(r['cold_ratio_goal_met'])}")
    print(f"{'cold builder / plain (CPU)':<36}{'':>9}{r['cold_cpu_ratio']:>7.2f}x")
    print(f"{'cold peak MiB, builder / plain':<36}{r['cold_builder_peak_mib']:>9.1f}"
          f"{r['cold_peak_ratio']:>7.2f}x  (plain {r['cold_plain_peak_mib']:.1f} MiB)")
    print(f"{'no-op rebuild, whole process (s)':<36}{r['noop_s']:>9.3f}{'':>8}  "
          f"{'<= 0.3 s':<9}{verdict(r['noop_goal_met'])} (cached={r['noop_cached']})")
    print(f"{'  / python -c pass (wall)':<36}{r['bare_interpreter_s']:>9.3f}"
          f"{r['noop_vs_bare_interpreter']:>7.1f}x  (CPU {r['noop_cpu_s']:.3f} s vs "
          f"{r['bare_interpreter_cpu_s']:.3f} s; peak {r['noop_peak_mib']:.1f} MiB)")
    print(f"builder wheels byte-identical across cold runs: {r['cold_builds_identical']}; "
          f"total benchmark time {r['total_s']:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="target name (default: the targets file's default)")
    parser.add_argument("--json", action="store_true", help="print a JSON object instead")
    parser.add_argument("--rounds", type=int, default=3, help="alternating cold rounds")
    parser.add_argument("--noop-runs", type=int, default=9,
                        help="whole-process no-op rebuilds (and python -c pass runs)")
    parser.add_argument("--downloads", type=Path, metavar="DIR",
                        help="a cache's downloads folder holding the sdist (no network)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-wheel-"))
    try:
        result = measure(args.target, max(args.rounds, 1), max(args.noop_runs, 1), work,
                         args.downloads)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
