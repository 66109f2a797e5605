"""The hunk matcher: locate and apply unified-diff hunks with GNU patch's placement rules.

Placement follows GNU patch 2.7 (``locate_hunk`` in patch.c): the hunk's stated line
(shifted by the offset of the previous hunk) first, then the nearest offset (a later
line before an earlier one at equal distance), then fuzz 1 and 2, where fuzz *F* ignores
up to *F* outer context lines (fewer at the end with less context, as GNU does), never
more than the hunk has. Hunks land in order; a hunk may not start inside the region an
earlier hunk of the same file changed.

Where GNU patch guesses, this engine refuses:

* ``ambiguous`` -- the preimage matches more than one place in the search window and the
  hunk did not land exactly on its expected line with zero fuzz (so line numbers cannot
  tell the places apart), including two places at the same nearest distance;
* ``already-applied`` -- the hunk's postimage is found at least as near as its preimage
  (its reverse applies), so the change is in the tree already.

Line numbers in results are 1-based. ``line`` is GNU patch's "succeeded at" line: where
the first line of the hunk sits in the patched file. ``changed_line`` is where the first
changed line sits (``line`` plus the hunk's leading context).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from builder.patching.status import FileStatus

DEFAULT_FUZZ_SEARCH = 2  # GNU patch's default --fuzz


class HunkStatus(StrEnum):
    """What the matcher found for one hunk (file-level verdicts are
    :class:`~builder.patching.status.FileStatus`)."""

    CLEAN = "clean"
    OFFSET = "offset"
    FUZZ = "fuzz"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"
    ALREADY_APPLIED = "already-applied"


APPLIED_STATUSES = frozenset({HunkStatus.CLEAN, HunkStatus.OFFSET, HunkStatus.FUZZ})


def split_lines(text: str) -> list[str]:
    """Split ``text`` into lines that keep their ``\\n`` (only ``\\n`` ends a line).

    Unlike ``str.splitlines`` this never splits at form feeds or other Unicode breaks,
    and a last line without a newline stays without one.
    """
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


@dataclass(frozen=True)
class Hunk:
    """One hunk of a unified diff.

    Attributes:
        index: 1-based position of the hunk in its file's patch.
        source_start: the ``-`` start line in the header (0 for an empty preimage).
        source_length: the ``-`` line count.
        target_start: the ``+`` start line.
        target_length: the ``+`` line count.
        lines: ``(kind, text)`` pairs, kind one of ``' '``, ``'-'``, ``'+'``; the text
            keeps its line ending (none where the patch says "No newline at end of file").
        section: the text after the second ``@@`` (often a function name).
    """

    index: int
    source_start: int
    source_length: int
    target_start: int
    target_length: int
    lines: tuple[tuple[str, str], ...]
    section: str = ""

    @property
    def preimage(self) -> list[str]:
        """Context and removed lines: what the file must contain."""
        return [text for kind, text in self.lines if kind != "+"]

    @property
    def postimage(self) -> list[str]:
        """Context and added lines: what the file contains afterwards."""
        return [text for kind, text in self.lines if kind != "-"]

    @property
    def prefix_context(self) -> int:
        """Number of context lines before the first change."""
        count = 0
        for kind, _ in self.lines:
            if kind != " ":
                break
            count += 1
        return count

    @property
    def suffix_context(self) -> int:
        """Number of context lines after the last change."""
        count = 0
        for kind, _ in reversed(self.lines):
            if kind != " ":
                break
            count += 1
        return count

    def reversed(self) -> Hunk:
        """Return the hunk that undoes this one (``-`` and ``+`` swapped)."""
        swap = {"-": "+", "+": "-", " ": " "}
        return Hunk(self.index, self.target_start, self.target_length, self.source_start,
                    self.source_length, tuple((swap[k], t) for k, t in self.lines),
                    self.section)

    def first_line(self) -> int:
        """The line GNU patch starts from: the ``-`` start, or the next line when empty."""
        return self.source_start + 1 if self.source_length == 0 else self.source_start

    def render(self) -> str:
        """Return the hunk as unified-diff text (header and lines)."""
        head = (f"@@ -{self.source_start},{self.source_length} "
                f"+{self.target_start},{self.target_length} @@{self.section}\n")
        body = []
        for kind, text in self.lines:
            body.append(kind + text)
            if not text.endswith("\n"):
                body.append("\n\\ No newline at end of file\n")
        return head + "".join(body)


@dataclass(frozen=True)
class NearMiss:
    """The place a failed hunk came closest to matching.

    Attributes:
        line: 1-based line in the file where the compared block starts.
        matched: how many preimage lines were equal there.
        total: the preimage's length.
        diff: a unified diff of expected (the preimage) against what the file has there.
    """

    line: int
    matched: int
    total: int
    diff: str

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"line": self.line, "matched": self.matched, "total": self.total,
                "diff": self.diff}


@dataclass(frozen=True)
class HunkResult:
    """The outcome for one hunk.

    Attributes:
        hunk: the hunk's 1-based index in its file.
        status: the matcher's verdict (:class:`HunkStatus`); ``failed`` when a fact
            about the whole file decided the hunk (see ``decided_by``).
        line: GNU-style landing line in the patched file (``None`` when not placed).
        offset: lines between the stated and the actual position (GNU's offset).
        fuzz: context lines ignored to place it.
        changed_line: line of the first changed line in the patched file.
        candidates: for ``ambiguous``, every line where it could land.
        near_miss: for ``failed``, the closest place.
        note: extra explanation.
        text: for ``failed`` and ``ambiguous``, the hunk itself as diff text.
        decided_by: the file-level refusal that decided the hunk when it is not one of
            the matcher's own verdicts (``missing-file``, ``eol-mismatch``,
            ``new-file-exists``, ``binary``, ``symlink``; set by the patch stage, which
            sees files); ``None`` when the matcher decided.
    """

    hunk: int
    status: HunkStatus
    line: int | None = None
    offset: int | None = None
    fuzz: int | None = None
    changed_line: int | None = None
    candidates: tuple[int, ...] = ()
    near_miss: NearMiss | None = None
    note: str = ""
    text: str = ""
    decided_by: FileStatus | None = None

    @property
    def label(self) -> str:
        """The status as reports and ``--json`` show it: the deciding file refusal's value
        when there is one (``missing-file`` ...), else the matcher's (``fuzz`` ...)."""
        return str(self.decided_by or self.status)

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data (``status``, ``line``, ``offset``, ``fuzz`` ...)."""
        out: dict[str, Any] = {"hunk": self.hunk, "status": self.label,
                               "line": self.line, "offset": self.offset, "fuzz": self.fuzz,
                               "changed_line": self.changed_line}
        if self.candidates:
            out["candidates"] = list(self.candidates)
        if self.near_miss:
            out["near_miss"] = self.near_miss.to_json()
        if self.note:
            out["note"] = self.note
        if self.text:
            out["text"] = self.text
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HunkResult:
        """Rebuild a result from :meth:`to_json` output (for example a stored provenance)."""
        miss = data.get("near_miss")
        status, decided_by = _hunk_status(data["status"])
        return cls(data["hunk"], status, data["line"], data["offset"],
                   data["fuzz"], data["changed_line"], tuple(data.get("candidates", ())),
                   NearMiss(**miss) if miss else None, data.get("note", ""),
                   data.get("text", ""), decided_by)


def _hunk_status(value: str) -> tuple[HunkStatus, FileStatus | None]:
    """A stored hunk status as ``(status, decided_by)``: the matcher's when it has that
    value (``failed`` and ``already-applied`` are in both vocabularies), else ``failed``
    decided by that file-level refusal."""
    try:
        return HunkStatus(value), None
    except ValueError:
        return HunkStatus.FAILED, FileStatus(value)


@dataclass
class _Cursor:
    """GNU patch's per-file state: accumulated offset and consumed input lines."""

    in_offset: int = 0
    out_offset: int = 0
    last_frozen: int = 0


