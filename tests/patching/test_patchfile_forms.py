"""Every form in which git, diff and svn write a patch (docs/patch-forms.md), and the five
inputs of tests/cases/ (each one member of a fault class found by trying the builder as a
new user would): run as a user runs them, with the right outcome."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from builder import BuilderError
from builder.core.config import load_targets, local_version
from builder.patching.apply import apply_series
from builder.patching.patchfile import parse_patch, quote_path, unquote_path
from builder.source.fetch import local_source
from tests.helpers.cli import run_cli
from tests.helpers.oracles import oracle_tree
from tests.helpers.paths import TESTS

CASES = TESTS / "cases"


def copy_case(name: str, tmp_path: Path) -> Path:
    """A writable copy of one case folder."""
    work = tmp_path / name
    shutil.copytree(CASES / name, work, symlinks=True)
    for path in [work, *work.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return work


def snapshot(root: Path) -> dict[str, tuple[str, bytes | str, int]]:
    """Every entry under ``root``: files with bytes and mode, links with their target."""
    out: dict[str, tuple[str, bytes | str, int]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path), 0)
        elif path.is_file():
            out[rel] = ("file", path.read_bytes(), stat.S_IMODE(path.stat().st_mode))
        else:
            out[rel] = ("dir", b"", 0)
    return out


# --- the five cases, as the user ran them ------------------------------------------------


def test_case_quoted_path_new_file(tmp_path: Path) -> None:
    case = copy_case("quoted-path-new-file", tmp_path)
    done = run_cli("patch", "--source-dir", str(case / "tree"), "--patch",
                   str(case / "case.patch"), "--upstream-version", "0.5.9", cwd=case)
    assert done.returncode == 0, done.stderr
    created = case / "tree" / "python" / "sglang" / "naïve.py"
    assert created.read_text() == "Y = 2\n"
    assert sorted(p.name for p in (case / "tree" / "python" / "sglang").iterdir()) == \
        ["naïve.py"]


def test_case_diff_n_epoch_delete(tmp_path: Path) -> None:
    case = copy_case("diff-N-epoch-delete", tmp_path)
    done = run_cli("patch", "--source-dir", str(case / "tree"), "--patch",
                   str(case / "case.patch"), "--upstream-version", "0.5.9", cwd=case)
    assert done.returncode == 0, done.stderr
    assert not (case / "tree" / "python" / "sglang" / "dead.py").exists()
    assert (case / "tree" / "python" / "sglang" / "keep.py").is_file()
    assert "deleted" in done.stdout


def test_case_symlink_dir_outside(tmp_path: Path) -> None:
    case = copy_case("symlink-dir-outside", tmp_path)
    outside = tmp_path / "o"
    outside.mkdir()
    (outside / "victim.txt").write_text("x\n")
    (case / "tree" / "link").symlink_to(outside)
    before, before_outside = snapshot(case / "tree"), snapshot(outside)
    done = run_cli("patch", "--source-dir", str(case / "tree"), "--patch",
                   str(case / "case.patch"), "--upstream-version", "0.5.9", cwd=case)
    assert done.returncode == 5
    assert "symbolic link" in done.stderr and "link -> " in done.stderr
    assert done.stderr.count("error:") == 1
    assert snapshot(case / "tree") == before
    assert snapshot(outside) == before_outside
    assert (outside / "victim.txt").read_text() == "x\n"


def test_case_refresh_new_file_mode(tmp_path: Path) -> None:
    case = copy_case("refresh-new-file-mode", tmp_path)
    out = tmp_path / "out"
    done = run_cli("refresh", "--targets-file", "targets.toml", "--source-dir", "../tree",
                   "--upstream-version", "0.5.9", "--series", "patches/series.toml",
                   "--output-dir", str(out), cwd=case / "refresh")
    assert done.returncode == 0, done.stderr
    refreshed = out / "0001-launcher.patch"
    assert "new file mode 100755\n" in refreshed.read_text()
    original = case / "refresh" / "patches" / "0001-launcher.patch"
    # The refreshed patch gives the tree the original gives, mode included, with both
    # oracles.
    for tool in ("gnu", "git"):
        trees = [oracle_tree(tool, case / "tree", patch, tmp_path / f"{tool}-{i}")
                 for i, patch in enumerate((original, refreshed))]
        assert trees[0] == trees[1], tool
        assert trees[1]["python/sglang/tools/run.sh"][2] & 0o100


def test_case_upstream_local_version(tmp_path: Path) -> None:
    case = copy_case("upstream-local-version", tmp_path)
    toml = case / "targets.toml"
    toml.write_text(toml.read_text().replace("@HERE@", str(case)))
    dist = tmp_path / "dist"
    done = run_cli("wheel", "--targets-file", str(toml), "--dist", str(dist), "--json",
                   cwd=case, cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    (wheel,) = dist.glob("*.whl")
    assert wheel.name == "sglang-0.5.11+cu130.sm120.1-py3-none-any.whl"
    assert Version("0.5.11+cu130.sm120.1").local == "cu130.sm120.1"
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install",
                          "--no-deps", "--no-index", "--target", str(target), str(wheel)],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    metadata = next(target.glob("*.dist-info")) / "METADATA"
    assert "Version: 0.5.11+cu130.sm120.1\n" in metadata.read_text()
    assert '"flashinfer_cutlass",' in (target / "sglang" / "srt" / "mod.py").read_text()
    assert "0.5.11+cu130.sm120.1" in json.dumps(json.loads(done.stdout))


# --- versions ----------------------------------------------------------------------------


def test_local_version_appends_to_an_upstream_local_label() -> None:
    assert local_version("0.5.9", "sm120.1") == "0.5.9+sm120.1"
    assert local_version("0.5.11+cu130", "sm120.1") == "0.5.11+cu130.sm120.1"
    for version in ("0.5.9+sm120.1", "0.5.11+cu130.sm120.1"):
        assert str(Version(version)) == version


def test_a_version_too_long_for_an_image_tag_is_refused_at_load(tmp_path: Path) -> None:
    case = copy_case("upstream-local-version", tmp_path)
    toml = case / "targets.toml"
    label = ".".join(["sm120"] * 22)
    toml.write_text(toml.read_text().replace('local_label = "sm120.1"',
                                             f'local_label = "{label}"'))
    with pytest.raises(BuilderError, match="image tag"):
        load_targets(toml)


# --- C-quoting, read and written as git does ---------------------------------------------

NAMES = ["naïve.py", "tab\there.py", 'quo"te.py', "back\\slash.py", "sp ace.py",
         "日本.py", "plain.py"]


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", *args],
                          cwd=cwd, capture_output=True, text=True, check=True,
                          env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd)})
    return done.stdout


def test_quote_path_writes_exactly_what_git_writes(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    for name in NAMES:
        (repo / name).write_text("x\n")
    git(repo, "add", "-A")
    diff = git(repo, "diff", "--cached")
    for name in NAMES:
        line = f"diff --git {quote_path('a/' + name)} {quote_path('b/' + name)}\n"
        assert line in diff, (name, diff)
        plus = f"+++ {quote_path('b/' + name)}" + ("\t" if " " in name else "") + "\n"
        assert plus in diff, (name, diff)
        if quote_path(name) != name:
            assert unquote_path(quote_path(name))[0] == name


def test_quoted_paths_everywhere_a_path_appears(tmp_path: Path) -> None:
    """Edits, creations, deletions, renames and copies of quoted names, made by git and
    applied by the builder: the same tree as git's own."""
    repo = tmp_path / "r"
    (repo / "python").mkdir(parents=True)
    (repo / "python" / "pyproject.toml").write_text("[project]\n")
    git(repo, "init", "-q")
    body = "".join(f"line {i}\n" for i in range(30))
    for name in ("naïve.py", "dé.py", "gone ü.py", "src\\x.py"):
        (repo / name).write_text(name + "\n" + body)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = tmp_path / "base"
    shutil.copytree(repo, base, ignore=shutil.ignore_patterns(".git"))
    (repo / "naïve.py").write_text("naïve.py\n" + body.replace("line 5\n", "line five\n"))
    (repo / "dé.py").rename(repo / "renamed \"é\".py")
    (repo / "gone ü.py").unlink()
    shutil.copy(repo / "src\\x.py", repo / "copie\tx.py")
    (repo / "new ñ.py").write_text("new\n")
    git(repo, "add", "-A")
    patch = tmp_path / "q.patch"
    patch.write_text(git(repo, "diff", "--cached", "-M", "-C", "--find-copies-harder"))
    text = patch.read_text()
    assert '"a/na\\303\\257ve.py"' in text and "rename from" in text and "copy to" in text
    apply_series(local_source(base, "1.0"), series_for(patch), in_place=True)
    expected = {k: v for k, v in snapshot(repo).items() if not k.startswith(".git")}
    assert {k: v[:2] for k, v in snapshot(base).items()} == \
        {k: v[:2] for k, v in expected.items()}


