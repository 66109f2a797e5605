"""Benchmark the wheel stage against a plain ``python -m build --wheel``.

Measured in one run, on one machine, and reported as ratios within that run (absolute
seconds depend on the machine and are given only for context):

1. Cold build: ``builder.run_wheel`` with a brand-new cache that holds only the
   already-downloaded sdist, so unpacking, patching and building are timed but the
   network download is not. It is compared with ``python -m build --wheel`` (same
   interpreter, same version override, ``SOURCE_DATE_EPOCH`` and build pins through
   ``PIP_CONSTRAINT``) on a fresh copy of the same unpacked sdist tree. The two sides run
   alternately, ``--rounds`` times while ``--budget`` allows, and the minimum of each side
   is kept, which filters out noise from caches warming and other load.
   Goal: builder / plain <= 1.2.
2. Warm rebuild: the same build again with the now-warm cache (nothing changed).
   Goal: < 2 s, served from the cache (``WheelResult.cached``).
3. No-op rebuild, whole process: ``python -m builder wheel`` with everything cached, as a
   user runs it (start-up and imports included), against ``python -c pass``. Bytecode
   is written on a first, untimed run, as an installed builder has it. Each side runs
   ``--noop-runs`` times and the minimum is kept, of wall time and of CPU time (user +
   system, children included): on a shared machine the CPU figure is the steadier one.
   Goal: no-op rebuild <= 0.3 s whole process.

The script reports; it never fails on a missed goal (exit status 0).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from builder import Options, load_targets, run_fetch
from builder.wheel.build import build_constraints, run_wheel

ROOT = Path(__file__).resolve().parent.parent
RATIO_GOAL = 1.2
WARM_GOAL_S = 2.0
NOOP_GOAL_S = 0.3


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run ``cmd`` to completion; return its wall and CPU seconds (user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def noop_rebuild(cache: Path, dist: Path, target: str, runs: int) -> dict[str, float]:
    """Whole-process figures of a no-op ``python -m builder wheel`` and ``python -c pass``
    (the minimum of ``runs`` runs each, after one untimed run that writes bytecode)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(SGLANG_SM120_CACHE=str(cache), PYTHONPATH=str(ROOT))
    wheel = [sys.executable, "-m", "builder", "wheel", "--target", target,
             "--targets-file", str(ROOT / "targets.toml"), "--dist", str(dist)]
    baseline = [sys.executable, "-c", "pass"]
    figures: dict[str, list[tuple[float, float]]] = {"wheel": [], "pass": []}
    timed(wheel, env)
    for _ in range(runs):
        figures["wheel"].append(timed(wheel, env))
        figures["pass"].append(timed(baseline, env))
    return {f"{side}_{measure}_s": min(run[i] for run in figures[side])
            for side in figures for i, measure in enumerate(("wall", "cpu"))}


def builder_cold(work: Path, download: Path, target: str, run: int) -> tuple[float, str]:
    """Time a builder build from a fresh cache seeded with only the sdist download."""
    cache = work / f"cache-{run}"
    shutil.copytree(download / "downloads", cache / "downloads")
    options = Options(targets_file=ROOT / "targets.toml", target=target, cache_dir=cache,
                      dist_dir=work / f"dist-builder-{run}")
    start = time.perf_counter()
    result = run_wheel(options)
    return time.perf_counter() - start, result.sha256


def plain_cold(work: Path, tree: Path, env: dict[str, str], run: int) -> float:
    """Time ``python -m build --wheel`` on a fresh copy of the unpacked sdist."""
    copy = work / f"plain-{run}"
    shutil.copytree(tree, copy, symlinks=True)
    for stale in [*copy.glob("*.egg-info"), copy / "build"]:
        if stale.is_dir():
            shutil.rmtree(stale)
    cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(work / f"dist-plain-{run}"),
           str(copy)]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"plain build failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                 f"{done.stderr[-3000:]}")
    return elapsed


