"""What the CI workflows call: ``plan`` (the build matrix) and ``upstream`` (the
scheduled check)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from packaging.version import Version
from rich.table import Table

from builder.cli.common import (
    common,
    matrix_table,
    options,
)
from builder.core.errors import BuilderError
from builder.core.options import DEFAULT_INDEX_URL
from builder.core.progress import Reporter


def add_commands(commands: Any) -> None:
    """Add ``plan`` and ``upstream``."""
    plan = commands.add_parser(
        "plan", help="the CI build matrix: one entry per target of the targets file",
        description="Print what a CI job needs per target (name, versions, CUDA lane, arch "
                    "list, source kind, Python tags of repacked wheels), read from the "
                    "targets file alone: no downloads. With --json, the object's 'targets' "
                    "list is a GitHub Actions matrix 'include' (ci/build.yml uses it).")
    common(plan, target=False)
    plan.set_defaults(handler=_cmd_plan)

    upstream = commands.add_parser(
        "upstream", help="newer upstream releases than any target, checked against the series",
        description="List the project's releases on the simple index (PEP 691 JSON or PEP "
                    "503 HTML), keep those newer than the newest target (never yanked ones; "
                    "pre-releases with --pre), run the compatibility matrix on them and say "
                    "which patches need a refresh and which became obsolete. Exits 1 when "
                    "the series would break on a newer release.")
    common(upstream, target=False)
    upstream.add_argument("--index-url", default=DEFAULT_INDEX_URL,
                          help="simple index to list and fetch releases from "
                               "(default: %(default)s)")
    upstream.add_argument("--pre", action="store_true",
                          help="also check pre-releases and development releases")
    upstream.add_argument("--series", type=Path, metavar="FILE",
                          help="series to check (default: the default target's)")
    upstream.add_argument("--format", choices=("table", "markdown"), default="table",
                          help="human output: tables, or Markdown for a CI job summary")
    upstream.set_defaults(handler=_cmd_upstream)


def _cmd_plan(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.ci.plan import run_plan

    plan = run_plan(options(args, reporter))
    table = Table(title="CI plan")
    for column in ("target", "version", "CUDA", "arch list", "source", "Python tags"):
        table.add_column(column, overflow="fold")
    for entry in plan.entries:
        table.add_row(entry.target + (" (default)" if entry.default else ""), entry.version,
                      entry.cuda_lane, " ".join(entry.arch_list), entry.source,
                      " ".join(entry.python_tags) or "any")
    reporter.result(table)
    return plan.to_json()


def _cmd_upstream(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.ci.upstream import run_upstream

    report = run_upstream(options(args, reporter), pre=args.pre)
    if args.format == "markdown":
        reporter.raw(report.to_markdown())
    else:
        skipped = ", ".join(f"{s.version} ({s.reason})" for s in report.skipped)
        reporter.result(f"{report.project} on {report.index_url}: newest target "
                        f"{report.newest_target}; newer releases checked: "
                        f"{', '.join(report.new_versions) or 'none'}"
                        + (f"; skipped: {skipped}" if skipped else ""))
        if report.findings or report.unpatched:
            table = Table(title="Findings")
            for column in ("patch", "release", "action", "detail"):
                table.add_column(column, overflow="fold")
            for finding in report.findings:
                table.add_row(finding.patch, finding.version, finding.action, finding.detail)
            for version in report.unpatched:
                table.add_row("(every patch)", version, "nothing to patch",
                              "a target pinned to it would be refused")
            reporter.result(table)
        if report.matrix is not None:
            reporter.result(matrix_table(report.matrix))
    if report.needs_refresh:
        broken = sorted({f.version for f in report.findings if f.action == "refresh"},
                        key=Version)
        raise BuilderError(f"the series needs a refresh for {', '.join(broken)}",
                           "python -m builder refresh --target NAME after pinning the release "
                           "(docs/patches.md: Refresh)", report=report)
    return report.to_json()