def series_for(patch: Path, strip: int = 1):  # type: ignore[no-untyped-def]
    from packaging.specifiers import SpecifierSet

    from builder.patching.series import Series, SeriesEntry
    return Series(path=None, entries=(SeriesEntry(path=patch, sha256=None, strip=strip,
                                                  versions=SpecifierSet()),))


# --- creations and deletions -------------------------------------------------------------

DELETE_STAMPS = ["1970-01-01 00:00:00.000000000 +0000", "1970-01-01 00:00:00 +0000",
                 "1970-01-01 00:00:00.000000000", "1970-01-01 00:00:00",
                 "1969-12-31 19:00:00.000000000 -0500", "1970-01-01 09:00:00 +0900",
                 "(nonexistent)", "Thu Jan  1 00:00:00 1970"]


def make_tree(root: Path, files: dict[str, str]) -> Path:
    (root / "python").mkdir(parents=True)
    (root / "python" / "pyproject.toml").write_text("[project]\n")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("stamp", DELETE_STAMPS)
def test_every_absent_side_form_deletes_and_creates(tmp_path: Path, stamp: str) -> None:
    tree = make_tree(tmp_path / "t", {"python/dead.py": "a\nb\n"})
    delete = tmp_path / "d.patch"
    delete.write_text(f"--- a/python/dead.py\t2026-11-30 10:00:00 +0000\n"
                      f"+++ b/python/dead.py\t{stamp}\n@@ -1,2 +0,0 @@\n-a\n-b\n")
    result = apply_series(local_source(tree, "1.0"), series_for(delete), in_place=True)
    assert not (tree / "python" / "dead.py").exists()
    assert result.report.patches[0].files[0].status == "deleted"
    create = tmp_path / "c.patch"
    create.write_text(f"--- a/python/dead.py\t{stamp}\n"
                      f"+++ b/python/dead.py\t2026-11-30 10:00:00 +0000\n"
                      "@@ -0,0 +1,2 @@\n+a\n+b\n")
    result = apply_series(local_source(tree, "1.0"), series_for(create), in_place=True)
    assert (tree / "python" / "dead.py").read_text() == "a\nb\n"
    assert result.report.patches[0].files[0].status == "created"


