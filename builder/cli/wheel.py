"""The wheel stage's command: ``wheel``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from builder.cli.common import (
    common,
    options,
    source_args,
)
from builder.core.progress import Reporter


def add_commands(commands: Any) -> None:
    """Add ``wheel``."""
    wheel = commands.add_parser("wheel", help="build the patched, versioned wheel into dist/")
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
