"""The project's housekeeping commands: ``lock``, ``next-label``, ``cache`` and
``add-patch``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import common, path_arg
from builder.core.cache import default_cache_root
from builder.core.errors import BuildError, ConfigurationError

if TYPE_CHECKING:
    from builder.core.progress import Reporter

_LOCK_EPILOG = """\
The lock (versions.lock beside targets.toml; keep it in git) records, per target and
version, the sha256 of what decides the wheel's content: the upstream pins, the patches
that apply (sha256, strip, fuzz, intent checks, description, commit message), the build pins and
the builder's output format. `wheel`, `kernels` and `image` refuse a version recorded
with other content and record new ones themselves.

examples:
  python -m builder lock                       # record every target's new versions
  python -m builder lock --check               # CI: exit 2 if a version is new or differs
  python -m builder lock --check --target sglang-0.5.9   # one target's lock state
  python -m builder next-label --target sglang-0.5.9     # sm120.1 -> sm120.2
  python -m builder lock --target sglang-0.5.9 --replace  # only for a never-published label
"""

_LABEL_EPILOG = """\
examples:
  python -m builder next-label --target sglang-0.5.9     # sm120.1 -> sm120.2 in targets.toml
  python -m builder lock --check --target sglang-0.5.9   # then: is the new version recorded?
"""

_CACHE_EPILOG = """\
Entries: downloads (sdists, wheels), source and patched trees, wheels, kernel build
environments and wheels, wheelhouses. Each is used or rebuilt as needed, so removing any
is safe; what a running build may read is never removed (prune and clean refuse while a
build holds the cache).

examples:
  python -m builder cache list
  python -m builder cache prune --older-than 30   # entries not used for 30 days
  python -m builder cache clean                   # everything
  python -m builder cache list --cache-dir /scratch/sm120-cache --json
