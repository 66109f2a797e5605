"""Refresh: regenerate every patch of a series against a target's upstream.

After a refresh each patch applies to that upstream with zero fuzz and exact line numbers.
The patch's header (message, authorship), the series metadata and everything the patch
means are kept: modes (a created script stays ``100755``), renames and copies, and paths
C-quoted exactly as git writes them, so ``git apply`` and GNU patch read the result as
they read the original. The output is deterministic: ``a/`` ``b/`` paths, no timestamps,
files sorted, hunk section headers by git's default rule (the nearest earlier line that
starts with a letter, ``_`` or ``$``). A patch that needed fuzz is only refreshed with
``accept_fuzz``, and the report shows every such hunk before and after: a refresh can bake
a wrong placement in.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from builder.core.config import load_targets
from builder.core.errors import ConfigurationError, PatchError
from builder.core.options import Options
from builder.core.userfiles import rewrite_user_file
from builder.patching.apply import (
    PatchOutcome,
    PatchStep,
    read_series,
    replay_series,
)
from builder.patching.hunks import HunkStatus
from builder.patching.patchfile import Operation, quote_path
from builder.patching.series import Series, repin_entries, select_series
from builder.patching.status import PatchStatus
from builder.source.fetch import (
    SourceResult,
    obtain_source,
)

_FUNCNAME = re.compile(r"^[A-Za-z_$]")


@dataclass(frozen=True)
class FuzzedHunk:
    """A hunk that needed fuzz, as it was and as the refreshed patch has it."""

    path: str
    fuzz: int
    before: str
    after: str

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"path": self.path, "fuzz": self.fuzz, "before": self.before,
                "after": self.after}


class RefreshStatus(StrEnum):
    """What a refresh did to one patch (``status`` in ``refresh --json``).

    ``refreshed`` (rewritten), ``unchanged`` (already exact), ``kept`` (another patch was
    selected with ``--patch``), or why it was left alone, as
    :class:`~builder.patching.status.PatchStatus` names it. The values are a contract with
    users of ``refresh --json``, never renamed.
    """

    REFRESHED = "refreshed"
    UNCHANGED = "unchanged"
    KEPT = "kept"
    ALREADY_APPLIED = "already-applied"
    OBSOLETE = "obsolete"
    NOT_APPLICABLE = "not-applicable"
    NOT_REACHED = "not-reached"


@dataclass(frozen=True)
class RefreshedPatch:
    """One patch's refresh.

    Attributes:
        name: the patch's file name.
        status: ``refreshed``, ``unchanged``, or why it was left alone (``obsolete``,
            ``already-applied``, ``not-applicable``).
        written: where the new text went (``None`` when nothing was written).
        old_sha256: the file's sha256 before.
        new_sha256: its sha256 after (equal when unchanged).
        fuzzed: hunks that needed fuzz, before and after.
    """

    name: str
    status: RefreshStatus
    written: Path | None
    old_sha256: str
    new_sha256: str
    fuzzed: tuple[FuzzedHunk, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"name": self.name, "status": str(self.status),
                "written": str(self.written) if self.written else None,
                "old_sha256": self.old_sha256, "new_sha256": self.new_sha256,
                "fuzzed": [f.to_json() for f in self.fuzzed]}


def _funcname(lines: list[str], first: int) -> str:
    """git's default hunk header: the nearest line before ``first`` (1-based) that starts
    with a letter, ``_`` or ``$``, cut to 80 characters."""
    for line in reversed(lines[:max(first - 1, 0)]):
        if _FUNCNAME.match(line):
            return " " + line.rstrip("\r\n")[:80]
    return ""


def _lines(data: bytes | None) -> list[str]:
    if data is None:
        return []
    text = data.decode("utf-8", "surrogateescape")
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _git_mode(mode: int | None) -> str:
    """git's file mode for permission bits: ``100755`` when the owner may execute, else
    ``100644`` (git records nothing finer; ``ce_mode_from_stat`` in git's read-cache.c)."""
    return "100755" if mode is not None and mode & 0o100 else "100644"


def _quote_two(prefix: str, path: str) -> str:
    """``prefix + path`` as git writes it in a diff header (quoted as one name)."""
    return quote_path(prefix + path)


def render_file_diff(path: str, before: bytes | None, after: bytes | None,
                     prefixes: tuple[str, str], *, old_path: str | None = None,
                     old_mode: int | None = None, new_mode: int | None = None,
                     copy: bool = False) -> str:
    """A git-style diff of one file with 3 lines of context, no timestamps, as git
    writes it: C-quoted paths, a tab after a name with a space on ``---``/``+++``
    lines, ``new file mode`` / ``deleted file mode`` / ``old mode`` + ``new mode``,
    ``rename from/to`` or ``copy from/to``; no ``---``/``+++`` lines when the content is
    unchanged (a pure rename, copy or mode change, or an empty file created).

    Args:
        path: the repository path (after the change; the deleted path for a deletion).
        before: the old content (``None``: the file is created).
        after: the new content (``None``: the file is deleted).
        prefixes: ``("a/", "b/")`` for strip level 1, ``("", "")`` for 0.
        old_path: for a rename or copy, the path it comes from.
        old_mode: permission bits before (``None``: not known or absent).
        new_mode: permission bits after.
        copy: ``old_path`` stays (a copy), rather than going away (a rename).
    """
    old, new = _lines(before), _lines(after)
    a, b = prefixes
    source = old_path or path
    head = [f"diff --git {_quote_two(a, source)} {_quote_two(b, path)}\n"]
    if before is None:
        head.append(f"new file mode {_git_mode(new_mode)}\n")
    elif after is None:
        head.append(f"deleted file mode {_git_mode(old_mode)}\n")
    elif old_mode is not None and new_mode is not None and \
            _git_mode(old_mode) != _git_mode(new_mode):
        head.append(f"old mode {_git_mode(old_mode)}\nnew mode {_git_mode(new_mode)}\n")
    if old_path is not None and old_path != path:
        verb = "copy" if copy else "rename"
        head.append(f"{verb} from {quote_path(old_path)}\n{verb} to {quote_path(path)}\n")
    body: list[str] = []
    for line in list(difflib.unified_diff(old, new, n=3, lineterm="\n"))[2:]:
        if line.startswith("@@"):
            match = re.match(r"@@ -(\d+)", line)
            first = int(match[1]) if match else 1
            line = line.rstrip("\n") + _funcname(old, first) + "\n"
        body.append(line)
        if not line.endswith("\n"):
            body.append("\n\\ No newline at end of file\n")
    if body:
        minus = "/dev/null" if before is None else _quote_two(a, source)
        plus = "/dev/null" if after is None else _quote_two(b, path)
        head.append(f"--- {minus}{_tab(source if before is not None else '')}\n")
        head.append(f"+++ {plus}{_tab(path if after is not None else '')}\n")
    return "".join(head + body)


def _tab(name: str) -> str:
    # git ends a ---/+++ name that has a space with a tab, so that GNU patch reads the
    # whole name (builtin_diff in git's diff.c).
    return "\t" if " " in name else ""


def _prefixes(step: PatchStep) -> tuple[str, str]:
    if step.entry.strip == 1:
        return ("a/", "b/")
    if step.entry.strip == 0:
        return ("", "")
    raise PatchError(f"cannot refresh {step.entry.name}: strip level {step.entry.strip}",
                     "refresh writes a/ b/ paths (strip 1) or bare paths (strip 0)")


def _new_text(step: PatchStep) -> str:
    """The refreshed patch: the header verbatim, then one git diff per file the patch
    changes, sorted by path, keeping renames, copies and modes."""
    prefixes = _prefixes(step)
    moves = {fp.new_path: fp for fp in step.parsed.files
             if fp.operation in (Operation.RENAME, Operation.COPY) and fp.old_path
             and fp.new_path and fp.old_path != fp.new_path}
    gone = {fp.old_path for fp in moves.values() if fp.operation == Operation.RENAME
            and step.after.get(fp.old_path or "") is None}
    diffs = []
    for path in sorted(step.after):
        before, after = step.before[path], step.after[path]
        mode_before, mode_after = step.modes_before.get(path), step.modes_after.get(path)
        move = moves.get(path)
        if path in gone and before is not None and after is None:
            continue  # written as the rename's source
        if move is not None and move.old_path is not None and before is None and \
                after is not None and step.before.get(move.old_path) is not None:
            source = move.old_path
            diffs.append(render_file_diff(
                path, step.before[source], after, prefixes, old_path=source,
                old_mode=step.modes_before.get(source), new_mode=mode_after,
                copy=source not in gone))
        elif before != after or (before is not None and after is not None and
                                 _git_mode(mode_before) != _git_mode(mode_after)):
            diffs.append(render_file_diff(path, before, after, prefixes,
                                          old_mode=mode_before, new_mode=mode_after))
    header = step.parsed.header
    if header and not header.endswith("\n"):
        header += "\n"
    if header.rstrip("\n").endswith("---"):
        header += "\n"
    return header + "".join(diffs)


def _fuzzed(step: PatchStep, new_text: str) -> tuple[FuzzedHunk, ...]:
    fuzzed = []
    new_hunks = re.split(r"(?m)^(?=@@ )", new_text)
    for file_patch, file_report in zip(step.parsed.files, step.outcome.files, strict=True):
        for hunk, result in zip(file_patch.hunks, file_report.hunks, strict=True):
            if result.status != HunkStatus.FUZZ:
                continue
            after = next((h for h in new_hunks[1:] if result.changed_line is not None
                          and _covers(h, result.changed_line)), "")
            fuzzed.append(FuzzedHunk(file_report.path, result.fuzz or 0, hunk.render(),
                                     after.split("\ndiff --git ")[0]))
    return tuple(fuzzed)


def _covers(hunk_text: str, line: int) -> bool:
    match = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))?", hunk_text)
    if not match:
        return False
    start, length = int(match[1]), int(match[2] or 1)
    return start <= line < start + length


