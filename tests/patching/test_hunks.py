"""The hunk matcher on small inputs written for this project, checked against GNU patch
(the test oracle, never part of the build path) where both apply a hunk."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from builder.patching.hunks import Hunk, HunkStatus, apply_file_hunks, split_lines
from builder.patching.patchfile import parse_patch

BASE = [f"value_{i} = compute({i})\n" for i in range(1, 41)]


def _hunks(tmp_path: Path, patch_text: str) -> list[Hunk]:
    file = tmp_path / "change.patch"
    file.write_text(patch_text)
    parsed = parse_patch(file, 1)
    return list(parsed.files[0].hunks)


def _diff(old_start: int, context_before: list[str], removed: list[str], added: list[str],
          context_after: list[str]) -> str:
    old_len = len(context_before) + len(removed) + len(context_after)
    new_len = len(context_before) + len(added) + len(context_after)
    body = [" " + c for c in context_before] + ["-" + r for r in removed] + \
        ["+" + a for a in added] + [" " + c for c in context_after]
    return (f"--- a/mod.py\n+++ b/mod.py\n@@ -{old_start},{old_len} +{old_start},{new_len} @@\n"
            + "".join(body))


def _standard_patch() -> str:
    # Replace line 20 ("value_20 ...") with three context lines on each side (17..23).
    return _diff(17, BASE[16:19], [BASE[19]], ["value_20 = compute(2000)\n"], BASE[20:23])


def gnu_patch(tmp_path: Path, lines: list[str], patch_text: str, fuzz: int = 2) -> str:
    """Run GNU patch --dry-run on a copy; return its output (the oracle)."""
    if shutil.which("patch") is None:
        pytest.fail("GNU patch is the test oracle and must be installed (apt-get install patch)")
    work = tmp_path / "gnu"
    work.mkdir(exist_ok=True)
    (work / "mod.py").write_text("".join(lines))
    (work / "p.patch").write_text(patch_text)
    done = subprocess.run(["patch", "--dry-run", "-N", "-p1", f"--fuzz={fuzz}", "-i", "p.patch"],
                          cwd=work, capture_output=True, text=True, env={"LC_ALL": "C"})
    return done.stdout + done.stderr


def gnu_placements(output: str) -> dict[int, tuple[int, int, int]]:
    """hunk -> (line, offset, fuzz) for hunks GNU reported as placed off their line."""
    found = {}
    for match in re.finditer(r"Hunk #(\d+) succeeded at (\d+)(?: with fuzz (\d+))?"
                             r"(?: \(offset (-?\d+) lines?\))?", output):
        found[int(match[1])] = (int(match[2]), int(match[4] or 0), int(match[3] or 0))
    return found


def test_clean_hunk_lands_on_its_line(tmp_path: Path) -> None:
    outcome = apply_file_hunks(BASE, _hunks(tmp_path, _standard_patch()))
    (result,) = outcome.results
    assert (result.status, result.line, result.offset, result.fuzz) == \
        (HunkStatus.CLEAN, 17, 0, 0)
    assert result.changed_line == 20
    assert outcome.new_lines is not None
    assert outcome.new_lines[19] == "value_20 = compute(2000)\n"
    assert "FAILED" not in gnu_patch(tmp_path, BASE, _standard_patch())


def test_offset_is_reported_like_gnu_patch(tmp_path: Path) -> None:
    shifted = ["# new header\n"] * 5 + BASE
    outcome = apply_file_hunks(shifted, _hunks(tmp_path, _standard_patch()))
    (result,) = outcome.results
    assert (result.status, result.line, result.offset, result.changed_line) == \
        (HunkStatus.OFFSET, 22, 5, 25)
    assert gnu_placements(gnu_patch(tmp_path, shifted, _standard_patch()))[1] == (22, 5, 0)


def test_fuzz_drops_outer_context_like_gnu_patch(tmp_path: Path) -> None:
    changed = list(BASE)
    changed[16] = "value_17 = compute(17)  # upstream edited the outermost context line\n"
    outcome = apply_file_hunks(changed, _hunks(tmp_path, _standard_patch()))
    (result,) = outcome.results
    assert (result.status, result.line, result.offset, result.fuzz) == \
        (HunkStatus.FUZZ, 17, 0, 1)
    # Fuzzed context keeps the file's text, as GNU patch does.
    assert outcome.new_lines is not None and outcome.new_lines[16] == changed[16]
    assert gnu_placements(gnu_patch(tmp_path, changed, _standard_patch()))[1] == (17, 0, 1)


def test_fuzz_search_limit_is_respected(tmp_path: Path) -> None:
    changed = list(BASE)
    changed[16] = "edited 17\n"
    outcome = apply_file_hunks(changed, _hunks(tmp_path, _standard_patch()), fuzz_search=0)
    assert outcome.results[0].status == HunkStatus.FAILED
    assert outcome.new_lines is None


def test_ambiguous_when_two_places_are_equally_near(tmp_path: Path) -> None:
    block = ["if ready:\n", "    start()\n", "    log('started')\n", "    wait()\n",
             "    done()\n", "    log('done')\n", "    stop()\n"]
    filler = [f"filler_{i}\n" for i in range(10)]
    lines = filler[:3] + block + filler[3:8] + block + filler[8:]
    first_copy, second_copy = 4, 4 + len(block) + 5
    stated = (first_copy + second_copy) // 2
    assert stated - first_copy == second_copy - stated
    patch = _diff(stated, block[:3], [block[3]], ["    wait(timeout=5)\n"], block[4:])
    (result,) = apply_file_hunks(lines, _hunks(tmp_path, patch)).results
    assert result.status == HunkStatus.AMBIGUOUS
    assert set(result.candidates) == {first_copy, second_copy}
    # GNU patch silently takes one of them:
    assert "succeeded" in gnu_patch(tmp_path, lines, patch)


def test_ambiguous_when_off_its_line_and_the_block_repeats(tmp_path: Path) -> None:
    block = ["try:\n", "    x = load()\n", "except OSError:\n", "    x = None\n",
             "finally:\n", "    close()\n", "    flush()\n"]
    lines = [f"a{i}\n" for i in range(30)] + block + [f"b{i}\n" for i in range(5)] + block
    patch = _diff(5, block[:3], [block[3]], ["    x = default()\n"], block[4:])
    (result,) = apply_file_hunks(lines, _hunks(tmp_path, patch)).results
    assert result.status == HunkStatus.AMBIGUOUS
    assert result.candidates == (31, 43)
    gnu = gnu_placements(gnu_patch(tmp_path, lines, patch))
    assert gnu[1][0] == 31  # GNU patch picks the nearest copy and reports success


def test_unique_block_off_its_line_is_only_an_offset(tmp_path: Path) -> None:
    block = ["try:\n", "    x = load()\n", "except OSError:\n", "    x = None\n",
             "finally:\n", "    close()\n", "    flush()\n"]
    lines = [f"a{i}\n" for i in range(30)] + block
    patch = _diff(5, block[:3], [block[3]], ["    x = default()\n"], block[4:])
    (result,) = apply_file_hunks(lines, _hunks(tmp_path, patch)).results
    assert (result.status, result.line, result.offset) == (HunkStatus.OFFSET, 31, 26)


def test_already_applied_is_detected_not_reapplied(tmp_path: Path) -> None:
    hunks = _hunks(tmp_path, _standard_patch())
    patched = apply_file_hunks(BASE, hunks).new_lines
    assert patched is not None
    outcome = apply_file_hunks(patched, hunks)
    assert [r.status for r in outcome.results] == [HunkStatus.ALREADY_APPLIED]
    assert outcome.already_applied and outcome.new_lines is None
    assert "Reversed (or previously applied) patch detected" in \
        gnu_patch(tmp_path, patched, _standard_patch())


def test_failed_hunk_reports_nearest_place(tmp_path: Path) -> None:
    changed = list(BASE)
    changed[19] = "value_20 = compute(20) + upstream_change\n"
    outcome = apply_file_hunks(changed, _hunks(tmp_path, _standard_patch()))
    (result,) = outcome.results
    assert result.status == HunkStatus.FAILED and outcome.new_lines is None
    assert result.near_miss is not None
    assert (result.near_miss.line, result.near_miss.matched, result.near_miss.total) == \
        (17, 6, 7)
    assert "+value_20 = compute(20) + upstream_change" in result.near_miss.diff
    assert "FAILED" in gnu_patch(tmp_path, changed, _standard_patch())


def test_second_hunk_starts_from_the_first_hunks_offset(tmp_path: Path) -> None:
    first = _diff(5, BASE[4:7], [BASE[7]], ["value_8 = 8\n", "value_8b = 8\n"], BASE[8:11])
    second = _diff(25, BASE[24:27], [BASE[27]], ["value_28 = 28\n"], BASE[28:31])
    patch = first + second.split("\n", 2)[2].replace("+25,7", "+26,7")
    shifted = ["# one\n", "# two\n", *BASE]
    outcome = apply_file_hunks(shifted, _hunks(tmp_path, patch))
    assert [(r.status, r.line, r.offset) for r in outcome.results] == \
        [(HunkStatus.OFFSET, 7, 2), (HunkStatus.OFFSET, 28, 2)]
    gnu = gnu_placements(gnu_patch(tmp_path, shifted, patch))
    assert gnu == {1: (7, 2, 0), 2: (28, 2, 0)}


def test_one_bad_hunk_means_no_new_text(tmp_path: Path) -> None:
    first = _diff(5, BASE[4:7], [BASE[7]], ["value_8 = 8\n"], BASE[8:11])
    second = _diff(25, BASE[24:27], ["not in the file\n"], ["x\n"], BASE[28:31])
    patch = first + second.split("\n", 2)[2]
    outcome = apply_file_hunks(BASE, _hunks(tmp_path, patch))
    assert [r.status for r in outcome.results] == [HunkStatus.CLEAN, HunkStatus.FAILED]
    assert outcome.new_lines is None


def test_no_newline_at_end_of_file_is_kept_as_the_patch_says(tmp_path: Path) -> None:
    text = "alpha\nbeta\ngamma"
    patch = ("--- a/mod.py\n+++ b/mod.py\n@@ -1,3 +1,3 @@\n alpha\n beta\n-gamma\n"
             "\\ No newline at end of file\n+delta\n\\ No newline at end of file\n")
    outcome = apply_file_hunks(split_lines(text), _hunks(tmp_path, patch))
    assert outcome.new_lines == ["alpha\n", "beta\n", "delta"]


def test_split_lines_only_splits_at_newlines() -> None:
    assert split_lines("a\x0cb\nc\r\nd") == ["a\x0cb\n", "c\r\n", "d"]
    assert split_lines("") == []