@dataclass(frozen=True)
class FileOutcome:
    """Hunk results for one file and, when every hunk applied, the new lines."""

    results: tuple[HunkResult, ...]
    new_lines: list[str] | None = field(default=None)

    @property
    def already_applied(self) -> bool:
        """True when every hunk's change is already in the file."""
        return bool(self.results) and all(
            r.status == HunkStatus.ALREADY_APPLIED for r in self.results)


def _matches(lines: Sequence[str], pattern: Sequence[str], where: int, skip_front: int,
             skip_back: int) -> bool:
    start = where - 1
    for i in range(skip_front, len(pattern) - skip_back):
        pos = start + i
        if pos >= len(lines) or lines[pos] != pattern[i]:
            return False
    return True


def _occurrences(lines: Sequence[str], window: Sequence[str], min_where: int,
                 max_where: int, skip_front: int) -> list[int]:
    """Every ``where`` in ``min_where..max_where`` with ``window`` at ``where + skip_front``.

    What testing each ``where`` with :func:`_matches` gives, in linear time: each line
    becomes one character (its id) and ``str.find`` (CPython's two-way search, 3.10+:
    linear in the worst case) finds the window. A failing search then costs the length
    of the file, never file length times hunk length.
    """
    if max_where < min_where:
        return []
    if not window:
        return list(range(min_where, max_where + 1))
    ids: dict[str, int] = {}
    for line in window:
        ids.setdefault(line, len(ids))
    # Lines the window lacks all map to one id it never uses.
    text = "".join(chr(ids.get(line, len(ids))) for line in lines)
    needle = "".join(chr(ids[line]) for line in window)
    found, start = [], min_where - 1 + skip_front
    last = max_where - 1 + skip_front  # the last start allowed
    while (at := text.find(needle, start, last + len(needle))) != -1:
        found.append(at + 1 - skip_front)
        start = at + 1
    return found