def _left_alone(step: PatchStep | PatchOutcome, only: str | None,
                accept_fuzz: bool) -> RefreshedPatch | None:
    """The entry of a patch a refresh leaves alone (not applicable, obsolete, already
    applied, or not the ``only`` one); ``None`` for a patch to refresh.

    Raises:
        PatchError: the patch failed, or needs fuzz without ``accept_fuzz``.
    """
    if not isinstance(step, PatchStep):
        return RefreshedPatch(step.name, RefreshStatus(step.status), None, step.sha256,
                              step.sha256)
    outcome = step.outcome
    if only is not None and outcome.name != only and outcome.status == PatchStatus.APPLIED:
        return RefreshedPatch(outcome.name, RefreshStatus.KEPT, None, outcome.sha256,
                              outcome.sha256)
    if outcome.status == PatchStatus.FAILED:
        needs = [h for f in outcome.files for h in f.hunks if h.fuzz and
                 h.status == HunkStatus.FAILED and "needs fuzz" in h.note]
        hint = ("pass --accept-fuzz, then review every hunk shown before and after"
                if needs and not accept_fuzz else "fix the patch by hand")
        raise PatchError(f"cannot refresh {outcome.name}: {outcome.message}", hint)
    if outcome.status != PatchStatus.APPLIED:
        return RefreshedPatch(outcome.name, RefreshStatus(outcome.status), None,
                              outcome.sha256, outcome.sha256)
    fuzzy = [f"{f.path} hunk #{h.hunk} (fuzz {h.fuzz})" for f in outcome.files
             for h in f.hunks if h.status == HunkStatus.FUZZ]
    if fuzzy and not accept_fuzz:  # even where the series allows it: review first
        raise PatchError(f"cannot refresh {outcome.name} without review: "
                         f"{', '.join(fuzzy)} needed fuzz",
                         "pass --accept-fuzz, then review every hunk shown before "
                         "and after")
    return None