"""


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


def add_commands(commands: Any) -> None:
    """Add ``add-patch``, ``lock``, ``next-label`` and ``cache``."""
    add = commands.add_parser(
        "add-patch", help="store a patch (from a repository or an sdist tree) in the series",
        description="Copy a patch into the series folder in the repository layout, and "
                    "append its entry (file, sha256, description, strip, versions) to the "
                    "series file. Add intent checks to the entry afterwards.",
        epilog=_ADD_PATCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(add)
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

    lock = commands.add_parser(
        "lock", help="record or check each target's version -> content digest (versions.lock)",
        description="One version, one content: compute each target's wheel content digest "
                    "and record it in versions.lock, or check it.",
        epilog=_LOCK_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(lock)
    lock.add_argument("--check", action="store_true",
                      help="write nothing; exit 2 when a version is not recorded or differs")
    lock.add_argument("--replace", action="store_true",
                      help="with --target: record the current digest over the old one (only "
                           "for a version never published)")
    lock.set_defaults(handler=_cmd_lock)

    label = commands.add_parser(
        "next-label", help="raise a target's build number (sm120.1 -> sm120.2)",
        description="Raise the build number of a target's local label in the targets file "
                    "(only that line changes), for a version whose content changed. "
                    "`lock --check --target NAME` shows a target's lock state.",
        epilog=_LABEL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(label)
    label.set_defaults(handler=_cmd_next_label)

    cache = commands.add_parser(
        "cache", help="list, prune or clean the build cache",
        description="See and prune the cache (default: $SGLANG_SM120_CACHE, else "
                    f"{default_cache_root()}), as `pip cache` and `uv cache` do.",
        epilog=_CACHE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = cache.add_subparsers(dest="cache_action", required=True, metavar="ACTION")
    for name, text in (("list", "every entry with its size and last use"),
                       ("prune", "remove entries not used for --older-than DAYS"),
                       ("clean", "remove every entry")):
        action = actions.add_parser(name, help=text, description=text[0].upper() + text[1:]
                                    + ".", epilog=_CACHE_EPILOG,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        action.add_argument("--json", action="store_true",
                            help="print one JSON object on stdout and no progress")
        action.add_argument("--cache-dir", type=Path, default=None,
                            help="cache root (default: $SGLANG_SM120_CACHE or "
                                 f"{default_cache_root()})")
        if name == "prune":
            action.add_argument("--older-than", type=_days, required=True, metavar="DAYS",
                                help="remove entries last used more than DAYS days ago")
        action.set_defaults(handler=_cmd_cache)


def _days(text: str) -> float:
    from builder.core.cache import MAX_AGE_DAYS, check_days

    try:
        return check_days(float(text))
    except (ValueError, ConfigurationError):  # one message for every bad number
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of days from 0 to {MAX_AGE_DAYS:g}") from None


def _lock_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from builder.core.config import load_targets
    from builder.core.lock import VersionLock, lock_path
    from builder.patching.apply import read_series
    from builder.patching.series import load_series
    from builder.wheel.build import patch_notes, wheel_content_digest

    targets = load_targets(args.targets_file)
    chosen = [targets.get(args.target)] if args.target else list(targets.targets.values())
    lock = VersionLock(lock_path(args.targets_file))
    rows = []
    for target in chosen:
        series = load_series(target.series)
        digest = wheel_content_digest(target, series, patch_notes(series, read_series(series)))
        verdict = lock.check("wheel", target.name, target.version, digest)
        rows.append({"target": target.name, "version": target.version, "digest": digest,
                     "state": verdict.state, "recorded": verdict.recorded})
    return rows


def _cmd_lock(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from rich.table import Table

    from builder.core.lock import VersionLock, lock_path

    if args.replace and not args.target:
        raise ConfigurationError("--replace needs --target", "name the one target to re-record")
    if args.replace and args.check:
        raise ConfigurationError("--replace and --check exclude each other", "give one of them")
    rows = _lock_rows(args)
    path = lock_path(args.targets_file)
    table = Table(title=str(path))
    for column in ("target", "version", "state", "digest"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row["target"], row["version"], row["state"], row["digest"][:16])
    reporter.result(table)
    differs = [r for r in rows if r["state"] == "differs"]
    new = [r for r in rows if r["state"] == "new"]
    if args.check:
        if differs or new:
            bad = differs or new
            raise ConfigurationError(
                f"versions.lock is not up to date: {len(differs)} version(s) differ, "
                f"{len(new)} not recorded (first: {bad[0]['target']} {bad[0]['version']})",
                f"raise the label: python -m builder next-label --target {bad[0]['target']}"
                if differs else "record them: python -m builder lock",
                report=None)
        return {"lock": str(path), "targets": rows}
    lock = VersionLock(path)
    if args.replace:
        row = rows[0]
        lock.record("wheel", row["target"], row["version"], row["digest"], replace=True)
        reporter.result(f"recorded {row['version']} of {row['target']} in {path} (replaced)")
        return {"lock": str(path), "targets": rows}
    if differs:
        first = differs[0]
        raise ConfigurationError(
            f"{len(differs)} version(s) would change content: "
            + ", ".join(f"{r['target']} {r['version']}" for r in differs)
            + "; nothing was recorded",
            f"raise the label: python -m builder next-label --target {first['target']}")
    for row in new:
        lock.record("wheel", row["target"], row["version"], row["digest"])
    reporter.result(f"{len(new)} version(s) recorded in {path}" if new else
                    f"{path} is up to date")
    return {"lock": str(path), "targets": rows}


def _cmd_next_label(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.core.config import load_targets
    from builder.core.labels import bump_label

    target = load_targets(args.targets_file).get(args.target)
    old, new = bump_label(args.targets_file, target.name)
    reporter.result(f"{target.name}: local label {old} -> {new} in {args.targets_file} "
                    f"(version {target.upstream_version}+{new}); build again, and commit "
                    "targets.toml with versions.lock")
    return {"target": target.name, "old": old, "new": new,
            "version": f"{target.upstream_version}+{new}"}


def _cmd_cache(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from rich.table import Table

    from builder.core.cache import cache_entries, prune_cache

    root = args.cache_dir or default_cache_root()
    if root.exists() and not root.is_dir():
        raise ConfigurationError(f"the cache {root} is not a folder",
                                 "pass --cache-dir a folder (or set SGLANG_SM120_CACHE)")
    if args.cache_action == "list":
        entries = cache_entries(root)
        kinds: dict[str, list[int]] = {}
        for entry in entries:
            kinds.setdefault(entry.kind, [0, 0])
            kinds[entry.kind][0] += 1
            kinds[entry.kind][1] += entry.size
        table = Table(title=f"cache {root}")
        for column in ("kind", "entries", "size"):
            table.add_column(column, justify="right" if column != "kind" else "left")
        for kind, (number, size) in sorted(kinds.items()):
            table.add_row(kind, str(number), _human(size))
        table.add_row("total", str(len(entries)), _human(sum(e.size for e in entries)))
        reporter.result(table)
        return {"cache": str(root), "entries": [e.to_json() for e in entries],
                "size": sum(e.size for e in entries)}
    days = args.older_than if args.cache_action == "prune" else None
    pruned = prune_cache(root, older_than_days=days)
    removed = pruned.removed
    freed = sum(e.size for e in removed)
    done = f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} " \
           f"({_human(freed)}) from {root}"
    for path, why in pruned.skipped:
        reporter.info(f"left alone: {path} ({why})")
    if pruned.failed:
        shown = "; ".join(f"{path} ({error})" for path, error in pruned.failed[:10])
        more = f" and {len(pruned.failed) - 10} more" if len(pruned.failed) > 10 else ""
        raise BuildError(f"could not remove {shown}{more}; {done}",
                         "fix what keeps it (permissions, an immutable flag, a mount) and "
                         "run again")
    reporter.result(done)
    return {"cache": str(root), "removed": [e.to_json() for e in removed], "freed": freed,
            "skipped": [{"path": str(path), "why": why} for path, why in pruned.skipped]}


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover


def _cmd_add_patch(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.core.config import load_targets
    from builder.patching.canonical import add_to_series

    series = args.series or load_targets(args.targets_file).get(args.target).series
    stored, layout, digest = add_to_series(
        series, args.patch_file, versions=args.versions, description=args.description,
        name=args.name, strip=args.strip, layout=args.layout)
    converted = " (converted from the sdist layout)" if layout == "sdist" else ""
    reporter.result(f"stored {stored}{converted}, sha256 {digest}; entry added to {series}")
    reporter.result("next: add [[patch.intent]] checks to the entry, then `python -m builder "
                    "matrix` and `python -m builder wheel` (a changed series needs a new "
                    "label: `python -m builder next-label --target NAME`)")
    return {"patch": str(stored), "layout": layout, "sha256": digest, "series": str(series)}