def measure(target: str, rounds: int, budget: float, work: Path,
            noop_runs: int = 5) -> dict[str, Any]:
    """Run the cold comparison and the warm rebuild; return the figures."""
    t0 = time.perf_counter()
    download = work / "download"
    chosen = load_targets(ROOT / "targets.toml").get(target)
    source = run_fetch(Options(targets_file=ROOT / "targets.toml", target=chosen.name,
                               cache_dir=download))
    version = f"{source.upstream_version}+{chosen.local_label}"
    constraints = work / "constraints.txt"
    constraints.write_text("\n".join(build_constraints()) + "\n")
    env = {**os.environ, "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG": version,
           "SOURCE_DATE_EPOCH": str(source.source_date_epoch),
           "PIP_CONSTRAINT": str(constraints)}
    builder_s: list[float] = []
    plain_s: list[float] = []
    digests: list[str] = []
    start = time.perf_counter()
    for run in range(rounds):
        if run and (time.perf_counter() - start) / run * (run + 1) > budget:
            break  # another round would overrun the budget
        seconds, digest = builder_cold(work, download, chosen.name, run)
        builder_s.append(seconds)
        digests.append(digest)
        plain_s.append(plain_cold(work, source.tree, env, run))
    warm_options = Options(targets_file=ROOT / "targets.toml", target=chosen.name,
                           cache_dir=work / f"cache-{len(builder_s) - 1}",
                           dist_dir=work / "dist-warm")
    warm_start = time.perf_counter()
    warm = run_wheel(warm_options)
    warm_s = time.perf_counter() - warm_start
    ratio = min(builder_s) / min(plain_s)
    noop = noop_rebuild(warm_options.cache_dir, work / "dist-noop", chosen.name, noop_runs)
    return {
        "target": chosen.name, "version": version, "rounds": len(builder_s),
        "cold_builder_s": builder_s, "cold_plain_s": plain_s,
        "cold_builder_min_s": min(builder_s), "cold_plain_min_s": min(plain_s),
        "cold_ratio": ratio, "cold_ratio_goal": RATIO_GOAL,
        "cold_ratio_goal_met": ratio <= RATIO_GOAL,
        "warm_s": warm_s, "warm_cached": warm.cached, "warm_goal_s": WARM_GOAL_S,
        "warm_goal_met": warm_s < WARM_GOAL_S,
        "cold_builds_identical": len(set(digests)) == 1 and warm.sha256 in digests,
        **{f"noop_{k}": v for k, v in noop.items()},
        "noop_wall_ratio_to_python": noop["wheel_wall_s"] / noop["pass_wall_s"],
        "noop_cpu_ratio_to_python": noop["wheel_cpu_s"] / noop["pass_cpu_s"],
        "noop_wall_ratio_to_cold": noop["wheel_wall_s"] / min(builder_s),
        "noop_goal_s": NOOP_GOAL_S, "noop_goal_met": noop["wheel_wall_s"] <= NOOP_GOAL_S,
        "total_s": time.perf_counter() - t0,
    }


def verdict(met: bool) -> str:
    return "goal met" if met else "goal missed"


def print_table(r: dict[str, Any]) -> None:
    print(f"target {r['target']} ({r['version']}); cold figures are the min of "
          f"{r['rounds']} alternating run(s) per side; ratios within this one run")
    print(f"{'measure':<34}{'seconds':>9}{'ratio':>8}  {'goal':<9}verdict")
    runs = ", ".join(f"{s:.2f}" for s in r["cold_builder_s"])
    print(f"{'cold builder (sdist cached)':<34}{r['cold_builder_min_s']:>9.2f}"
          f"{'':>8}  {'':<9}runs: {runs}")
    runs = ", ".join(f"{s:.2f}" for s in r["cold_plain_s"])
    print(f"{'cold plain python -m build':<34}{r['cold_plain_min_s']:>9.2f}"
          f"{'':>8}  {'':<9}runs: {runs}")
    print(f"{'cold builder / plain':<34}{'':>9}{r['cold_ratio']:>7.2f}x  "
          f"{'<= 1.2x':<9}{verdict(r['cold_ratio_goal_met'])}")
    print(f"{'warm rebuild (cached=' + str(r['warm_cached']) + ')':<34}{r['warm_s']:>9.2f}"
          f"{'':>8}  {'< 2 s':<9}{verdict(r['warm_goal_met'])}")
    print(f"{'no-op rebuild, whole process':<34}{r['noop_wheel_wall_s']:>9.2f}"
          f"{'':>8}  {'<= 0.3 s':<9}{verdict(r['noop_goal_met'])}")
    print(f"{'  / python -c pass (wall)':<34}{r['noop_pass_wall_s']:>9.2f}"
          f"{r['noop_wall_ratio_to_python']:>7.1f}x")
    print(f"{'  / python -c pass (CPU)':<34}{r['noop_wheel_cpu_s']:>9.2f}"
          f"{r['noop_cpu_ratio_to_python']:>7.1f}x  (CPU s of the rebuild; python's "
          f"{r['noop_pass_cpu_s']:.3f})")
    print(f"{'  / cold builder build (wall)':<34}{'':>9}{r['noop_wall_ratio_to_cold']:>7.3f}x")
    print(f"builder wheels byte-identical across runs: {r['cold_builds_identical']}; "
          f"total benchmark time {r['total_s']:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="target name (default: the targets file's default)")
    parser.add_argument("--json", action="store_true", help="print a JSON object instead")
    parser.add_argument("--rounds", type=int, default=2, help="alternating cold rounds")
    parser.add_argument("--noop-runs", type=int, default=5,
                        help="whole-process no-op rebuilds (and python -c pass runs)")
    parser.add_argument("--budget", type=float, default=300.0,
                        help="seconds of cold building after which no new round starts")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-wheel-"))
    try:
        result = measure(args.target, max(args.rounds, 1), args.budget, work,
                         max(args.noop_runs, 1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