def _destination(step: PatchStep, series: Series, output_dir: Path | None) -> Path:
    """Where a refreshed patch goes: ``output_dir``, else over itself.

    Raises:
        ConfigurationError: in place, the patch lies outside the series' folder.
    """
    name = step.outcome.name
    destination = (output_dir / name) if output_dir else step.entry.path
    if output_dir is None and series.path is not None and \
            not destination.is_relative_to(series.path.parent.resolve()):
        # An absolute series entry may read a patch kept elsewhere, never rewrite it.
        raise ConfigurationError(
            f"{name} is {destination}, outside the series folder "
            f"{series.path.parent.resolve()}: refresh rewrites patches in place only "
            "there", "refresh a copy with --output-dir DIR, or move the patch into the "
            "series folder")
    return destination


def refresh_series(source: SourceResult, series: Series, *, accept_fuzz: bool = False,
                   output_dir: Path | None = None, dry_run: bool = False,
                   only: str | None = None) -> tuple[RefreshedPatch, ...]:
    """Regenerate each applicable patch of ``series`` against ``source``.

    Args:
        source: the upstream tree to refresh against.
        series: the series (a series file; its sha256 pins are updated in place when the
            patches are rewritten in place).
        accept_fuzz: allow hunks that need fuzz (up to 2) to be refreshed.
        output_dir: write refreshed patches here instead of over the originals (the
            series file is then left alone).
        dry_run: compute and report only.
        only: refresh just the patch of this file name; the others are still applied
            in order (the selected one is refreshed on top of them) but never rewritten,
            and reported ``kept``.

    Returns:
        One entry per series entry.

    Raises:
        BuilderError: a patch failed, or needs fuzz without ``accept_fuzz``, or cannot be
            rewritten (renames, copies, mode changes, strip > 1), or, in place, lies
            outside the series' folder. Nothing is written then.
    """
    steps, _ = replay_series(source, series, fuzz=2 if accept_fuzz else None)
    results: list[RefreshedPatch] = []
    writes: list[tuple[Path, bytes]] = []
    pins: list[tuple[int, str, str]] = []
    for index, step in enumerate(steps):  # one step per series entry, in order
        left = _left_alone(step, only, accept_fuzz)
        if left is not None:
            results.append(left)
            continue
        assert isinstance(step, PatchStep)
        outcome = step.outcome
        text = _new_text(step)
        data = text.encode("utf-8", "surrogateescape")
        new_sha = hashlib.sha256(data).hexdigest()
        changed = new_sha != outcome.sha256
        destination = _destination(step, series, output_dir)
        sharing = [e.name for n, e in enumerate(series.entries)
                   if n != index and e.path == step.entry.path]
        if changed and output_dir is None and sharing:
            # Its new bytes would no longer be what the other entry pins.
            raise ConfigurationError(
                f"{outcome.name} is also the file of another entry of the series: "
                "refreshing it in place would break that entry's pin",
                "refresh a copy with --output-dir DIR and give it a file of its own")
        if changed or output_dir:
            writes.append((destination, data))
            if output_dir is None:
                pins.append((index, outcome.sha256, new_sha))
        results.append(RefreshedPatch(outcome.name, RefreshStatus.REFRESHED if changed
                                      else RefreshStatus.UNCHANGED,
                                      None if dry_run or not (changed or output_dir)
                                      else destination,
                                      outcome.sha256, new_sha, _fuzzed(step, text)))
    if not dry_run:
        if pins and series.path is not None:  # in place: the patches and their pins
            repin_entries(series.path, pins, patch_files=writes)
        else:
            for destination, data in writes:
                rewrite_user_file(destination, data)
    return tuple(results)


