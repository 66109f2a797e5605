"""Benchmark the worst failing hunk search we could construct, against GNU patch.

The input: a file of ``--lines`` identical lines and a hunk of ``--context`` lines of
that same line around one ``-`` line the file lacks (placed last, so that testing a
place line by line reads the whole context before it fails). Every place of the file
then nearly matches, at every fuzz, forwards and reversed: testing each place costs the
hunk's length, file length times hunk length in all, and the near-miss hint a scan of
the same size. GNU patch (``patch --dry-run --fuzz=2``, the same patch on the same file)
is timed as a process, as a user runs it.

Reported: seconds for the builder (:func:`builder.patching.hunks.apply_file_hunks`, the
hint included) and for GNU patch, the minimum of ``--rounds``, and their ratio (goal: a
small multiple, under 10). The script reports; it never fails on a missed goal (exit
status 0).

Usage::

    python benchmarks/bench_hunk_search.py [--lines 50000] [--context 200] [--rounds 3]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from builder.patching.hunks import HunkStatus, apply_file_hunks, split_lines
from builder.patching.patchfile import parse_patch


def make_input(folder: Path, lines: int, context: int) -> Path:
    """Write ``f.py`` and ``p.diff`` (the hunk) into ``folder``; return the patch."""
    (folder / "f.py").write_text("x = 1\n" * lines)
    before = context // 2
    body = " x = 1\n" * before + "-absent = 0\n+present = 1\n" + \
        " x = 1\n" * (context - before)
    patch = folder / "p.diff"
    patch.write_text(f"--- a/f.py\n+++ b/f.py\n@@ -{lines // 2},{context + 1} "
                     f"+{lines // 2},{context + 1} @@\n{body}")
    return patch


def main() -> int:
    """Run the benchmark; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if shutil.which("patch") is None:
        print("GNU patch is needed (apt-get install patch)", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        patch = make_input(folder, args.lines, args.context)
        lines = split_lines((folder / "f.py").read_text())
        hunks = parse_patch(patch, 1).files[0].hunks
        ours, gnu = [], []
        for _ in range(args.rounds):
            started = time.perf_counter()
            outcome = apply_file_hunks(lines, hunks)
            ours.append(time.perf_counter() - started)
            assert outcome.results[0].status == HunkStatus.FAILED, outcome.results
            started = time.perf_counter()
            done = subprocess.run(["patch", "--dry-run", "--fuzz=2", "-p1", "-i", str(patch)],
                                  cwd=folder, capture_output=True, env={"LC_ALL": "C"})
            gnu.append(time.perf_counter() - started)
            assert done.returncode == 1, done.stdout  # GNU patch fails it too
    figures = {"lines": args.lines, "context": args.context, "builder_s": min(ours),
               "gnu_patch_s": min(gnu), "ratio": min(ours) / min(gnu)}
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"failing search, {args.lines} lines x {args.context + 1}-line hunk: builder "
              f"{figures['builder_s']:.3f} s, GNU patch {figures['gnu_patch_s']:.3f} s, "
              f"ratio {figures['ratio']:.1f} (goal < 10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