def _candidates(lines: Sequence[str], hunk: Hunk, first_guess: int, fuzz: int,
                last_frozen: int) -> tuple[list[int], list[int]]:
    """Lines where ``hunk``'s preimage matches at ``fuzz``, nearest first (GNU order).

    Returns GNU patch's candidates and, second, those that do not reach back over lines
    an earlier hunk already consumed (GNU lets kept leading context do that; here two
    hunks of one patch may not use the same region).
    """
    found, skip_front = _gnu_candidates(lines, hunk, first_guess, fuzz, last_frozen)
    return found, [w for w in found if w + skip_front > last_frozen]


def _gnu_candidates(lines: Sequence[str], hunk: Hunk, first_guess: int, fuzz: int,
                    last_frozen: int) -> tuple[list[int], int]:
    """GNU patch's search window; returns the matches and the leading lines skipped."""
    pattern = hunk.preimage
    pat_lines = len(pattern)
    prefix, suffix = hunk.prefix_context, hunk.suffix_context
    context = max(prefix, suffix)
    prefix_fuzz = fuzz + prefix - context
    suffix_fuzz = fuzz + suffix - context
    if pat_lines == 0:
        return [first_guess], 0  # an empty range matches anywhere
    max_where = len(lines) - (pat_lines - suffix_fuzz) + 1
    min_where = max(last_frozen + 1 - (prefix - prefix_fuzz), 1)
    if prefix_fuzz < 0 and hunk.first_line() <= 1:
        # Less leading than trailing context at line 1: it can only match the start.
        if suffix_fuzz < 0 and (pat_lines != len(lines) or prefix < last_frozen):
            return [], 0
        ok = last_frozen <= prefix and max_where >= 1 and \
            _matches(lines, pattern, 1, 0, max(suffix_fuzz, 0))
        return ([1] if ok else []), 0
    prefix_fuzz = max(prefix_fuzz, 0)
    if suffix_fuzz < 0:
        # Less trailing than leading context: it can only match the end of the file.
        where = len(lines) - pat_lines + 1
        ok = where >= min_where and _matches(lines, pattern, where, prefix_fuzz, 0)
        return ([where] if ok else []), prefix_fuzz
    found = _occurrences(lines, pattern[prefix_fuzz:pat_lines - suffix_fuzz],
                         min_where, max_where, prefix_fuzz)
    found.sort(key=lambda w: (abs(w - first_guess), w < first_guess))
    return found, prefix_fuzz


#: Line comparisons the near-miss hint of one failed hunk may spend.
_NEAR_MISS_BUDGET = 1_000_000


