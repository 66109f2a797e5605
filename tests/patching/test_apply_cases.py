"""Every way a patch can lie, one small input each (written for this project): the status
the engine reports, the exact result, and an untouched tree on every refusal."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from builder import BuilderError
from builder.patching.apply import PatchStatus, apply_series
from builder.patching.hunks import HunkStatus
from builder.patching.series import Series
from builder.patching.status import FileStatus
from builder.source.fetch import local_source
from tests.helpers.patch_trees import make_tree, series_of

LINES = "".join(f"line {i}\n" for i in range(1, 21))


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode)
            for p in sorted(root.rglob("*")) if p.is_file()}


def apply(tree: Path, series: Series):  # type: ignore[no-untyped-def]
    return apply_series(local_source(tree, "1.0"), series, in_place=True)


def refused(tree: Path, series: Series, *fragments: str) -> BuilderError:
    before = snapshot(tree)
    with pytest.raises(BuilderError) as caught:
        apply(tree, series)
    message = caught.value.cause
    for fragment in fragments:
        assert fragment in message, message
    assert snapshot(tree) == before, "a refusal must leave the tree untouched"
    return caught.value


def file_report(error: BuilderError, index: int = 0):  # type: ignore[no-untyped-def]
    return error.report.patches[0].files[index]


CREATE = """diff --git a/docs/new.txt b/docs/new.txt
new file mode 100644
index 0000000..1111111
--- /dev/null
+++ b/docs/new.txt
@@ -0,0 +1,2 @@
+hello
+world
"""


def test_create_file(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {})
    result = apply(tree, series_of(tmp_path, CREATE))
    assert (tree / "docs/new.txt").read_text() == "hello\nworld\n"
    assert result.report.patches[0].files[0].status == "created"


def test_new_file_exists_identical_is_already_applied(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"docs/new.txt": "hello\nworld\n"})
    result = apply_series(local_source(tree, "1.0"), series_of(tmp_path, CREATE), dry_run=True)
    (patch,) = result.report.patches
    assert patch.status == PatchStatus.ALREADY_APPLIED
    assert patch.files[0].hunks[0].decided_by == FileStatus.NEW_FILE_EXISTS
    assert "identical" in patch.files[0].note


def test_new_file_exists_different_is_refused_not_deleted(tmp_path: Path) -> None:
    # GNU patch -t would take this for a reversed patch and delete the file.
    tree = make_tree(tmp_path / "t", {"docs/new.txt": "somebody else's file\n"})
    error = refused(tree, series_of(tmp_path, CREATE), "0001-case.patch", "docs/new.txt",
                    "new-file-exists", "different content")
    assert file_report(error).hunks[0].decided_by == FileStatus.NEW_FILE_EXISTS


def test_delete_file(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"old.txt": "a\nb\n"})
    patch = ("diff --git a/old.txt b/old.txt\ndeleted file mode 100644\n--- a/old.txt\n"
             "+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n")
    apply(tree, series_of(tmp_path, patch))
    assert not (tree / "old.txt").exists()


def test_delete_refuses_a_file_with_other_content(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"old.txt": "a\nb\nc\n"})
    patch = "--- a/old.txt\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n"
    refused(tree, series_of(tmp_path, patch), "old.txt", "not deleting")


def test_missing_file_says_where_it_moved(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"python/pkg/new_home/util.py": LINES})
    patch = ("--- a/python/pkg/util.py\n+++ b/python/pkg/util.py\n@@ -4,7 +4,7 @@\n line 4\n"
             " line 5\n line 6\n-line 7\n+line seven\n line 8\n line 9\n line 10\n")
    error = refused(tree, series_of(tmp_path, patch), "missing-file",
                    "python/pkg/util.py does not exist",
                    "matching content is at python/pkg/new_home/util.py (moved?)")
    assert file_report(error).hunks[0].decided_by == FileStatus.MISSING_FILE


@pytest.mark.parametrize(("file_eol", "patch_eol"), [("\r\n", "\n"), ("\n", "\r\n")])
def test_line_ending_mismatch_is_reported_never_converted(tmp_path: Path, file_eol: str,
                                                          patch_eol: str) -> None:
    content = LINES.replace("\n", file_eol)
    tree = make_tree(tmp_path / "t", {"win.txt": content})
    body = "".join(f"{kind}{text}{patch_eol}" for kind, text in [
        (" ", "line 4"), (" ", "line 5"), (" ", "line 6"), ("-", "line 7"),
        ("+", "line seven"), (" ", "line 8"), (" ", "line 9"), (" ", "line 10")])
    patch = f"--- a/win.txt\n+++ b/win.txt\n@@ -4,7 +4,7 @@\n{body}"
    error = refused(tree, series_of(tmp_path, patch), "eol-mismatch")
    hunk = file_report(error).hunks[0]
    assert hunk.decided_by == FileStatus.EOL_MISMATCH and "not converting" in hunk.note
    assert hunk.status == HunkStatus.FAILED and hunk.to_json()["status"] == "eol-mismatch"


def test_binary_patch_is_refused(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"logo.png": b"\x89PNG"})
    patch = ("diff --git a/logo.png b/logo.png\nindex 1111111..2222222 100644\n"
             "GIT binary patch\nliteral 4\nLcmZ?wWMTjS00jU8\n\nliteral 4\nLcmZ?wWMTjS00jU8\n\n")
    refused(tree, series_of(tmp_path, patch), "logo.png: binary",
            "binary diffs (GIT binary patch) are not supported")


def test_no_newline_added_at_end(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"f.txt": "a\nb"})
    patch = ("--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n a\n-b\n"
             "\\ No newline at end of file\n+b\n")
    apply(tree, series_of(tmp_path, patch))
    assert (tree / "f.txt").read_bytes() == b"a\nb\n"


def test_no_newline_removed_at_end(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"f.txt": "a\nb\n"})
    patch = ("--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
             "\\ No newline at end of file\n")
    apply(tree, series_of(tmp_path, patch))
    assert (tree / "f.txt").read_bytes() == b"a\nc"


def test_rename_with_changes(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"src/a.py": LINES})
    patch = ("diff --git a/src/a.py b/src/b.py\nsimilarity index 90%\nrename from src/a.py\n"
             "rename to src/b.py\n--- a/src/a.py\n+++ b/src/b.py\n@@ -1,4 +1,4 @@\n-line 1\n"
             "+line one\n line 2\n line 3\n line 4\n")
    result = apply(tree, series_of(tmp_path, patch))
    assert not (tree / "src/a.py").exists()
    assert (tree / "src/b.py").read_text() == LINES.replace("line 1\n", "line one\n", 1)
    assert result.report.patches[0].files[0].status == "renamed"


def test_pure_rename_and_copy(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"a.txt": "x\n", "c.txt": "y\n"})
    patch = ("diff --git a/a.txt b/b.txt\nsimilarity index 100%\nrename from a.txt\n"
             "rename to b.txt\ndiff --git a/c.txt b/d.txt\nsimilarity index 100%\n"
             "copy from c.txt\ncopy to d.txt\n")
    result = apply(tree, series_of(tmp_path, patch))
    assert not (tree / "a.txt").exists() and (tree / "b.txt").read_text() == "x\n"
    assert (tree / "c.txt").read_text() == "y\n" and (tree / "d.txt").read_text() == "y\n"
    assert [f.status for f in result.report.patches[0].files] == ["renamed", "copied"]


def test_rename_onto_an_existing_file_is_refused(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"a.txt": "x\n", "b.txt": "mine\n"})
    patch = ("diff --git a/a.txt b/b.txt\nsimilarity index 100%\nrename from a.txt\n"
             "rename to b.txt\n")
    refused(tree, series_of(tmp_path, patch), "new-file-exists", "b.txt already exists")


def test_mode_change(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"run.sh": "#!/bin/sh\n"})
    os.chmod(tree / "run.sh", 0o644)
    patch = "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n"
    result = apply(tree, series_of(tmp_path, patch))
    assert stat.S_IMODE((tree / "run.sh").stat().st_mode) == 0o755
    assert result.report.patches[0].files[0].status == "mode"
    again = apply_series(local_source(tree, "1.0"), series_of(tmp_path, patch), dry_run=True)
    assert again.report.patches[0].status == PatchStatus.ALREADY_APPLIED


def test_strip_level_is_fixed_not_guessed(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"f.txt": "a\nb\n"})
    plain = "--- f.txt\n+++ f.txt\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
    apply(tree, series_of(tmp_path, plain, strip=0))
    assert (tree / "f.txt").read_text() == "a\nc\n"
    prefixed = "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n a\n-c\n+d\n"
    # strip 0 keeps the a/ prefix: no such file, and no guessing of another level
    refused(tree, series_of(tmp_path, prefixed, strip=0), "missing-file",
            "a/f.txt does not exist")


def test_two_patches_touching_the_same_file(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"f.txt": LINES})
    first = ("--- a/f.txt\n+++ b/f.txt\n@@ -4,7 +4,8 @@\n line 4\n line 5\n line 6\n"
             "+inserted\n line 7\n line 8\n line 9\n line 10\n")
    # written against the tree with the first patch applied (line numbers shifted by one)
    second = ("--- a/f.txt\n+++ b/f.txt\n@@ -5,7 +5,7 @@\n line 5\n line 6\n inserted\n"
              "-line 7\n+line seven\n line 8\n line 9\n line 10\n")
    result = apply(tree, series_of(tmp_path, first, second))
    assert [p.status for p in result.report.patches] == [PatchStatus.APPLIED] * 2
    assert (tree / "f.txt").read_text().splitlines()[5:8] == ["line 6", "inserted",
                                                               "line seven"]
    assert result.report.patches[1].files[0].hunks[0].status == HunkStatus.CLEAN


def test_diff_quoted_in_a_format_patch_message_is_not_applied(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"f.txt": "a\nb\n", "g.txt": "one\ntwo\n"})
    mail = """From 1234567890abcdef1234567890abcdef12345678 Mon Sep 17 00:00:00 2001
