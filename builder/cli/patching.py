"""The source and patches group: ``targets``, ``fetch``, ``patch``, ``matrix``, ``refresh``
and ``add-patch``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import (
    add_command,
    comma_list,
    index_url_arg,
    matrix_table,
    options,
    path_arg,
    reads_shared,
    series_args,
    source_args,
    target_arg,
)
from builder.core.errors import ConfigurationError, PatchError

if TYPE_CHECKING:
    from rich.console import Console

    from builder.core.progress import Reporter
    from builder.patching.apply import PatchReport
    from builder.patching.hunks import HunkResult


def add_commands(commands: Any) -> None:
    """Add ``targets``, ``fetch``, ``patch``, ``matrix``, ``refresh`` and ``add-patch``."""
    targets = add_command(commands, "targets", help="list the build targets",
                          reads=("json", "targets_file"))
    targets.set_defaults(handler=_cmd_targets)

    fetch = add_command(commands, "fetch", help="download, verify and unpack a target's source")
    target_arg(fetch)
    source_args(fetch)
    fetch.set_defaults(handler=_cmd_fetch)

    patch = add_command(
        commands, "patch",
        help="apply the patch series and report every hunk",
        description="Apply a series (or one --patch) with fuzz checking. Without "
                    "--source-dir the result is a patched copy in the cache; with "
                    "--source-dir the folder itself is patched (all or nothing) unless "
                    "--dry-run.")
    target_arg(patch)
    source_args(patch)
    series_args(patch)
    patch.add_argument("--dry-run", action="store_true",
                       help="only report; write nothing")
    patch.set_defaults(handler=_cmd_patch)
    _add_matrix(commands)
    _add_refresh(commands)
    _add_add_patch(commands)


def _add_matrix(commands: Any) -> None:
    check = add_command(
        commands, "matrix",
        help="the series on several upstream releases (patch x release)",
        description="Apply the series (in memory) to every target, or to --versions "
                    "found on the index (sdist, else a released wheel read as source), or "
                    "to --commits of a git repository, and print patch x release. Exits 5 "
                    "(a patch error) when a column would break.")
    which = check.add_mutually_exclusive_group()
    which.add_argument("--versions", metavar="V1,V2", help="upstream versions to check")
    which.add_argument("--commits", metavar="C1[=V],C2", help="full git commits to check, "
                       "each optionally =VERSION (default: the default target's version)")
    reads_shared(check, "git_url")  # the repository of --commits (default: the target's)
    index_url_arg(check)
    check.add_argument("--series", type=path_arg, metavar="FILE",
                       help="series to check (default: the default target's)")
    check.add_argument("--format", choices=("table", "markdown"), default="table",
                       help="human output: a table, or Markdown for a pull request")
    check.set_defaults(handler=_cmd_matrix, validate=_validate_matrix)


def _add_refresh(commands: Any) -> None:
    refresh = add_command(
        commands, "refresh",
        help="regenerate the series' patches against a target's upstream",
        description="Rewrite each patch so it applies to the target with zero fuzz and "
                    "exact line numbers, keeping its header; updates the sha256 pins in "
                    "the series file. Hunks that needed fuzz need --accept-fuzz and are "
                    "shown before and after.")
    target_arg(refresh)
    source_args(refresh)
    refresh.add_argument("--accept-fuzz", action="store_true",
                         help="also refresh hunks that needed fuzz (review them!)")
    refresh.add_argument("--output-dir", type=path_arg, metavar="DIR",
                         help="write refreshed patches here; the series is left alone")
    refresh.add_argument("--series", type=path_arg, metavar="FILE",
                         help="refresh this series file instead of the target's")
    refresh.add_argument("--patch", type=path_arg, metavar="FILE", dest="refresh_patch",
                         help="refresh only this patch of the series (the patches before it "
                              "are still applied first); the others are left as they are")
    refresh.add_argument("--dry-run", action="store_true", help="only report")
    refresh.set_defaults(handler=_cmd_refresh, patch=None, strip=1, max_fuzz=0)


_ADD_PATCH_EPILOG = """\
The series stores every patch in the repository layout (a/python/sglang/...). A patch made
inside an unpacked sdist or wheel (a/sglang/...) is detected and rewritten: only its path
lines change, its message and hunks stay. Try it first with
`python -m builder patch --target NAME --patch FILE --dry-run`.