def test_a_stamp_that_is_not_the_epoch_leaves_an_emptied_file(tmp_path: Path) -> None:
    """As GNU patch and git apply do: only the absent-side forms delete."""
    tree = make_tree(tmp_path / "t", {"python/x.py": "a\n"})
    patch = tmp_path / "p.patch"
    patch.write_text("--- a/python/x.py\t2026-11-30 10:00:00 +0000\n"
                     "+++ b/python/x.py\t1970-01-01 00:00:01 +0000\n@@ -1 +0,0 @@\n-a\n")
    apply_series(local_source(tree, "1.0"), series_for(patch), in_place=True)
    assert (tree / "python" / "x.py").read_bytes() == b""


def test_svn_deletion_removes_the_file(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"python/old.py": "a\nb\n"})
    patch = tmp_path / "svn.patch"
    patch.write_text("Index: python/old.py\n" + "=" * 67 + "\n"
                     "--- python/old.py\t(revision 1)\n+++ python/old.py\t(nonexistent)\n"
                     "@@ -1,2 +0,0 @@\n-a\n-b\n"
                     "Index: python/new file.py\n" + "=" * 67 + "\n"
                     "--- python/new file.py\t(nonexistent)\n"
                     "+++ python/new file.py\t(working copy)\n@@ -0,0 +1 @@\n+x\n")
    apply_series(local_source(tree, "1.0"), series_for(patch, strip=0), in_place=True)
    assert not (tree / "python" / "old.py").exists()
    assert (tree / "python" / "new file.py").read_text() == "x\n"


