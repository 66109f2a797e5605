"""The behaviour stage's command: ``behaviour``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import common, index_url_arg, options

if TYPE_CHECKING:
    from builder.core.progress import Reporter

_EPILOG = """\
examples:
  python -m builder behaviour --target sglang-0.5.16
  python -m builder behaviour --target sglang-0.5.23 --json > behaviour-0.5.23.json

Each [[patch.behaviour]] of patches/series.toml names a check (resolve: the values the
serving process selects; dispatch: the expert ids that reach the MoE runner under TP 2 /
EP 2), tiny model configurations, server arguments (lists expand to every combination;
ep_size = "tp" means EP = TP), the compute capabilities the device reports, and either
`expect` (what the patched code must show in every case and upstream's in some case not)
or `unchanged` (what the patch must leave as upstream has it). The first run installs the
release with its pinned dependencies on a CPU torch (0.5.16: about 770 MB, minutes); later
runs find it in the cache. Exit 5 when a behaviour is not proven. Nothing here runs on a
GPU: the device is reported as one; no compiled kernel is called.

Each [[kernel_fit]] names a dispatch (MODULE:FUNCTION) of the release and the heads per GPU,
KV dtypes and token counts to call it with: every TileLang kernel it picks on SM12x is
lowered by the release's pinned tilelang for sm_120 and compiled with nvcc (no GPU), and its
shared memory, registers and threads are held to SM120's limits (builder/behaviour/fit.py).
The report and --json ("kernel_fit") give each kernel's factory, arguments and figures, on
upstream's and the patched code. Exit 5 when a kernel the patched code picks does not fit;
exit 3 without nvcc.
"""


def add_commands(commands: Any) -> None:
    """Add ``behaviour``."""
    parser = commands.add_parser(
        "behaviour", help="run each patch's behaviours on the release's own code (CPU)",
        description="Install the target's release with its pinned Python dependencies (a "
                    "CPU torch; compiled kernels stood in for), report the device as SM120, "
                    "and run every behaviour the series declares on upstream's code and on "
                    "the patched code. A behaviour is proven when the patched code holds in "
                    "every case and upstream's fails in some.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(parser)
    index_url_arg(parser, "index to find the pinned wheel on")
    parser.add_argument("--series", type=Path, metavar="FILE",
                        help="check this series file instead of the target's")
    parser.set_defaults(handler=_cmd_behaviour, patch=None)


def _cmd_behaviour(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.behaviour import run_behaviour

    report = run_behaviour(options(args, reporter))
    for line in report.lines() or [f"no behaviour is declared for {report.target}"]:
        reporter.result(line)
    return report.to_json()