From: Dev <dev@example.invalid>
Subject: [PATCH] change g, not f

An earlier attempt looked like this and was wrong:

--- a/f.txt
+++ b/f.txt
@@ -1,2 +1,2 @@
 a
-b
+WRONG
---
 g.txt | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/g.txt b/g.txt
--- a/g.txt
+++ b/g.txt
@@ -1,2 +1,2 @@
 one
-two
+three
--
2.43.0
"""
    result = apply(tree, series_of(tmp_path, mail))
    assert (tree / "f.txt").read_text() == "a\nb\n"
    assert (tree / "g.txt").read_text() == "one\nthree\n"
    assert [f.path for f in result.report.patches[0].files] == ["g.txt"]


def test_two_hunks_may_not_use_the_same_region(tmp_path: Path) -> None:
    content = "".join(f"{w}\n" for w in "abcdefghijkl")
    tree = make_tree(tmp_path / "t", {"f.txt": content})
    # Hunk 2's context line "d" is a line hunk 1 removes. GNU patch applies both and
    # prints "a b c x y f ..."; here hunk 2 may not match over hunk 1's change.
    patch = ("--- a/f.txt\n+++ b/f.txt\n@@ -2,5 +2,5 @@\n b\n c\n-d\n+x\n e\n f\n"
             "@@ -3,5 +3,5 @@\n c\n d\n-e\n+y\n f\n g\n")
    error = refused(tree, series_of(tmp_path, patch), "hunk #2")
    hunk = file_report(error).hunks[1]
    assert hunk.status == HunkStatus.FAILED
    assert "overlap the region an earlier hunk changed" in hunk.note


def test_every_rejection_names_patch_hunk_and_reason(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"f.txt": LINES})
    patch = ("--- a/f.txt\n+++ b/f.txt\n@@ -4,3 +4,3 @@\n line 4\n-line 5\n+five\n line 6\n"
             "@@ -14,3 +14,3 @@\n line 14\n-not there\n+x\n line 16\n")
    refused(tree, series_of(tmp_path, patch), "patch 0001-case.patch failed",
            "f.txt: failed", "hunk #2: failed", "the preimage was not found")


def test_same_hunk_twice_is_refused_not_applied_elsewhere(tmp_path: Path) -> None:
    content = LINES + LINES.replace("line", "copy")  # the block, and a near twin later
    content += "".join(f"line {i}\n" for i in range(4, 11))  # an exact twin of 4..10
    tree = make_tree(tmp_path / "t", {"f.txt": content})
    hunk = ("@@ -4,7 +4,7 @@\n line 4\n line 5\n line 6\n-line 7\n+line seven\n line 8\n"
            " line 9\n line 10\n")
    patch = "--- a/f.txt\n+++ b/f.txt\n" + hunk + hunk
    # GNU patch applies hunk 2 to the twin at line 41 and reports success.
    error = refused(tree, series_of(tmp_path, patch), "hunk #2: ambiguous")
    assert file_report(error).hunks[1].candidates == (4, 41)


def test_deletion_without_context(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"f.txt": "x = 0\ny = 1\n"})
    patch = "--- a/f.txt\n+++ b/f.txt\n@@ -1 +0,0 @@\n-x = 0\n"
    apply(tree, series_of(tmp_path, patch))
    assert (tree / "f.txt").read_text() == "y = 1\n"
