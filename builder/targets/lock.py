"""``lock``: record or verify each target's version -> wheel content digest (versions.lock).

One version, one content: the digest of what decides a target's wheel
(:func:`builder.wheel.build.wheel_content_digest`) is recorded per target and version in
``versions.lock`` beside the targets file, or compared with the recorded one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.errors import ConfigurationError
from builder.core.options import Options


@dataclass(frozen=True)
class LockState:
    """The lock file and each chosen target's row (target, version, digest, state,
    recorded), as ``lock --json`` prints them."""

    path: Path
    rows: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        """``{"lock": PATH, "targets": ROWS}``."""
        return {"lock": str(self.path), "targets": self.rows}


def lock_state(options: Options) -> LockState:
    """Each chosen target's digest and its state in the lock (new, same, differs).

    Args:
        options: the targets file and ``target`` (``None``: every target).

    Returns:
        The lock file's path and one row per target.

    Raises:
        BuilderError: the targets or series file is invalid.
    """
    from builder.core.config import load_targets
    from builder.core.lock import VersionLock, lock_path
    from builder.patching.apply import read_series
    from builder.patching.series import load_series
    from builder.wheel.build import patch_notes, wheel_content_digest

    targets = load_targets(options.targets_file)
    chosen = ([targets.get(options.target)] if options.target
              else list(targets.targets.values()))
    lock = VersionLock(lock_path(options.targets_file))
    rows = []
    for target in chosen:
        series = load_series(target.series)
        digest = wheel_content_digest(target, series, patch_notes(series, read_series(series)))
        verdict = lock.check("wheel", target.name, target.version, digest)
        rows.append({"target": target.name, "version": target.version, "digest": digest,
                     "state": verdict.state, "recorded": verdict.recorded})
    return LockState(lock_path(options.targets_file), rows)


def run_lock(options: Options, *, verify: bool = False, replace: bool = False,
             show: Callable[[LockState], None] | None = None) -> LockState:
    """Record the new versions in the lock, or verify it is up to date.

    Args:
        options: the targets file, ``target`` (``None``: every target) and the reporter.
        verify: write nothing; fail when a version is not recorded or differs.
        replace: with ``options.target``: record its current digest over the old one
            (only for a version never published).
        show: called with the state before anything is recorded or refused (the CLI's
            table).

    Returns:
        The lock's state as computed (before recording).

    Raises:
        ConfigurationError: ``replace`` without a target or with ``verify``; with
            ``verify`` a version new or differing; without it a version whose content
            differs from the recorded one (nothing is recorded then).
    """
    from builder.core.lock import VersionLock

    reporter = options.reporter
    if replace and not options.target:
        raise ConfigurationError("--replace needs --target", "name the one target to re-record")
    if replace and verify:
        raise ConfigurationError("--replace and --verify exclude each other",
                                 "give one of them")
    state = lock_state(options)
    path, rows = state.path, state.rows
    if show is not None:
        show(state)
    differs = [r for r in rows if r["state"] == "differs"]
    new = [r for r in rows if r["state"] == "new"]
    if verify:
        if differs or new:
            bad = differs or new
            raise ConfigurationError(
                f"versions.lock is not up to date: {len(differs)} version(s) differ, "
                f"{len(new)} not recorded (first: {bad[0]['target']} {bad[0]['version']})",
                f"raise the label: python -m builder next-label --target {bad[0]['target']}"
                if differs else "record them: python -m builder lock",
                report=None)
        return state
    lock = VersionLock(path)
    if replace:
        row = rows[0]
        lock.record("wheel", row["target"], row["version"], row["digest"], replace=True)
        reporter.result(f"recorded {row['version']} of {row['target']} in {path} (replaced)")
        return state
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
    return state
