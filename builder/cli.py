"""Command line: ``python -m builder`` / ``sglang-sm120``. Parses, calls a stage, prints."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from builder.cache import default_cache_root
from builder.config import SOURCE_KINDS, load_targets
from builder.errors import BuilderError
from builder.hunks import HunkResult
from builder.patch import PatchReport
from builder.pipeline import Options, run_fetch, run_patch, run_wheel
from builder.progress import Reporter
from builder.source import DEFAULT_INDEX_URL

_EPILOG = """\
examples:
  python -m builder targets
  python -m builder wheel                          # the default target's wheel into dist/
  python -m builder wheel --target sglang-0.5.7 --json
  python -m builder patch --target sglang-0.5.10.post1 --dry-run
  python -m builder patch --source-dir ~/src/sglang --patch my.patch --max-fuzz 1 --dry-run

exit status: 0 success, 1 the build refused or failed (one-line cause and a hint on
stderr; with --json a JSON object with "error" on stdout), 2 bad usage.
"""


def _common(parser: argparse.ArgumentParser, *, target: bool = True) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object on stdout and no progress")
    parser.add_argument("--targets-file", type=Path, default=Path("targets.toml"),
                        help="the targets file (default: %(default)s)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="cache root (default: $SGLANG_SM120_CACHE or "
                             f"{default_cache_root()})")
    if target:
        parser.add_argument("--target", metavar="NAME",
                            help="build target (default: the targets file's default)")


def _source_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("source")
    group.add_argument("--source", choices=SOURCE_KINDS,
                       help="take the target's sdist or git pin (default: its 'prefer')")
    group.add_argument("--git-url", metavar="URL",
                       help="clone the git pin's commit from this URL or path instead")
    group.add_argument("--index-url", default=DEFAULT_INDEX_URL,
                       help="simple index where sdists are found by sha256 "
                            "(default: %(default)s)")
    group.add_argument("--source-dir", type=Path, metavar="DIR",
                       help="use this SGLang checkout or unpacked sdist instead of fetching")
    group.add_argument("--upstream-version", metavar="VERSION",
                       help="the upstream version of --source-dir (default: its PKG-INFO)")


def _series_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("patches")
    group.add_argument("--series", type=Path, metavar="FILE",
                       help="apply this series file instead of the target's")
    group.add_argument("--patch", type=Path, metavar="FILE",
                       help="apply just this patch (unpinned, for trying one out)")
    group.add_argument("--strip", type=int, default=1, metavar="N",
                       help="strip level for --patch (default: %(default)s)")
    group.add_argument("--max-fuzz", type=int, default=0, metavar="N",
                       help="fuzz allowed for --patch (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser (also used to render ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m builder",
        description="Build patched SGLang wheels for SM120 (RTX PRO 6000 Blackwell, RTX "
                    "5090) from pinned upstream releases: fetch -> patch -> wheel.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    targets = commands.add_parser("targets", help="list the build targets")
    _common(targets, target=False)
    targets.set_defaults(handler=_cmd_targets)

    fetch = commands.add_parser("fetch", help="download, verify and unpack a target's source")
    _common(fetch)
    _source_args(fetch)
    fetch.set_defaults(handler=_cmd_fetch)

    patch = commands.add_parser(
        "patch", help="apply the patch series and report every hunk",
        description="Apply a series (or one --patch) with fuzz checking. Without "
                    "--source-dir the result is a patched copy in the cache; with "
                    "--source-dir the folder itself is patched (all or nothing) unless "
                    "--dry-run.")
    _common(patch)
    _source_args(patch)
    _series_args(patch)
    patch.add_argument("--dry-run", action="store_true",
                       help="only report; write nothing")
    patch.set_defaults(handler=_cmd_patch)

    wheel = commands.add_parser("wheel", help="build the patched, versioned wheel into dist/")
    _common(wheel)
    _source_args(wheel)
    wheel.add_argument("--series", type=Path, metavar="FILE",
                       help="apply this series file instead of the target's")
    wheel.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR",
                       help="output folder (default: %(default)s)")
    wheel.set_defaults(handler=_cmd_wheel, patch=None, strip=1, max_fuzz=0)
    return parser


def _options(args: argparse.Namespace, reporter: Reporter) -> Options:
    return Options(
        targets_file=args.targets_file, target=getattr(args, "target", None),
        cache_dir=args.cache_dir or default_cache_root(),
        index_url=getattr(args, "index_url", DEFAULT_INDEX_URL),
        source=getattr(args, "source", None), git_url=getattr(args, "git_url", None),
        source_dir=getattr(args, "source_dir", None),
        upstream_version=getattr(args, "upstream_version", None),
        series=getattr(args, "series", None), patch=getattr(args, "patch", None),
        strip=getattr(args, "strip", 1), max_fuzz=getattr(args, "max_fuzz", 0),
        dist_dir=getattr(args, "dist", Path("dist")), reporter=reporter)


def _cmd_targets(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    targets = load_targets(args.targets_file)
    table = Table("target", "version", "sources", "CUDA", "arch list", title="Targets")
    for target in targets.targets.values():
        mark = " (default)" if target.name == targets.default else ""
        kinds = ", ".join(("sdist" if p.describe()["kind"] == "sdist" else "git")
                          + ("*" if p.describe()["kind"] == target.prefer else "")
                          for p in target.sources)
        table.add_row(target.name + mark, target.version, kinds, target.cuda_lane,
                      " ".join(target.arch_list))
    reporter.console.print(table)
    return {"default": targets.default,
            "targets": [t.describe() for t in targets.targets.values()]}


def _cmd_fetch(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    source = run_fetch(_options(args, reporter))
    reporter.info(f"Source {source.upstream_version} ({source.layout.kind}) at {source.tree}")
    return source.describe()


def render_report(report: PatchReport, console: Console) -> None:
    """Print a patch report as a table, with the hunk and its near miss for failures."""
    table = Table(title=f"Patch report for upstream {report.upstream_version}")
    for column in ("patch", "file", "hunk", "status", "line", "offset", "fuzz", "note"):
        table.add_column(column, overflow="fold")
    for patch in report.patches:
        if not patch.files:
            table.add_row(patch.name, "", "", str(patch.status), "", "", "", patch.message)
        for file in patch.files:
            for hunk in file.hunks:
                note = hunk.note
                if hunk.status == "fuzz":
                    note = f"allowed up to fuzz {patch.max_fuzz} (reason below)"
                table.add_row(patch.name, file.path, str(hunk.hunk), str(hunk.status),
                              "" if hunk.line is None else str(hunk.line),
                              "" if hunk.offset is None else str(hunk.offset),
                              "" if hunk.fuzz is None else str(hunk.fuzz), note)
    console.print(table)
    for patch in report.patches:
        if patch.fuzz_reason and any(h.status == "fuzz" for f in patch.files for h in f.hunks):
            console.print(f"fuzz allowance for {patch.name}: {patch.fuzz_reason}",
                          markup=False)
    for intent in report.intents:
        mark = "[green]holds[/]" if intent.holds else "[red]FAILS[/]"
        console.print(f"intent {mark}: {intent.check} -- {intent.detail}")
    for patch in report.patches:
        for file in patch.files:
            for hunk in file.hunks:
                if hunk.text:
                    _print_failed_hunk(console, patch.name, file.path, hunk)


def _print_failed_hunk(console: Console, patch: str, path: str, hunk: HunkResult) -> None:
    console.print(f"\n{patch} {path} hunk #{hunk.hunk} ({hunk.status}):", markup=False)
    console.print(hunk.text, markup=False, highlight=False, end="")
    if hunk.candidates:
        console.print(f"it could land at lines {', '.join(map(str, hunk.candidates))}; "
                      "line numbers cannot tell them apart", markup=False)
    if hunk.near_miss is not None:
        miss = hunk.near_miss
        console.print(f"nearest place: line {miss.line} ({miss.matched} of {miss.total} "
                      "lines equal):", markup=False)
        console.print(miss.diff, markup=False, highlight=False, end="")


def _cmd_patch(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    in_place = args.source_dir is not None
    result = run_patch(_options(args, reporter), in_place=in_place, dry_run=args.dry_run)
    render_report(result.report, reporter.console)
    where = ("nothing written (--dry-run)" if args.dry_run else
             f"patched in place: {result.tree}" if in_place else f"patched tree: {result.tree}")
    reporter.info(where)
    return {"tree": None if args.dry_run else str(result.tree), "key": result.key,
            "report": result.report.to_json()}


def _cmd_wheel(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    result = run_wheel(_options(args, reporter))
    render_report(PatchReport.from_json(result.provenance), reporter.console)
    how = "from cache" if result.cached else "built"
    reporter.info(f"[bold]{result.path}[/] ({how}, sha256 {result.sha256})")
    return result.describe()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status (0 ok, 1 refused or failed, 2 usage)."""
    args = build_parser().parse_args(argv)
    reporter = Reporter(quiet=args.json)
    handler: Callable[[argparse.Namespace, Reporter], dict[str, Any]] = args.handler
    try:
        payload = handler(args, reporter)
    except BuilderError as exc:
        if args.json:
            print(json.dumps(exc.to_json(), indent=2))
        else:
            err = Console(stderr=True, highlight=False)
            if isinstance(exc.report, PatchReport):
                render_report(exc.report, err)
            err.print(f"[bold red]error:[/] {exc.cause}", markup=True, soft_wrap=True)
            if exc.hint:
                err.print(f"[bold]hint:[/] {exc.hint}", soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        print("interrupted; nothing half-written was kept", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(payload, indent=2))
    return 0
