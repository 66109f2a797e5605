"""Differential test against GNU patch (the oracle; never part of the build path).

A corpus of generated cases (a file, an edit turned into a unified diff with difflib,
then upstream drift: inserted, deleted and edited lines) and the real seed patch on the
real releases. Where GNU patch (``patch --dry-run -N --fuzz=2``, ``LC_ALL=C``) and the
engine both apply a hunk they must agree on line, offset and fuzz; they may differ only
where the engine deliberately refuses (ambiguous, already applied, overlapping hunks).
"""

from __future__ import annotations

import difflib
import random
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import MODEL_RUNNER, REPO

from builder import HunkStatus, apply_file_hunks, parse_patch, split_lines
from builder.patching.hunks import APPLIED_STATUSES, HunkResult

CASES = 300
VOCABULARY = [f"    call_{i}(x)\n" for i in range(25)] + ["\n", "    return x\n", "    pass\n"]
DELIBERATE = {HunkStatus.AMBIGUOUS, HunkStatus.ALREADY_APPLIED}


@dataclass(frozen=True)
class GnuHunk:
    applied: bool
    line: int | None = None
    offset: int = 0
    fuzz: int = 0


def gnu(work: Path, original: list[str], patch_text: str, hunks: int) -> list[GnuHunk] | None:
    """Per-hunk outcome of GNU patch, or None when it skipped the patch as reversed."""
    if shutil.which("patch") is None:
        pytest.fail("GNU patch is the test oracle and must be installed (apt-get install patch)")
    (work / "f.py").write_text("".join(original))
    (work / "p.diff").write_text(patch_text)
    done = subprocess.run(["patch", "--dry-run", "-N", "-p1", "--fuzz=2", "-i", "p.diff"],
                          cwd=work, capture_output=True, text=True, env={"LC_ALL": "C"})
    out = done.stdout + done.stderr
    if "Reversed (or previously applied) patch detected" in out:
        return None
    results = [GnuHunk(True) for _ in range(hunks)]  # silent: applied at its line
    for m in re.finditer(r"Hunk #(\d+) succeeded at (\d+)(?: with fuzz (\d+))?"
                         r"(?: \(offset (-?\d+) lines?\))?", out):
        results[int(m[1]) - 1] = GnuHunk(True, int(m[2]), int(m[4] or 0), int(m[3] or 0))
    for m in re.finditer(r"Hunk #(\d+) FAILED at", out):
        results[int(m[1]) - 1] = GnuHunk(False)
    return results


def make_case(rng: random.Random) -> tuple[list[str], str, list[str]]:
    """(file the patch was made on, the patch, the drifted file it is applied to)."""
    base = [rng.choice(VOCABULARY) for _ in range(rng.randint(30, 90))]
    if rng.random() < 0.4:  # a repeated block, as real code has: room for ambiguity
        start = rng.randrange(len(base) - 10)
        base[rng.randrange(len(base)):0] = base[start:start + 10]
    new = list(base)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(new))
        action = rng.choice(["replace", "insert", "delete"])
        if action == "replace":
            new[at] = f"    changed_{rng.randint(0, 999)}(x)\n"
        elif action == "insert":
            new.insert(at, f"    added_{rng.randint(0, 999)}(x)\n")
        elif len(new) > 5:
            del new[at]
    patch = "".join(difflib.unified_diff(base, new, "a/f.py", "b/f.py", n=3))
    drifted = list(base)
    for _ in range(rng.randint(0, 4)):
        at = rng.randrange(len(drifted))
        action = rng.choice(["insert", "insert", "delete", "edit"])
        if action == "insert":
            for _ in range(rng.randint(1, 6)):
                drifted.insert(at, f"    upstream_{rng.randint(0, 999)}(x)\n")
        elif action == "delete" and len(drifted) > 10:
            del drifted[at]
        else:
            drifted[at] = f"    edited_{rng.randint(0, 999)}(x)\n"
    return base, patch, drifted