# --- symbolic links ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dir-outside", "file-outside", "file-inside",
                                  "dir-inside", "dangling"])
def test_no_read_or_write_through_a_link(tmp_path: Path, kind: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("x\n")
    tree = make_tree(tmp_path / "t", {"python/real/victim.py": "x\n"})
    target = {"dir-outside": outside, "file-outside": outside / "victim.py",
              "file-inside": tree / "python/real/victim.py", "dir-inside": Path("real"),
              "dangling": outside / "nowhere.py"}[kind]
    link = tree / "python" / "link"
    link.symlink_to(target)
    path = "python/link/victim.py" if kind.startswith("dir") else "python/link"
    patch = tmp_path / "p.patch"
    create = kind == "dangling"
    patch.write_text(f"--- {'/dev/null' if create else 'a/' + path}\n+++ b/{path}\n"
                     + ("@@ -0,0 +1 @@\n+PWNED\n" if create else
                        "@@ -1 +1 @@\n-x\n+PWNED\n"))
    before, before_outside = snapshot(tree), snapshot(outside)
    with pytest.raises(BuilderError) as caught:
        apply_series(local_source(tree, "1.0"), series_for(patch), in_place=True)
    assert "symbolic link" in caught.value.cause
    assert caught.value.report.patches[0].files[0].status == "symlink"
    assert snapshot(tree) == before and snapshot(outside) == before_outside


def test_git_symlink_mode_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    (repo / "python").mkdir(parents=True)
    (repo / "python" / "pyproject.toml").write_text("[project]\n")
    (repo / "python" / "a.py").write_text("a\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = tmp_path / "base"
    shutil.copytree(repo, base, ignore=shutil.ignore_patterns(".git"))
    (repo / "python" / "a.py").write_text("b\n")
    (repo / "python" / "l").symlink_to("/etc")
    git(repo, "add", "-A")
    patch = tmp_path / "l.patch"
    patch.write_text(git(repo, "diff", "--cached"))
    assert "new file mode 120000" in patch.read_text()
    before = snapshot(base)
    with pytest.raises(BuilderError) as caught:
        apply_series(local_source(base, "1.0"), series_for(patch), in_place=True)
    assert "120000" in caught.value.cause
    assert snapshot(base) == before


# --- messages that tell the truth --------------------------------------------------------


def test_end_of_file_anchoring_is_named(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"python/f.py": "a\nb\nc\nd\ne\nf\n"})
    patch = tmp_path / "p.patch"
    patch.write_text("--- a/python/f.py\n+++ b/python/f.py\n@@ -2,4 +2,3 @@\n b\n c\n d\n-e\n")
    with pytest.raises(BuilderError) as caught:
        apply_series(local_source(tree, "1.0"), series_for(patch), in_place=True)
    assert "must end at the end of the file" in caught.value.cause
    assert "preimage was not found" not in caught.value.cause


@pytest.mark.parametrize(("encoding", "named"), [
    ("utf-16", "UTF-16LE (with BOM)"), ("utf-16-le", "UTF-16LE"), ("utf-16-be", "UTF-16BE"),
    ("utf-32", "UTF-32LE (with BOM)"), ("utf-32-le", "UTF-32LE"), ("utf-32-be", "UTF-32BE")])
def test_wide_patch_files_are_named(tmp_path: Path, encoding: str, named: str) -> None:
    patch = tmp_path / "p.patch"
    patch.write_bytes("--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n-a\n+b\n".encode(encoding))
    with pytest.raises(BuilderError) as caught:
        parse_patch(patch, 1)
    assert f"is encoded as {named}," in caught.value.cause
    assert "iconv" in caught.value.hint


def test_zero_context_hunks_are_warned(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"python/f.py": "a\nb\nc\nd\n"})
    patch = tmp_path / "p.patch"
    patch.write_text("--- a/python/f.py\n+++ b/python/f.py\n@@ -2 +2 @@\n-b\n+B\n")
    done = run_cli("patch", "--source-dir", str(tree), "--patch", str(patch),
                   "--upstream-version", "1.0", "--dry-run")
    assert done.returncode == 0 and "warning: no context lines" in done.stdout
    result = apply_series(local_source(tree, "1.0"), series_for(patch), in_place=True)
    (warning,) = result.report.warnings
    assert "diff -U0" in warning
    assert (tree / "python" / "f.py").read_text() == "a\nB\nc\nd\n"


