"""Benchmark the patch engine: the compatibility matrix, and the matcher against GNU patch.

Reported as figures measured in one run on one machine (ratios within that run):

1. ``check`` over 10 real releases (0.5.7 ... 0.5.23: sdists, then released wheels read as
   source) with a warm cache: the first, cold run downloads and unpacks and is not
   timed; the second is. Goal: < 10 s in total.
2. The hunk matcher against GNU patch on the same corpus: real SGLang 0.5.9 source files,
   each with a random edit turned into a patch, applied to the same file of 0.5.10.post1
   (upstream drift). The engine runs in-process; GNU patch runs ``patch --dry-run`` once
   per case, so its figure includes a process start, as a build script calling it would.
"""

from __future__ import annotations

import argparse
import difflib
import json
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from builder import Options
from builder.patching.hunks import apply_file_hunks, split_lines
from builder.patching.matrix import run_matrix
from builder.patching.patchfile import parse_patch
from builder.source.fetch import run_fetch

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ["0.5.7", "0.5.9", "0.5.10rc0", "0.5.10.post1", "0.5.11", "0.5.12.post1",
            "0.5.13", "0.5.14", "0.5.16", "0.5.23"]
MATRIX_GOAL_S = 10.0


def matrix(cache: Path) -> dict[str, Any]:
    options = Options(targets_file=ROOT / "targets.toml", cache_dir=cache)
    run_matrix(options, versions=VERSIONS)  # cold: downloads, not timed
    start = time.perf_counter()
    result = run_matrix(options, versions=VERSIONS)
    seconds = time.perf_counter() - start
    return {"releases": len(result.columns), "warm_s": seconds, "goal_s": MATRIX_GOAL_S,
            "goal_met": seconds < MATRIX_GOAL_S}


def corpus(cache: Path, cases: int, seed: int) -> list[tuple[str, str]]:
    """(patch text, drifted file text) pairs from real files of two releases."""
    old = run_fetch(Options(targets_file=ROOT / "targets.toml", target="sglang-0.5.9",
                            cache_dir=cache)).tree
    new = run_fetch(Options(targets_file=ROOT / "targets.toml", target="sglang-0.5.10.post1",
                            cache_dir=cache)).tree
    names = sorted(p.relative_to(old).as_posix() for p in (old / "sglang" / "srt").rglob("*.py")
                   if (new / p.relative_to(old)).is_file() and p.stat().st_size > 2000)
    rng = random.Random(seed)
    pairs = []
    for _ in range(cases):
        name = rng.choice(names)
        base = split_lines((old / name).read_text())
        edited = list(base)
        at = rng.randrange(len(edited))
        edited[at] = "    # benchmark edit\n"
        patch = "".join(difflib.unified_diff(base, edited, f"a/{name}", f"b/{name}", n=3))
        pairs.append((patch, (new / name).read_text()))
    return pairs


def engine_vs_gnu(pairs: list[tuple[str, str]], work: Path) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    patch_file = work / "case.diff"
    engine_s = gnu_s = 0.0
    for patch, target in pairs:
        patch_file.write_text(patch)
        hunks = parse_patch(patch_file, 1).files[0].hunks
        start = time.perf_counter()
        apply_file_hunks(split_lines(target), hunks)
        engine_s += time.perf_counter() - start
        name = patch.splitlines()[0][len("--- a/"):]
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(target)
        start = time.perf_counter()
        subprocess.run(["patch", "--dry-run", "-N", "-p1", "--fuzz=2", "-s", "-i", str(patch_file)],
                       cwd=work, capture_output=True, env={"LC_ALL": "C"}, check=False)
        gnu_s += time.perf_counter() - start
    return {"cases": len(pairs), "engine_s": engine_s, "gnu_patch_s": gnu_s,
            "engine_over_gnu": engine_s / gnu_s if gnu_s else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200, help="corpus size")
    parser.add_argument("--cache-dir", type=Path, help="builder cache (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print a JSON object instead")
    args = parser.parse_args()
    if shutil.which("patch") is None:
        raise SystemExit("GNU patch is needed for the comparison (apt-get install patch)")
    work = Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    try:
        cache = args.cache_dir or work / "cache"
        result = {"matrix": matrix(cache),
                  "matcher": engine_vs_gnu(corpus(cache, args.cases, 20261130), work / "gnu")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    m, e = result["matrix"], result["matcher"]
    print(f"matrix over {m['releases']} releases, warm cache: {m['warm_s']:.2f} s "
          f"(goal < {m['goal_s']:.0f} s: {'goal met' if m['goal_met'] else 'goal missed'})")
    print(f"matcher on {e['cases']} real cases: engine {e['engine_s']:.3f} s, GNU patch "
          f"{e['gnu_patch_s']:.3f} s (one process per case): ratio "
          f"{e['engine_over_gnu']:.3f}x")


if __name__ == "__main__":
    main()
