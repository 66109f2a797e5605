"""The wheel group: ``wheel`` and ``behaviour`` (each patch's behaviours on the release's
own code)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import (
    add_command,
    index_url_arg,
    options,
    source_args,
    target_arg,
)

if TYPE_CHECKING:
    from builder.core.progress import Reporter

_WHEEL_EPILOG = """\
examples:
  python -m builder wheel                                  # the default target, into dist/
  python -m builder wheel --target sglang-0.5.11 --json    # repacked upstream wheels
  python -m builder wheel --target sglang-0.5.9 --source git --git-url ~/src/sglang
  python -m builder wheel --source-dir ~/sglang-0.5.9 --dist /tmp/wheels   # unpinned: never publish
  pip install dist/sglang-0.5.9+sm120.1-py3-none-any.whl

The wheel's version is <upstream>+<local label> (0.5.9+sm120.1). versions.lock (beside
targets.toml) records what each version contains; a build whose patches, pins or builder
output changed under the same label is refused: python -m builder next-label --target NAME.
Inside the wheel, sglang-<version>.dist-info/sm120-provenance.json records the upstream pin,
every patch (sha256, description, message, per-hunk status) and the intent checks.
A rebuild with nothing changed comes from the cache in well under a second.
"""


def add_commands(commands: Any) -> None:
    """Add ``wheel`` and ``behaviour``."""
    wheel = add_command(
        commands, "wheel",
        help="build the patched, versioned wheel into dist/",
        description="Fetch the target's pinned upstream (sdist, released wheel or git "
                    "commit, checked by sha256), apply its patch series with fuzz and intent "
                    "checks, and build the wheel (with `build`, in an isolated environment) "
                    "or repack the upstream wheel, into --dist. Prints the patch report; "
                    "progress on stderr.",
        epilog=_WHEEL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    target_arg(wheel)
    source_args(wheel)
    wheel.add_argument("--series", type=Path, metavar="FILE",
                       help="apply this series file instead of the target's")
    wheel.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR",
                       help="output folder (default: %(default)s)")
    wheel.set_defaults(handler=_cmd_wheel, patch=None, strip=1, max_fuzz=0)
    _add_behaviour(commands)


def _cmd_wheel(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.cli.patching import render_report
    from builder.patching.apply import PatchReport
    from builder.wheel.build import run_wheels

    results = run_wheels(options(args, reporter))
    render_report(PatchReport.from_json(results[0].provenance), reporter.out)
    for result in results:
        how = ("upstream's own wheel: no patch changes this release"
               if result.provenance.get("wheel") == "upstream"
               else "from cache" if result.cached else "built")
        reporter.result(f"{result.path} ({how}, sha256 {result.sha256})", style="bold")
    return {"wheels": [result.describe() for result in results]}


_BEHAVIOUR_EPILOG = """\
examples:
  python -m builder behaviour --target sglang-0.5.16
  python -m builder behaviour --target sglang-0.5.23 --json > behaviour-0.5.23.json
  python -m builder behaviour --target sglang-0.5.24 --docs-table docs/upstream.md

Each [[patch.behaviour]] of patches/series.toml names a check (resolve: the values the
serving process selects; dispatch: the expert ids that reach the MoE runner under TP 2 /
EP 2), tiny model configurations, server arguments (lists expand to every combination;
ep_size = "tp" means EP = TP), the compute capabilities the device reports, and either
`expect` (what the patched code must show in every case and upstream's in some case not)
or `unchanged` (what the patch must leave as upstream has it). The first run installs the
release with its pinned dependencies on a torch run on the CPU (minutes; on disk: 3.8 GB per
release, the torch shared by all 0.9 GB as the +cpu build from PyTorch's CPU index or a
wheelhouse, about 4.7 GB as PyPI's CUDA build, 0.28 GB for a release's TileLang); later
runs find it in the cache. A full disk is reported as one, with the space needed; the
verdicts computed before any failure are printed with it. Exit 5 when a behaviour is not
proven. Nothing here runs on a GPU: the device is reported as one; no compiled kernel is
called.

Each [[kernel_fit]] names a dispatch (MODULE:FUNCTION) of the release and the heads per GPU,
KV dtypes and token counts to call it with: every TileLang kernel it picks on SM12x is
lowered by the release's pinned tilelang for sm_120 and compiled with nvcc (no GPU), and its
shared memory, registers and threads are held to SM120's limits (builder/behaviour/fit.py).
The report and --json ("kernel_fit") give each kernel's factory, arguments and figures, on
upstream's and the patched code. Exit 5 when a kernel the patched code picks does not fit;
exit 3 without nvcc.
"""


def _add_behaviour(commands: Any) -> None:
    parser = add_command(
        commands, "behaviour",
        help="run each patch's behaviours on the release's own code (CPU)",
        description="Install the target's release with its pinned Python dependencies (a "
                    "CPU torch; compiled kernels stood in for), report the device as SM120, "
                    "and run every behaviour the series declares on upstream's code and on "
                    "the patched code. A behaviour is proven when the patched code holds in "
                    "every case and upstream's fails in some.",
        epilog=_BEHAVIOUR_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    target_arg(parser)
    index_url_arg(parser)
    parser.add_argument("--series", type=Path, metavar="FILE",
                        help="check this series file instead of the target's")
    parser.add_argument("--docs-table", type=Path, metavar="FILE",
                        help="once every behaviour is proven, write the target's two columns "
                             "of the checkpoint-zoo table in FILE (docs/upstream.md: the "
                             "table between its zoo-table markers; other targets' kept)")
    parser.set_defaults(handler=_cmd_behaviour, patch=None)


def _cmd_behaviour(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.behaviour import run_behaviour
    from builder.behaviour.run import read_docs_table, with_checkpoint_columns
    from builder.core.cache import atomic_write_bytes
    from builder.core.config import load_targets

    opts = options(args, reporter)
    if args.docs_table is not None:  # a page that cannot be rewritten fails before the run
        read_docs_table(args.docs_table)
    report = run_behaviour(opts)
    for line in report.lines() or [f"no behaviour is declared for {report.target}"]:
        reporter.result(line)
    data = report.to_json()
    if args.docs_table is not None:
        # A new target's zoo columns come from its own run, as the test that checks the
        # table against each target's run expects (tests/behaviour/test_run.py).
        releases = {name: str(t.upstream_version)
                    for name, t in load_targets(opts.targets_file).targets.items()}
        page = with_checkpoint_columns(read_docs_table(args.docs_table), data, releases)
        atomic_write_bytes(args.docs_table, page.encode())
        reporter.result(f"wrote {report.target}'s columns of the zoo table in {args.docs_table}")
    return data
