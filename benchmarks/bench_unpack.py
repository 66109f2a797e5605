"""Benchmark the sdist unpack: the builder's one-pass strict unpack against what it did
before, ``tarfile``'s ``data`` filter (PEP 706) followed by a digest of the tree
(``sha256_tree``), on a real SGLang sdist. The builder computes the same digest while it
writes the files.

Both sides run alternately ``--rounds`` times in one run and the minimum of each is kept
(other load on the machine only ever adds time). Reported: seconds for each and the
ratio builder / data filter (goal: < 1, i.e. faster). Both trees are compared file by
file once, so the speed is not bought with a different result.

Usage::

    python benchmarks/bench_unpack.py [--sdist PATH] [--rounds 5] [--json]

Default sdist: ``$SGLANG_SM120_TEST_CACHE/sdists/sglang-0.5.9.tar.gz`` (the tests' copy),
else the default target's sdist, fetched (and verified) into a temporary cache.
The script reports; it never fails on a missed goal (exit status 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from builder.core.cache import sha256_tree
from builder.source.archive import unpack_sdist

ROOT = Path(__file__).resolve().parent.parent


def data_filter(archive: Path, work: Path) -> tuple[float, Path]:
    destination = work / "data"
    start = time.perf_counter()
    with tarfile.open(archive) as tar:
        tar.extractall(destination, filter="data")
    tree = next(destination.iterdir())
    sha256_tree(tree)
    elapsed = time.perf_counter() - start
    return elapsed, tree


def builder(archive: Path, work: Path, project: str, version: str) -> tuple[float, Path]:
    tree = work / "tree"
    start = time.perf_counter()
    unpack_sdist(archive, tree, project, version)
    return time.perf_counter() - start, tree


def measure(archive: Path, rounds: int) -> dict[str, Any]:
    name, _, version = archive.name[:-len(".tar.gz")].rpartition("-")
    times: dict[str, list[float]] = {"data_filter": [], "builder": []}
    same = None
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            t_data, data_tree = data_filter(archive, work)
            t_ours, our_tree = builder(archive, work, name, version)
            times["data_filter"].append(t_data)
            times["builder"].append(t_ours)
            if same is None:
                same = sha256_tree(data_tree) == sha256_tree(our_tree)
            shutil.rmtree(work / "data")
    best = {side: min(values) for side, values in times.items()}
    return {"sdist": archive.name, "rounds": rounds, "seconds": best,
            "ratio_builder_over_data_filter": round(best["builder"] / best["data_filter"], 3),
            "same_tree": same}


def default_target_sdist(cache: Path) -> Path:
    """The default target's sdist, downloaded and verified by the builder."""
    from builder import Options, run_fetch

    source = run_fetch(Options(targets_file=ROOT / "targets.toml", cache_dir=cache,
                               source="sdist"))
    assert source.archive is not None
    return source.archive


def main() -> int:
    default = Path(os.environ.get("SGLANG_SM120_TEST_CACHE", ROOT / ".cache" / "tests")) \
        / "sdists" / "sglang-0.5.9.tar.gz"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, default=default)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist if args.sdist.is_file() else default_target_sdist(Path(tmp))
        result = measure(sdist, args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        seconds = result["seconds"]
        print(f"{result['sdist']}: data filter + sha256_tree {seconds['data_filter']:.2f} s, "
              f"builder {seconds['builder']:.2f} s, "
              f"ratio {result['ratio_builder_over_data_filter']} "
              f"(best of {result['rounds']}); same tree: {result['same_tree']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