examples:
  python -m builder add-patch ~/sglang-0.5.9/0001-my-fix.patch --versions '>=0.5.9,<0.5.11' \\
      --description "What it does" --name 0002-my-fix.patch
  python -m builder add-patch fix.patch --layout sdist --versions '==0.5.9' --description "..."
"""


def _add_add_patch(commands: Any) -> None:
    add = add_command(
        commands, "add-patch",
        help="store a patch (from a repository or an sdist tree) in the series",
        description="Copy a patch into the series folder in the repository layout, and "
                    "append its entry (file, sha256, description, strip, versions) to the "
                    "series file. Add intent checks to the entry afterwards.",
        epilog=_ADD_PATCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    target_arg(add)
    add.add_argument("patch_file", type=path_arg, metavar="FILE", help="the patch")
    add.add_argument("--versions", required=True, metavar="SPEC",
                     help="upstream versions it applies to (PEP 440, e.g. '>=0.5.9,<0.5.11')")
    add.add_argument("--description", required=True, metavar="TEXT",
                     help="one line for reports and the wheel's provenance")
    add.add_argument("--name", metavar="NAME",
                     help="its file name in the series folder (default: the patch's)")
    add.add_argument("--strip", type=int, default=1, metavar="N",
                     help="its strip level (default: %(default)s, for a/ b/)")
    add.add_argument("--layout", choices=("auto", "git", "sdist"), default="auto",
                     help="its paths: git (a/python/sglang/...), sdist (a/sglang/...) or "
                          "auto (default: told from the paths)")
    add.add_argument("--series", type=path_arg, metavar="FILE",
                     help="the series file (default: the target's)")
    add.set_defaults(handler=_cmd_add_patch)


def _cmd_targets(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.core.config import load_targets

    targets = load_targets(args.targets_file)
    if not reporter.quiet:  # --json prints no table: rich stays unloaded
        from rich.table import Table

        table = Table("target", "version", "sources", "CUDA", "arch list", title="Targets")
        for target in targets.targets.values():
            mark = " (default)" if target.name == targets.default else ""
            kinds = ", ".join(p.kind + ("*" if p.kind == target.prefer else "")
                              for p in target.sources)
            table.add_row(target.name + mark, target.version, kinds, target.cuda_lane,
                          " ".join(target.arch_list))
        reporter.result(table)
    return {"default": targets.default,
            "targets": [t.describe() for t in targets.targets.values()]}


def _cmd_fetch(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.source.fetch import run_fetch

    source = run_fetch(options(args, reporter))
    reporter.result(f"Source {source.upstream_version} ({source.layout.kind}) at {source.tree}")
    return source.describe()


_REPORT_COLUMNS = ("patch", "file", "hunk", "status", "line", "offset", "fuzz", "note")


def _report_rows(report: PatchReport) -> list[tuple[str, ...]]:
    """One row per hunk (or per patch or file without hunks), in ``_REPORT_COLUMNS``."""
    from builder.patching.hunks import HunkStatus
    from builder.patching.status import FileStatus, PatchStatus

    whole = (FileStatus.CREATED, FileStatus.DELETED, FileStatus.RENAMED, FileStatus.COPIED)
    rows: list[tuple[str, ...]] = []
    for patch in report.patches:
        if not patch.files or patch.status == PatchStatus.OBSOLETE:
            rows.append((patch.name, "", "", str(patch.status), "", "", "", patch.message))
            continue
        for file in patch.files:
            if not file.hunks or file.status in whole:
                rows.append((patch.name, file.path, "", file.status, "", "", "", file.note))
            for hunk in file.hunks:
                note = hunk.note
                if hunk.status == HunkStatus.FUZZ:
                    note = f"allowed up to fuzz {patch.max_fuzz} (reason below)"
                rows.append((patch.name, file.path, str(hunk.hunk), hunk.label,
                             "" if hunk.line is None else str(hunk.line),
                             "" if hunk.offset is None else str(hunk.offset),
                             "" if hunk.fuzz is None else str(hunk.fuzz), note))
    return rows


def _table_width(rows: list[tuple[str, ...]]) -> int:
    """The width rich's default box table needs to show every cell unfolded: each column's
    widest cell plus one space of padding each side and a border."""
    widths = [max([len(name), *(len(row[i]) for row in rows)])
              for i, name in enumerate(_REPORT_COLUMNS)]
    return sum(widths) + 3 * len(widths) + 1


def _print_hunk_lines(rows: list[tuple[str, ...]], title: str, console: Console) -> None:
    """The report as one unbroken line per patch, file and hunk, for narrow terminals and
    logs: a console never folds these lines, so each path stays whole and greppable."""
    console.print(title, markup=False, soft_wrap=True)
    patch_shown = file_shown = None
    for patch, path, hunk, status, line, offset, fuzz, note in rows:
        if patch != patch_shown:
            patch_shown, file_shown = patch, None
            if not path:  # a patch reported as a whole (not applicable, obsolete, ...)
                console.print(f"{patch}: {status}" + (f" -- {note}" if note else ""),
                              markup=False, soft_wrap=True)
                continue
            console.print(patch, markup=False, soft_wrap=True)
        if path != file_shown:
            file_shown = path
            if not hunk:
                console.print(f"  {path}: {status}" + (f" -- {note}" if note else ""),
                              markup=False, soft_wrap=True)
                continue
            console.print(f"  {path}", markup=False, soft_wrap=True)
        where = f" at line {line}" if line else ""
        moved = f" (offset {offset}, fuzz {fuzz})" if offset or fuzz else ""
        console.print(f"    hunk {hunk}: {status}{where}{moved}"
                      + (f" -- {note}" if note else ""), markup=False, soft_wrap=True)


def render_report(report: PatchReport, console: Console) -> None:
    """Print a patch report, with the hunk and its near miss for failures.

    A table when the console is wide enough to show every cell whole; otherwise (an
    80-column window, a CI log, a pipe: rich assumes 80 columns there unless ``COLUMNS``
    says otherwise) one unbroken line per patch, file and hunk, since a folded table
    breaks paths and notes into fragments. ``--json`` and ``--format markdown`` are
    unaffected.

    Args:
        report: the patch stage's report.
        console: where to print (its ``width`` decides the layout).
    """
    from rich.table import Table

    from builder.patching.hunks import HunkStatus
    from builder.patching.status import PatchStatus

    rows = _report_rows(report)
    title = f"Patch report for upstream {report.upstream_version}"
    if _table_width(rows) > console.width:
        _print_hunk_lines(rows, title, console)
    else:
        table = Table(*_REPORT_COLUMNS, title=title)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for patch in report.patches:
        if patch.fuzz_reason and any(h.status == HunkStatus.FUZZ for f in patch.files
                                     for h in f.hunks):
            console.print(f"fuzz allowance for {patch.name}: {patch.fuzz_reason}",
                          markup=False, soft_wrap=True)
    for warning in report.warnings:
        console.print(warning, markup=False, soft_wrap=True)
    for intent in report.intents:
        mark = "[green]holds[/]" if intent.holds else "[red]FAILS[/]"
        before = "held before" if intent.held_before else "did not hold before"
        console.print(f"intent {mark} ({before}): ", end="", soft_wrap=True)
        console.print(f"{intent.check} -- {intent.detail}", markup=False, soft_wrap=True)
    for patch in report.patches:
        if patch.status == PatchStatus.OBSOLETE:  # nothing applied, nothing failed: no near misses
            continue
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
    import tempfile

    from builder.patching.apply import run_patch
    from builder.patching.canonical import canonical_patch
    from builder.patching.status import PatchStatus

    in_place = args.source_dir is not None
    with tempfile.TemporaryDirectory(prefix="sm120-patch-") as scratch:
        if args.patch is not None:
            # A patch made in an unpacked sdist (a/sglang/...) is applied as the
            # repository-layout patch the series would store (a/python/sglang/...).
            copy = Path(scratch) / args.patch.name
            if canonical_patch(args.patch, args.strip, args.layout, copy) == "sdist":
                reporter.info(f"{args.patch.name} is in the sdist layout (sglang/...): "
                              "applied as python/sglang/...; `add-patch` stores it so")
                args.patch = copy
        result = run_patch(options(args, reporter), in_place=in_place, dry_run=args.dry_run)
    render_report(result.report, reporter.out)
    applied = any(p.status == PatchStatus.APPLIED for p in result.report.patches)
    where = ("nothing written (--dry-run)" if args.dry_run else
             "nothing to write: nothing left to apply" if not applied else
             f"patched in place: {result.tree}" if in_place else
             f"patched tree (a cache entry: do not edit): {result.tree}")
    reporter.result(where)
    return {"tree": None if args.dry_run else str(result.tree), "key": result.key,
            "report": result.report.to_json()}


def _validate_matrix(args: argparse.Namespace) -> None:
    """``matrix``'s rules beyond argparse's.

    Raises:
        ConfigurationError: ``--git-url`` without ``--commits``, or an empty list.
    """
    if args.git_url and not args.commits:
        raise ConfigurationError("--git-url only applies with --commits",
                                 "give --commits C1,C2 too, or drop --git-url")
    for flag in ("versions", "commits"):
        if getattr(args, flag) is not None and not comma_list(getattr(args, flag)):
            raise ConfigurationError(f"--{flag} is empty", f"give --{flag} A,B or drop it")


def _cmd_matrix(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.patching.matrix import run_matrix

    matrix = run_matrix(options(args, reporter), versions=comma_list(args.versions),
                       commits=comma_list(args.commits))
    if args.format == "markdown":
        reporter.raw(matrix.to_markdown())
    else:
        reporter.result(matrix_table(matrix))
        reporter.result("✓ / ✗: the patch's intent checks hold / fail after the series")
    if matrix.broken_targets:
        raise PatchError(f"the series would break: {', '.join(matrix.broken_targets)}",
                         "run python -m builder patch --target NAME --dry-run for detail",
                         report=matrix)
    return matrix.to_json()


def _cmd_refresh(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from rich.table import Table

    from builder.patching.refresh import run_refresh

    results = run_refresh(options(args, reporter), accept_fuzz=args.accept_fuzz,
                          output_dir=args.output_dir, dry_run=args.dry_run,
                          only=args.refresh_patch)
    table = Table(title="Refresh")
    for column in ("patch", "status", "old sha256", "new sha256", "written to"):
        table.add_column(column, overflow="fold")
    for item in results:
        table.add_row(item.name, item.status, item.old_sha256[:12], item.new_sha256[:12],
                      str(item.written or "-"))
    reporter.result(table)
    for item in results:
        for hunk in item.fuzzed:
            reporter.raw(f"\n{item.name} {hunk.path}: this hunk needed fuzz {hunk.fuzz}; "
                         f"check that the refreshed placement is right.\nbefore:\n"
                         f"{hunk.before}after:\n"
                         f"{hunk.after or '(not found in the refreshed patch)'}\n")
    return {"patches": [item.to_json() for item in results], "dry_run": args.dry_run}


def _cmd_add_patch(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.patching.add_patch import run_add_patch

    series, stored, layout, digest = run_add_patch(
        options(args, reporter), args.patch_file, versions=args.versions,
        description=args.description, name=args.name, strip=args.strip, layout=args.layout)
    converted = " (converted from the sdist layout)" if layout == "sdist" else ""
    reporter.result(f"stored {stored}{converted}, sha256 {digest}; entry added to {series}")
    reporter.result("next: add [[patch.intent]] checks to the entry, then `python -m builder "
                    "matrix` and `python -m builder wheel` (a changed series needs a new "
                    "label: `python -m builder next-label --target NAME`)")
    return {"patch": str(stored), "layout": layout, "sha256": digest, "series": str(series)}