def _near_miss(lines: Sequence[str], hunk: Hunk, first_guess: int) -> NearMiss | None:
    pattern = hunk.preimage
    if not pattern or not lines:
        return None
    best: tuple[int, int, int] | None = None  # (-matched, distance, where)
    last = max(len(lines) - len(pattern) + 1, 1)
    # Nearest windows first, within a budget of line comparisons: the hint for a failed
    # hunk must not cost file length times hunk length on a large file.
    nearest = sorted(range(1, last + 1), key=lambda w: (abs(w - first_guess), w))
    for where in nearest[:max(1, _NEAR_MISS_BUDGET // len(pattern))]:
        window = lines[where - 1: where - 1 + len(pattern)]
        matched = sum(1 for a, b in zip(window, pattern, strict=False) if a == b)
        key = (-matched, abs(where - first_guess), where)
        if best is None or key < best:
            best = key
    assert best is not None
    where = best[2]
    found = list(lines[where - 1: where - 1 + len(pattern)])
    diff = "".join(difflib.unified_diff(
        [p if p.endswith("\n") else p + "\n" for p in pattern],
        [f if f.endswith("\n") else f + "\n" for f in found],
        "hunk expects", f"file has at line {where}", n=len(pattern)))
    return NearMiss(line=where, matched=-best[0], total=len(pattern), diff=diff)


def _frozen_after(hunk: Hunk, where: int) -> int:
    """Input lines consumed once ``hunk`` is applied at ``where`` (GNU's last_frozen_line)."""
    old = 0
    frozen = where - 1
    for kind, _ in hunk.lines:
        if kind == " ":
            old += 1
        elif kind == "-":
            old += 1
            frozen = where - 1 + old
        else:
            frozen = max(frozen, where - 1 + old)
    return frozen


def _apply(lines: Sequence[str], placements: Sequence[tuple[Hunk, int]]) -> list[str]:
    """Apply located hunks in order; context comes from the file (fuzzed lines stay)."""
    out: list[str] = []
    consumed = 0
    for hunk, where in placements:
        old = 0
        for kind, text in hunk.lines:
            pos = where - 1 + old
            if kind == " ":
                old += 1
                continue
            out.extend(lines[consumed:pos])
            consumed = max(consumed, pos)
            if kind == "-":
                consumed = pos + 1
                old += 1
            else:
                if out and not out[-1].endswith("\n"):
                    out[-1] += "\n"  # text now follows a line that had no newline
                out.append(text)
    out.extend(lines[consumed:])
    return out


def apply_file_hunks(lines: Sequence[str], hunks: Sequence[Hunk], *,
                     fuzz_search: int = DEFAULT_FUZZ_SEARCH) -> FileOutcome:
    """Locate every hunk of one file's patch and apply them if all can be placed.

    Args:
        lines: the file's current lines (see :func:`split_lines`); empty for a new file.
        hunks: the file's hunks in patch order.
        fuzz_search: the most fuzz to try (GNU's ``--fuzz``, default 2); each hunk tries
            at most as much as its context allows. Whether the fuzz found is *allowed*
            is the caller's policy.

    Returns:
        The per-hunk results; ``new_lines`` is set only when every hunk got an applied
        status (``clean``, ``offset`` or ``fuzz``).
    """
    cursor = _Cursor()
    results: list[HunkResult] = []
    placements: list[tuple[Hunk, int]] = []
    for hunk in hunks:
        results.append(_place(lines, hunk, cursor, fuzz_search, placements))
    if all(r.status in APPLIED_STATUSES for r in results):
        return FileOutcome(tuple(results), _apply(lines, placements))
    return FileOutcome(tuple(results), None)


def _place(lines: Sequence[str], hunk: Hunk, cursor: _Cursor, fuzz_search: int,
           placements: list[tuple[Hunk, int]]) -> HunkResult:
    forward_first = hunk.first_line() + cursor.in_offset
    undo = hunk.reversed()
    reverse_first = undo.first_line() + cursor.in_offset
    max_fuzz = min(fuzz_search, max(hunk.prefix_context, hunk.suffix_context))
    for fuzz in range(max_fuzz + 1):
        everywhere, forward = _candidates(lines, hunk, forward_first, fuzz,
                                          cursor.last_frozen)
        # An empty postimage (a hunk that only removes, without context) "matches"
        # anywhere; it can never show that the change is already there.
        backward = _candidates(lines, undo, reverse_first, fuzz, cursor.last_frozen)[1] \
            if hunk.postimage else []
        if everywhere and everywhere[0] not in forward and not backward:
            # GNU patch takes this nearest place and then fails ("misordered hunks").
            return HunkResult(hunk.index, HunkStatus.FAILED,
                              line=forward_first + cursor.out_offset,
                              note="it matches nearest where it would overlap the region "
                                   "an earlier hunk changed", text=hunk.render())
        if not everywhere and not backward:
            continue
        if backward and (not forward or abs(backward[0] - reverse_first)
                         <= abs(forward[0] - forward_first)):
            where = backward[0]
            cursor.in_offset = where - undo.first_line()
            cursor.last_frozen = max(cursor.last_frozen, _frozen_after(undo, where))
            line = where + cursor.out_offset
            return HunkResult(hunk.index, HunkStatus.ALREADY_APPLIED, line=line,
                              offset=cursor.in_offset, fuzz=fuzz,
                              changed_line=line + hunk.prefix_context,
                              note="the hunk's postimage is already in the file")
        where = forward[0]
        exact = fuzz == 0 and where == forward_first
        # Off its line, any second copy of the preimage in the whole file (even one an
        # earlier hunk used) means line numbers cannot say which place was meant.
        copies = everywhere if exact else _candidates(lines, hunk, forward_first, fuzz, 0)[0]
        if len(copies) > 1 and not exact:
            shown = ", ".join(map(str, copies[:10])) + (
                f" and {len(copies) - 10} more" if len(copies) > 10 else "")
            return HunkResult(hunk.index, HunkStatus.AMBIGUOUS, fuzz=fuzz,
                              candidates=tuple(w + cursor.out_offset for w in copies[:50]),
                              note=f"the preimage matches {len(copies)} places "
                                   f"(lines {shown} before patching)", text=hunk.render())
        cursor.in_offset = where - hunk.first_line()
        cursor.last_frozen = _frozen_after(hunk, where)
        line = where + cursor.out_offset
        cursor.out_offset += len(hunk.postimage) - len(hunk.preimage)
        placements.append((hunk, where))
        status = (HunkStatus.FUZZ if fuzz else
                  HunkStatus.OFFSET if cursor.in_offset else HunkStatus.CLEAN)
        return HunkResult(hunk.index, status, line=line, offset=cursor.in_offset, fuzz=fuzz,
                          changed_line=line + hunk.prefix_context)
    return HunkResult(hunk.index, HunkStatus.FAILED, line=forward_first + cursor.out_offset,
                      near_miss=_near_miss(lines, hunk, forward_first),
                      note=anchor_note(lines, hunk) or "the preimage was not found",
                      text=hunk.render())


def anchor_note(lines: Sequence[str], hunk: Hunk) -> str:
    """Why a hunk whose lines are all in the file still failed: it is anchored.

    diff writes less trailing than leading context only at the end of a file (and less
    leading than trailing only at its start), so GNU patch places such a hunk only there
    (``locate_hunk`` in patch.c).

    Args:
        lines: the file's lines.
        hunk: the hunk that failed.

    Returns:
        The explanation, or an empty string when anchoring is not the reason.
    """
    pattern = hunk.preimage
    if not pattern:
        return ""
    found = _occurrences(lines, pattern, 1, len(lines) - len(pattern) + 1, 0)
    if not found:
        return ""
    where = ", ".join(map(str, found[:5])) + (" ..." if len(found) > 5 else "")
    if hunk.suffix_context < hunk.prefix_context:
        after = len(lines) - (found[-1] + len(pattern) - 1)
        return (f"all its lines match (at line {where}), but with less trailing than "
                f"leading context it must end at the end of the file, and {after} more "
                "line(s) follow there: the file grew after the patch was made; refresh it")
    if hunk.prefix_context < hunk.suffix_context and hunk.first_line() <= 1:
        return (f"all its lines match (at line {where}), but with less leading than "
                "trailing context it must start at line 1 of the file: lines were added "
                "before it; refresh the patch")
    return ""