def run_refresh(options: Options, *, accept_fuzz: bool = False,
                output_dir: Path | None = None, dry_run: bool = False,
                only: Path | None = None) -> tuple[RefreshedPatch, ...]:
    """Refresh the target's series against the target's upstream (see :mod:`refresh`).

    Args:
        options: the target, source and series options.
        accept_fuzz: refresh hunks that needed fuzz too.
        output_dir: write copies here instead of rewriting the series' patches.
        dry_run: report only.
        only: refresh just this patch of the series (a path or a file name); the others
            are left byte for byte.

    Raises:
        BuilderError: in place, a refreshed patch also covers another target's version
            (rewriting it for this target could break that one), or ``output_dir`` is the
            series' own folder; and see :func:`builder.patching.refresh.refresh_series`.
    """
    targets = load_targets(options.targets_file)
    target = targets.get(options.target)
    series = select_series(options, target)
    read_series(series)
    if output_dir is not None and series.path is not None and \
            output_dir.resolve() == series.path.parent.resolve():
        raise ConfigurationError(f"--output-dir {output_dir} is the series' own folder",
                                 "write copies elsewhere, or refresh in place without "
                                 "--output-dir")
    name = None
    if only is not None:
        names = [e.name for e in series.entries]
        matches = [e.name for e in series.entries
                   if e.path == only.resolve() or e.name == only.name]
        if not matches:
            raise ConfigurationError(f"--patch {only} is not a patch of the series "
                                     f"{series.path}", f"its patches: {', '.join(names)}")
        name = matches[0]
    source = obtain_source(options, target)
    planned = refresh_series(source, series, accept_fuzz=accept_fuzz, output_dir=output_dir,
                             dry_run=True, only=name)
    if dry_run:
        return planned
    if output_dir is None:
        rewritten = {p.name for p in planned if p.status == RefreshStatus.REFRESHED}
        for entry in series.entries:
            if entry.name not in rewritten:
                continue
            others = [t.name for t in targets.targets.values()
                      if t.upstream_version != target.upstream_version
                      and t.series == series.path and entry.applies_to(t.upstream_version)]
            if others:
                raise PatchError(
                    f"{entry.name} also applies to {', '.join(others)}: refreshing it in place "
                    f"for {target.name} could break them",
                    "write a copy with --output-dir DIR and give it its own series entry "
                    "with a narrower version range (docs/patches.md: Refresh)")
    return refresh_series(source, series, accept_fuzz=accept_fuzz, output_dir=output_dir,
                          only=name)
