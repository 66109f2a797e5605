"""Git copies and renames read their source's preimage, in whatever order the patch lists
its files; the builder's tree is ``git apply``'s (and GNU patch's where the two agree).

The patches are real git output (``git diff --cached -M -C --find-copies-harder`` of
edits made with git in a tree built here), their files also reversed, and hand-made
orders git does not write (modify, then rename the same file). Both oracles run on
copies of the same tree (tests/helpers/oracles.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from builder import BuilderError
from builder.patching.apply import apply_series
from builder.patching.series import Series, SeriesEntry
from builder.source.fetch import local_source
from tests.helpers.oracles import oracle_tree, tree_state

SRT = "python/sglang/srt"
BODY = "".join(f"v{i} = {i}\n" for i in range(1, 9))


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout


def _edit(path: Path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new))


# Each edit runs in a git work tree holding SRT/x.py (BODY); git writes the patch.
EDITS = {
    "modify x, copy x to z": lambda t: (shutil.copy(t / SRT / "x.py", t / SRT / "z.py"),
                                        _edit(t / SRT / "x.py", "v2 = 2", "v2 = 20")),
    "copy x to y with an edit, rename x to z": lambda t: (
        shutil.copy(t / SRT / "x.py", t / SRT / "y.py"),
        _edit(t / SRT / "y.py", "v2 = 2", "v2 = 20"),
        (t / SRT / "x.py").rename(t / SRT / "z.py")),
    "modify x, copy x to y and to z": lambda t: (
        shutil.copy(t / SRT / "x.py", t / SRT / "y.py"),
        shutil.copy(t / SRT / "x.py", t / SRT / "z.py"),
        _edit(t / SRT / "x.py", "v7 = 7", "v7 = 70")),
}

MODIFY_THEN_RENAME = f"""diff --git a/{SRT}/x.py b/{SRT}/x.py
--- a/{SRT}/x.py
+++ b/{SRT}/x.py
@@ -1,3 +1,3 @@
 v1 = 1
-v2 = 2
+v2 = 20
 v3 = 3
diff --git a/{SRT}/x.py b/{SRT}/y.py
similarity index 100%
rename from {SRT}/x.py
rename to {SRT}/y.py
"""


def _base(root: Path) -> Path:
    (root / SRT).mkdir(parents=True)
    (root / "python" / "pyproject.toml").write_text(
        '[project]\nname = "sglang"\nversion = "0.5.9"\n')
    (root / SRT / "x.py").write_text(BODY)
    return root


def _git_patch(work: Path, edit: str) -> str:
    repo = _base(work / "repo")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    EDITS[edit](repo)
    _git(repo, "add", "-A")
    return _git(repo, "diff", "--cached", "-M", "-C", "--find-copies-harder")


def _reversed(patch: str) -> str:
    return "".join(reversed([p for p in re.split(r"(?m)^(?=diff --git )", patch) if p]))


def _cases(work: Path) -> dict[str, str]:
    cases = {"modify x, then rename x to y (hand-made)": MODIFY_THEN_RENAME}
    for number, edit in enumerate(EDITS):
        text = _git_patch(work / f"git-{number}", edit)
        assert "copy from" in text, text  # git wrote the copy this case is about
        cases[edit] = text
        cases[f"{edit}, files reversed"] = _reversed(text)
    return cases


def _builder(base: Path, patch: Path, work: Path) -> dict[str, object] | None:
    shutil.copytree(base, work)
    before = tree_state(work)
    series = Series(path=None, entries=(SeriesEntry(path=patch, sha256=None, strip=1,
                                                    versions=SpecifierSet()),))
    try:
        apply_series(local_source(work, "0.5.9"), series, in_place=True)
    except BuilderError:
        assert tree_state(work) == before, "a refusal must leave the tree untouched"
        return None
    return tree_state(work)  # type: ignore[return-value]


@pytest.mark.parametrize("order", ["as written", "all"])
def test_copies_and_renames_read_the_preimage_as_git_apply_does(tmp_path: Path,
                                                                order: str) -> None:
    cases = _cases(tmp_path / "make")
    if order == "as written":
        cases = {k: v for k, v in cases.items() if "reversed" not in k}
    base = _base(tmp_path / "base")
    wrong: list[str] = []
    for number, (name, text) in enumerate(cases.items()):
        work = tmp_path / f"case-{number}"
        work.mkdir()
        patch = work / "p.patch"
        patch.write_text(text)
        git = oracle_tree("git", base, patch, work / "git")
        gnu = oracle_tree("gnu", base, patch, work / "gnu")
        ours = _builder(base, patch, work / "ours")
        where = f"{name}:\n{text}"
        assert git is not None, f"git apply refused {where}"
        if "reversed" not in name:  # GNU patch follows the order of the files
            assert gnu == git, f"the oracles disagree on {where}"
        if ours != git:
            wrong.append(name)
        # The copy's target is the preimage of x, never x as this patch left it.
        elif "copy x to z" in name:
            assert ours[f"{SRT}/z.py"][1] == BODY.encode(), where
    assert not wrong, f"the builder's tree is not git apply's for: {wrong}"


DEGENERATE = {
    "context only (git)": f"diff --git a/{SRT}/x.py b/{SRT}/x.py\n--- a/{SRT}/x.py\n"
                          f"+++ b/{SRT}/x.py\n@@ -1,3 +1,3 @@\n v1 = 1\n v2 = 2\n v3 = 3\n",
    "context only (plain)": f"--- a/{SRT}/x.py\n+++ b/{SRT}/x.py\n@@ -2,2 +2,2 @@\n v2 = 2\n"
                            " v3 = 3\n",
    "a real hunk, then context only": f"--- a/{SRT}/x.py\n+++ b/{SRT}/x.py\n@@ -1,2 +1,2 @@\n"
                                      "-v1 = 1\n+v1 = 10\n v2 = 2\n@@ -6,2 +6,2 @@\n v6 = 6\n"
                                      " v7 = 7\n",
}


@pytest.mark.parametrize("name", list(DEGENERATE))
def test_a_hunk_that_changes_nothing_is_malformed_as_both_oracles_say(
        tmp_path: Path, name: str) -> None:
    from tests.helpers.cli import run_cli

    base = _base(tmp_path / "base")
    patch = tmp_path / "p.patch"
    patch.write_text(DEGENERATE[name])
    assert oracle_tree("git", base, patch, tmp_path / "git") is None
    assert oracle_tree("gnu", base, patch, tmp_path / "gnu") is None
    before = tree_state(base)
    done = run_cli("patch", "--source-dir", str(base), "--patch", str(patch),
                   "--upstream-version", "0.5.9", cache=tmp_path / "cache")
    assert done.returncode == 5, done.stdout + done.stderr
    assert "changes nothing (no '-' or '+' line)" in done.stderr
    assert tree_state(base) == before
