"""The series and targets group: ``upstream`` (report newer releases; writes nothing),
``add-target`` (pin one release), ``next-label``, ``lock`` (versions.lock) and ``plan`` (the
CI build matrix)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import (
    add_command,
    index_url_arg,
    matrix_table,
    options,
    path_arg,
    positive,
    target_arg,
)
from builder.core.errors import ConfigurationError, PatchError

if TYPE_CHECKING:
    from builder.core.progress import Reporter


def add_commands(commands: Any) -> None:
    """Add ``upstream``, ``add-target``, ``next-label``, ``lock`` and ``plan``."""
    plan = add_command(
        commands, "plan",
        help="the CI build matrix: one entry per target of the targets file",
        description="Print what a CI job needs per target (name, versions, CUDA lane, arch "
                    "list, source kind, Python tags of repacked wheels), read from the "
                    "targets file alone: no downloads. With --json, the object's 'targets' "
                    "list is a GitHub Actions matrix 'include' (ci/build.yml uses it); "
                    "'kernel_shards' is the same once per kernel shard job, with 'shard'.")
    plan.add_argument("--kernel-shards", type=positive, default=4, metavar="N",
                      help="kernel shard jobs per target (`kernels --shard I/N`; "
                           "default: %(default)s)")
    plan.set_defaults(handler=_cmd_plan)

    upstream = add_command(
        commands, "upstream",
        help="report releases newer than every target, checked against the series",
        description="List the project's releases on the simple index (PEP 691 JSON or PEP "
                    "503 HTML), keep those newer than the newest target (never yanked ones; "
                    "pre-releases with --pre), run the compatibility matrix on them and say "
                    "which patches need a refresh and which became obsolete. Writes nothing "
                    "(pin a release with `add-target VERSION`). Exits 5 (a patch error) "
                    "when the series would break on a newer release.")
    index_url_arg(upstream)
    upstream.add_argument("--pre", action="store_true",
                          help="also check pre-releases and development releases")
    upstream.add_argument("--series", type=path_arg, metavar="FILE",
                          help="series to check (default: the default target's)")
    upstream.add_argument("--format", choices=("table", "markdown"), default="table",
                          help="human output: tables, or Markdown for a CI job summary")
    upstream.set_defaults(handler=_cmd_upstream)

    bump = add_command(
        commands, "add-target",
        help="pin one upstream release as a new target in targets.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Add a [[target]] for an SGLang release, from the package index: its "
                    "sdist, else its CPython manylinux x86_64 wheels, with sha256; the CUDA "
                    "lane of its torch pin (read from that torch wheel's METADATA on the "
                    "index); the SM120 arch of its FlashInfer pin (12.0a up to 0.6.6, 12.0f "
                    "from 0.6.7); the local label. Then runs the compatibility matrix on it "
                    "and says which patches apply, need a refresh, or are obsolete. An "
                    "existing target is never overwritten without --replace; the file keeps "
                    "its comments and order and is replaced atomically.",
        epilog="examples:\n"
               "  python -m builder add-target 0.5.23\n"
               "  python -m builder add-target 0.5.20 --dry-run --json\n"
               "  python -m builder add-target 0.5.23 --replace --local-label sm120.2\n"
               "which release is new: `python -m builder upstream` (CI: nox -s bump runs "
               "both)\n"
               "It writes targets.toml, a [[base]] in images/pins.toml and the launch profile "
               "(derived from\nthe neighbour whose patches in effect match, claims to re-check "
               "marked # RE-CHECK), all or\nnone, then prints what the target lacks and the "
               "checklist to a served, CI-green target\n(docs/new-release.md).")
    bump.add_argument("version", metavar="VERSION",
                      help="the upstream release (PEP 440), e.g. 0.5.23")
    index_url_arg(bump)
    bump.add_argument("--local-label", default="sm120.1", metavar="LABEL", type=_local_label,
                      help="our PEP 440 local label (default: %(default)s)")
    bump.add_argument("--cuda-lane", metavar="X.Y",
                      help="the CUDA lane, instead of reading torch's wheel on the index")
    bump.add_argument("--replace", action="store_true",
                      help="overwrite an existing target of the same name or version")
    bump.add_argument("--dry-run", action="store_true",
                      help="work it all out and print it; write nothing")
    bump.add_argument("--format", choices=("table", "markdown"), default="table",
                      help="human output: tables, or Markdown for a pull request body")
    bump.add_argument("--body-file", type=path_arg, metavar="FILE",
                      help="also write the Markdown pull request body to FILE when a target "
                           "was written (ci/upstream.yml)")
    bump.set_defaults(handler=_cmd_add_target)
    _add_lock_commands(commands)


def _local_label(text: str) -> str:
    """argparse type of ``--local-label``: checked before anything is fetched or written
    (the targets file's own rule, :data:`builder.core.config.LOCAL_LABEL`).

    Raises:
        argparse.ArgumentTypeError: not lowercase letters and digits separated by dots.
    """
    from builder.core.config import LOCAL_LABEL

    if not LOCAL_LABEL.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a PEP 440 local label: use lowercase letters and digits "
            "separated by dots, e.g. sm120.2")
    return text


def _cmd_plan(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from rich.table import Table

    from builder.targets.plan import run_plan

    plan = run_plan(options(args, reporter), kernel_shards=args.kernel_shards)
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
    from packaging.version import Version
    from rich.table import Table

    from builder.targets.upstream import run_upstream

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
                              "a target pinned to it ships upstream's own wheel")
            reporter.result(table)
        if report.matrix is not None:
            reporter.result(matrix_table(report.matrix))
    if report.needs_refresh:
        broken = sorted({f.version for f in report.findings if f.action == "refresh"},
                        key=Version)
        raise PatchError(
            f"the series needs a refresh for {', '.join(broken)}",
            "python -m builder refresh --target NAME after pinning the release "
            "(docs/patches.md: Refresh)", report=report)
    return report.to_json()


def _check_body_file(path: Path) -> None:
    """Refuse a ``--body-file`` the body could not replace, before anything is written.

    Raises:
        ConfigurationError: ``path`` is a folder, a link, a device, a pipe or a socket
            (a rename would replace the link itself, never what it points at), or its
            folder does not exist.
    """
    from builder.core.cache import replaceable

    try:
        replaceable(path)
    except ConfigurationError as exc:
        raise ConfigurationError(f"--body-file: {exc.cause}", exc.hint) from None
    if not path.parent.is_dir():
        raise ConfigurationError(f"--body-file {path}: its folder {path.parent} does not "
                                 "exist", "create the folder, or name a file in one that "
                                 "exists")


def _cmd_add_target(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.targets.add_target import run_add_target

    if args.cuda_lane is not None and not re.fullmatch(r"\d+\.\d+", args.cuda_lane):
        raise ConfigurationError(f"--cuda-lane {args.cuda_lane!r} is not like 13.0",
                                 "write CUDA's major.minor")
    if args.body_file is not None:
        _check_body_file(args.body_file)  # before targets.toml changes
    report = run_add_target(options(args, reporter), args.version,
                            local_label=args.local_label, cuda_lane=args.cuda_lane,
                            replace=args.replace, dry_run=args.dry_run,
                            body_file=args.body_file)  # written with the others, or none
    if args.format == "markdown":
        reporter.raw(report.to_markdown())
    elif report.target is None:
        reporter.result(f"up to date: no release newer than {report.version}")
    else:
        target = report.target
        reporter.result(f"{report.status}: {target.name} ({target.upstream_version}+"
                        f"{target.local_label}) in {report.targets_file}; CUDA "
                        f"{target.cuda_lane} (torch {target.torch}), arch "
                        f"{', '.join(target.arch_list)} (FlashInfer {target.flashinfer}), "
                        f"{len(target.sources)} source(s)")
        if report.matrix is not None:
            reporter.result(matrix_table(report.matrix))
        for finding in report.findings:
            reporter.result(f"{finding.action}: {finding.patch}: {finding.detail}")
        for path in report.written:
            reporter.result(f"wrote {path}")
        if report.derived is not None:
            derived = report.derived
            reporter.result(
                f"launch profile derived from {derived.neighbour}'s (patches in effect: "
                + ("the same" if derived.same_patches else ", ".join(derived.differ))
                + f"); {len(derived.recheck)} claim(s) to re-check in "
                f"{target.upstream_version}'s code, marked RE-CHECK in the file"
                + (" it would write" if report.status == "dry-run" else "") + ":\n"
                + "\n".join(f"  {line}" for line in derived.recheck))
        if report.gaps:
            reporter.result(f"{target.name} still lacks:")
            for gap in report.gaps:
                reporter.result(f"  {gap.line()}")
        if report.steps:
            from builder.targets.checklist import checklist_lines

            reporter.result(f"Checklist for {target.name} (docs/new-release.md):\n"
                            + "\n".join(checklist_lines(report.steps)))
    return report.to_json()


_LOCK_EPILOG = """\
The lock (versions.lock beside targets.toml; keep it in git) records, per target and
version, the sha256 of what decides the wheel's content: the upstream pins, the patches
that apply (sha256, strip, fuzz, intent checks, description, commit message), the build pins and
the builder's output format. `wheel`, `kernels` and `image` refuse a version recorded
with other content and record new ones themselves.

examples:
  python -m builder lock                       # record every target's new versions
  python -m builder lock --verify              # CI: exit 2 if a version is new or differs
  python -m builder lock --verify --target sglang-0.5.9  # one target's lock state
  python -m builder next-label --target sglang-0.5.9     # sm120.1 -> sm120.2
  python -m builder lock --target sglang-0.5.9 --replace  # only for a never-published label
"""

_LABEL_EPILOG = """\
examples:
  python -m builder next-label --target sglang-0.5.9     # sm120.1 -> sm120.2 in targets.toml
  python -m builder lock --verify --target sglang-0.5.9  # then: is the new version recorded?
"""

def _add_lock_commands(commands: Any) -> None:
    lock = add_command(
        commands, "lock",
        help="record or verify each target's version -> content digest (versions.lock)",
        description="One version, one content: compute each target's wheel content digest "
                    "and record it in versions.lock, or check it.",
        epilog=_LOCK_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    target_arg(lock)
    lock.add_argument("--verify", action="store_true",
                      help="write nothing; exit 2 when a version is not recorded or differs")
    lock.add_argument("--replace", action="store_true",
                      help="with --target: record the current digest over the old one (only "
                           "for a version never published)")
    lock.set_defaults(handler=_cmd_lock)

    label = add_command(
        commands, "next-label",
        help="raise a target's build number (sm120.1 -> sm120.2)",
        description="Raise the build number of a target's local label in the targets file "
                    "(only that line changes), for a version whose content changed. "
                    "`lock --verify --target NAME` shows a target's lock state.",
        epilog=_LABEL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    target_arg(label)
    label.set_defaults(handler=_cmd_next_label)


def _cmd_lock(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.targets.lock import LockState, run_lock

    def show(state: LockState) -> None:
        from rich.table import Table

        table = Table(title=str(state.path))
        for column in ("target", "version", "state", "digest"):
            table.add_column(column, overflow="fold")
        for row in state.rows:
            table.add_row(row["target"], row["version"], row["state"], row["digest"][:16])
        reporter.result(table)

    return run_lock(options(args, reporter), verify=args.verify, replace=args.replace,
                    show=show).to_json()


def _cmd_next_label(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.targets.next_label import run_next_label

    return run_next_label(options(args, reporter))
