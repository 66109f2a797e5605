"""The cache group: ``cache list|prune|clean``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import add_command, cache_root
from builder.core.cache import KINDS, default_cache_root
from builder.core.errors import BuildError, ConfigurationError

if TYPE_CHECKING:
    from builder.core.cache import Pruned
    from builder.core.progress import Reporter

_CACHE_EPILOG = """\
Entries: downloads (sdists, wheels), source and patched trees, wheels, kernel build
environments and wheels, wheelhouses. Each is used or rebuilt as needed, so removing any
is safe; what a running build may read is never removed (prune and clean refuse while a
build holds the cache).

examples:
  python -m builder cache list
  python -m builder cache prune --older-than 30   # entries not used for 30 days
  python -m builder cache clean                   # everything
  python -m builder cache clean behaviour-env     # the behaviour environments alone
  python -m builder cache list --cache-dir /scratch/sm120-cache --json
"""


def add_commands(commands: Any) -> None:
    """Add ``cache list|prune|clean``."""
    cache = add_command(
        commands, "cache", reads=("json", "cache_dir"),
        help="list, prune or clean the build cache",
        description="See and prune the cache (default: $SGLANG_SM120_CACHE, else "
                    f"{default_cache_root()}), as `pip cache` and `uv cache` do.",
        epilog=_CACHE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = cache.add_subparsers(dest="cache_action", required=True, metavar="ACTION")
    for name, text in (("list", "every entry with its size and last use"),
                       ("prune", "remove entries not used for --older-than DAYS"),
                       ("clean", "remove every entry")):
        action = add_command(actions, name, reads=("json", "cache_dir"), help=text,
                             description=text[0].upper() + text[1:] + ".",
                             epilog=_CACHE_EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        if name == "prune":
            action.add_argument("--older-than", type=_days, required=True, metavar="DAYS",
                                help="remove entries last used more than DAYS days ago")
        if name != "list":
            action.add_argument("kinds", nargs="*", type=_kind, metavar="KIND",
                                help="only entries of these kinds (default: every kind; "
                                     "behaviour-env alone frees about 3.8 GB a release): "
                                     + ", ".join(KINDS))
        action.set_defaults(handler={"list": _cmd_cache_list, "prune": _cmd_cache_prune,
                                     "clean": _cmd_cache_clean}[name])


def _kind(text: str) -> str:
    # not choices=: argparse 3.11 checks an empty nargs="*" default against them
    if text not in KINDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a cache kind (one of "
                                         f"{', '.join(KINDS)})")
    return text


def _days(text: str) -> float:
    from builder.core.cache import MAX_AGE_DAYS, check_days

    try:
        return check_days(float(text))
    except (ValueError, ConfigurationError):  # one message for every bad number
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of days from 0 to {MAX_AGE_DAYS:g}") from None


def _cmd_cache_list(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from rich.table import Table

    from builder.core.cache import cache_entries

    root = cache_root(args)
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


def _cmd_cache_prune(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.core.cache import prune_cache

    root = cache_root(args)
    return _removed(root, prune_cache(root, older_than_days=args.older_than,
                                              kinds=args.kinds), reporter)


def _cmd_cache_clean(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.core.cache import prune_cache

    root = cache_root(args)
    return _removed(root, prune_cache(root, older_than_days=None, kinds=args.kinds), reporter)


def _removed(root: Path, pruned: Pruned, reporter: Reporter) -> dict[str, Any]:
    """Say what ``cache prune`` or ``clean`` removed, left alone or failed to remove.

    Raises:
        BuildError: an entry could not be removed.
    """
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