def test_a_context_diff_is_named(tmp_path: Path) -> None:
    patch = tmp_path / "c.patch"
    patch.write_text("*** a/f.py\t2026-01-01\n--- b/f.py\t2026-01-01\n***************\n"
                     "*** 1 ****\n! a\n--- 1 ----\n! b\n")
    with pytest.raises(BuilderError, match=r"context diff \(diff -c\)"):
        parse_patch(patch, 1)


def test_a_hunk_outside_any_file_is_refused_not_skipped(tmp_path: Path) -> None:
    """GNU patch skips such a hunk as garbage and exits 0 with the change missing."""
    tree = make_tree(tmp_path / "t", {"python/f.py": "".join(f"{i}\n" for i in range(20))})
    patch = tmp_path / "p.patch"
    patch.write_text("--- a/python/f.py\n+++ b/python/f.py\n@@ -1,3 +1,3 @@\n 0\n-1\n+one\n 2\n"
                     "# a comment someone added\n@@ -10,3 +10,3 @@\n 9\n-10\n+ten\n 11\n")
    before = snapshot(tree)
    with pytest.raises(BuilderError, match="a hunk outside any file's diff"):
        apply_series(local_source(tree, "1.0"), series_for(patch), in_place=True)
    assert snapshot(tree) == before


def test_no_write_into_git_and_no_crafted_modes(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {".git/hooks/README": "x\n"})
    hook = tmp_path / "hook.patch"
    hook.write_text("--- /dev/null\n+++ b/.git/hooks/post-checkout\n@@ -0,0 +1 @@\n+echo x\n")
    with pytest.raises(BuilderError, match=r"inside \.git"):
        apply_series(local_source(tree, "1.0"), series_for(hook), in_place=True)
    assert not (tree / ".git" / "hooks" / "post-checkout").exists()
    mode = tmp_path / "mode.patch"
    mode.write_text("diff --git a/python/x.sh b/python/x.sh\nnew file mode 104777\n"
                    "--- /dev/null\n+++ b/python/x.sh\n@@ -0,0 +1 @@\n+x\n")
    apply_series(local_source(tree, "1.0"), series_for(mode), in_place=True)
    assert stat.S_IMODE((tree / "python" / "x.sh").stat().st_mode) == 0o755


def test_deleting_a_folder_is_refused_not_already_applied(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"python/sglang/m.py": "a\n"})
    patch = tmp_path / "p.patch"
    patch.write_text("--- a/python/sglang\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n")
    with pytest.raises(BuilderError, match="is a folder, not a file"):
        apply_series(local_source(tree, "1.0"), series_for(patch), in_place=True)