def compare(ours: tuple[HunkResult, ...], theirs: list[GnuHunk] | None,
            stated: list[int]) -> None:
    if theirs is None:  # GNU: the first hunk is already there; we must say so too
        assert ours[0].status == HunkStatus.ALREADY_APPLIED, ours
        return
    for mine, other, first in zip(ours, theirs, stated, strict=True):
        if mine.status in DELIBERATE or (mine.status == HunkStatus.FAILED
                                         and "overlap" in mine.note):
            return  # a deliberate refusal; later hunks start from another state
        if mine.status in APPLIED_STATUSES:
            assert other.applied, f"engine applied {mine}, GNU patch did not"
            line = other.line if other.line is not None else first + 0
            if other.line is None:
                assert (mine.offset, mine.fuzz) == (0, 0), mine
            else:
                assert (mine.line, mine.offset, mine.fuzz) == \
                    (line, other.offset, other.fuzz), (mine, other)
        else:
            assert mine.status == HunkStatus.FAILED
            assert not other.applied, f"GNU applied {other}, engine failed: {mine}"


def test_generated_corpus_agrees_with_gnu_patch(tmp_path: Path) -> None:
    rng = random.Random(20261130)
    seen: dict[str, int] = {}
    for case in range(CASES):
        _, patch_text, drifted = make_case(rng)
        if not patch_text:
            continue
        (tmp_path / "case.diff").write_text(patch_text)
        hunks = parse_patch(tmp_path / "case.diff", 1).files[0].hunks
        ours = apply_file_hunks(split_lines("".join(drifted)), hunks).results
        theirs = gnu(tmp_path, drifted, patch_text, len(hunks))
        try:
            compare(ours, theirs, [h.first_line() for h in hunks])
        except AssertionError as exc:
            raise AssertionError(f"case {case}:\n{patch_text}\n{exc}") from None
        for result in ours:
            seen[result.status] = seen.get(result.status, 0) + 1
    # The corpus must exercise every placement the engine knows, or it proves little.
    for status in ("clean", "offset", "fuzz", "failed", "ambiguous"):
        assert seen.get(status, 0) >= 3, seen


def test_reapplying_generated_patches_is_already_applied(tmp_path: Path) -> None:
    rng = random.Random(7)
    for _ in range(40):
        base, patch_text, _ = make_case(rng)
        if not patch_text:
            continue
        (tmp_path / "case.diff").write_text(patch_text)
        hunks = parse_patch(tmp_path / "case.diff", 1).files[0].hunks
        patched = apply_file_hunks(base, hunks).new_lines
        assert patched is not None
        again = apply_file_hunks(patched, hunks).results
        assert again[0].status == HunkStatus.ALREADY_APPLIED
        theirs = gnu(tmp_path, patched, patch_text, len(hunks))
        # GNU patch either notices too, or "succeeds" on a second copy of the preimage
        # elsewhere in the file: the lie this engine refuses to tell.
        assert theirs is None or (theirs[0].applied and theirs[0].offset != 0)


@pytest.mark.parametrize("version", ["0.5.7", "0.5.9", "0.5.10.post1"])
def test_seed_patch_agrees_with_gnu_patch_on_real_releases(
        unpacked: dict[str, Path], tmp_path: Path, version: str) -> None:
    seed = REPO / "patches" / "0001-enable-flashinfer-cutlass-autotune.patch"
    text = (unpacked[version] / MODEL_RUNNER).read_text()
    work = tmp_path / "work"
    (work / "python" / Path(MODEL_RUNNER).parent).mkdir(parents=True)
    (work / "python" / MODEL_RUNNER).write_text(text)
    done = subprocess.run(["patch", "--dry-run", "-N", "-p1", "--fuzz=2", "-i", str(seed)],
                          cwd=work, capture_output=True, text=True, env={"LC_ALL": "C"})
    (hunk,) = parse_patch(seed, 1).files[0].hunks
    (ours,) = apply_file_hunks(split_lines(text), (hunk,)).results
    match = re.search(r"succeeded at (\d+)(?: with fuzz (\d+))?(?: \(offset (-?\d+) lines?\))?",
                      done.stdout)
    if match is None:  # silent success: exactly at the stated line
        assert done.returncode == 0 and (ours.status, ours.line) == ("clean", hunk.first_line())
    else:
        assert (ours.line, ours.fuzz, ours.offset) == \
            (int(match[1]), int(match[2] or 0), int(match[3] or 0))
