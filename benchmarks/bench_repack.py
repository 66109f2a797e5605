"""Benchmark the repack of a released wheel against a plain copy of the same file.

Measured in one run on one machine, as a ratio: repacking the real SGLang 0.5.11 wheel
(patched files swapped in, metadata renamed, RECORD regenerated, result verified) against
``shutil.copyfile`` of the same wheel. The download is not timed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from builder import Options, run_fetch
from builder.patching.apply import apply_series
from builder.patching.series import load_series
from builder.wheel.repack import repack_wheel, verify_repack

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="sglang-0.5.11")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-repack-"))
    try:
        options = Options(targets_file=ROOT / "targets.toml", target=args.target,
                          cache_dir=work / "cache")
        source = run_fetch(options)
        assert source.archive is not None, "the target must have a wheel source"
        patched = apply_series(source, load_series(ROOT / "patches" / "series.toml"),
                               cache=options.cache)
        repack_s, copy_s = [], []
        for run in range(args.rounds):
            out = work / f"out-{run}"
            out.mkdir()
            start = time.perf_counter()
            result = repack_wheel(source.archive, patched.tree, "0.0+bench", "p.json", b"{}",
                                  source.source_date_epoch, out)
            verify_repack(source.archive, result)
            repack_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            shutil.copyfile(source.archive, out / "copy.whl")
            copy_s.append(time.perf_counter() - start)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures = {"wheel": source.archive.name, "repack_min_s": min(repack_s),
               "copy_min_s": min(copy_s), "ratio": min(repack_s) / min(copy_s)}
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"{figures['wheel']}: repack + verify {figures['repack_min_s']:.3f} s, plain copy "
              f"{figures['copy_min_s']:.4f} s, ratio {figures['ratio']:.0f}x "
              f"(min of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
