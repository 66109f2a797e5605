"""The wheel stage's command: ``wheel``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import (
    common,
    options,
    source_args,
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
    """Add ``wheel``."""
    wheel = commands.add_parser(
        "wheel", help="build the patched, versioned wheel into dist/",
        description="Fetch the target's pinned upstream (sdist, released wheel or git "
                    "commit, checked by sha256), apply its patch series with fuzz and intent "
                    "checks, and build the wheel (with `build`, in an isolated environment) "
                    "or repack the upstream wheel, into --dist. Prints the patch report; "
                    "progress on stderr.",
        epilog=_WHEEL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(wheel)
    source_args(wheel)
    wheel.add_argument("--series", type=Path, metavar="FILE",
                       help="apply this series file instead of the target's")
    wheel.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR",
                       help="output folder (default: %(default)s)")
    wheel.set_defaults(handler=_cmd_wheel, patch=None, strip=1, max_fuzz=0)


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
