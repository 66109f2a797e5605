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
from packaging.specifiers import SpecifierSet

from builder import BuilderError
from builder.patching.apply import apply_series
from builder.patching.hunks import (
    APPLIED_STATUSES,
    HunkResult,
    HunkStatus,
    apply_file_hunks,
    split_lines,
)
from builder.patching.patchfile import parse_patch, unquote_path
from builder.patching.refresh import refresh_series
from builder.patching.series import Series, SeriesEntry
from builder.source.fetch import local_source
from tests.helpers.oracles import Entry, oracle_tree, tree_state
from tests.helpers.paths import MODEL_RUNNER, REPO

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


# --- every form, tree by tree, with both oracles ------------------------------------------
#
# Each case is made by the real tools: a small git repository (python/pyproject.toml and a
# few files, some with names git C-quotes), one to three operations (edit, create, create
# executable, delete, rename, copy, chmod, symlink), then the change written as one of the
# forms below. The tree the change was made in is the truth: wherever the builder applies
# a patch, its tree must be that tree. GNU patch 2.7 and `git apply` are run on the same
# input; where both agree the builder gives their tree or refuses with a status that says
# why; where they disagree, FOLLOWS records which one the builder follows.

NAMES = ["python/sglang/mod.py", "python/sglang/naïve.py", "python/sglang/sp ace.py",
         'python/sglang/quo"te.py', "python/sglang/tab\tname.py", "python/sglang/b\\s.py",
         "python/日本/x.py", "python/dir x/y.py", "python/sglang/run.sh"]
FORMS = ["git", "git-U0", "diff-N", "diff-N-zone", "diff-N-nozone", "diff-N-seconds", "svn"]
# Refusals the builder makes on purpose where the oracles apply (docs/patch-forms.md).
DELIBERATE_REFUSALS = {"symlink"}
# Where an oracle's tree is not the builder's, what it did instead, per (form, oracle).
# "other tree" is only ever a deleted file left behind empty (checked below).
DIFFERENCES: dict[tuple[str, str], set[str]] = {
    # GNU patch 2.7.6 refuses some git patches that rename a file and delete another.
    ("git", "gnu"): {"refused"},
    # git apply refuses hunks without context unless given --unidiff-zero; GNU patch
    # refuses some -U0 renames and mode changes.
    ("git-U0", "git"): {"refused"}, ("git-U0", "gnu"): {"refused"},
    # git apply sees the epoch only with a time zone: without one it leaves the deleted
    # file empty; GNU patch deletes it (the builder follows GNU patch).
    ("diff-N-nozone", "git"): {"other tree"},
    # Neither oracle knows svn's "(nonexistent)": both leave a deleted file empty (the
    # builder deletes it, as svn meant), and both misread a raw name with a tab in it.
    ("svn", "gnu"): {"other tree", "refused"}, ("svn", "git"): {"other tree", "refused"},
}
# Where the oracles disagree with each other, the one the builder's tree is.
FOLLOWS: dict[str, set[str]] = {
    "git": {"git"}, "git-U0": {"git", "gnu"}, "diff-N-nozone": {"gnu"}, "svn": {"neither"},
}


def _git(cwd: Path, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CEILING_DIRECTORIES": str(cwd.parent), "LC_ALL": "C"}
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e",
                           "-c", "core.symlinks=true", *args], cwd=cwd, env=env,
                          capture_output=True, check=True)
    return done.stdout.decode("utf-8", "surrogateescape")


def _body(rng: random.Random, name: str) -> str:
    return f"# {name}\n" + "".join(rng.choice(VOCABULARY) for _ in range(rng.randint(8, 30)))


def _svn(diff_n: str) -> str:
    """GNU diff -ruN output rewritten as svn 1.14 writes it (Index: line, bare paths,
    "(nonexistent)" / "(revision 1)" / "(working copy)"; checked against a real svn
    diff by hand, see docs/patch-forms.md)."""
    out = []
    for line in diff_n.splitlines(keepends=True):
        if line.startswith("diff -ruN "):
            continue
        if line.startswith(("--- ", "+++ ")):
            marker, rest = line[:4], line[4:].rstrip("\n")
            name, stamp = rest.rsplit("\t", 1)
            if name.startswith('"'):  # svn writes names raw (GNU diff C-quotes them)
                name = unquote_path(name)[0]
            bare = name[2:]
            absent = stamp.startswith(("1970-01-01", "1969-12-31"))
            label = "(nonexistent)" if absent else \
                "(revision 1)" if marker == "--- " else "(working copy)"
            if marker == "--- ":
                out.append(f"Index: {bare}\n" + "=" * 67 + "\n")
            out.append(f"{marker}{bare}\t{label}\n")
            continue
        out.append(line)
    return "".join(out)


def make_form_case(rng: random.Random, work: Path, form: str
                   ) -> tuple[Path, Path, Path, int, set[str]]:
    """(base tree, truth tree, patch, strip, operations) for one generated case."""
    repo = work / "repo"
    (repo / "python").mkdir(parents=True)
    (repo / "python" / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    names = rng.sample(NAMES, rng.randint(2, 4))
    for name in names:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(_body(rng, name))
        if name.endswith(".sh"):
            (repo / name).chmod(0o755)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = work / "base"
    shutil.copytree(repo, base, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    git_form = form.startswith("git")
    operations = ["edit", "create", "create-x", "delete"] + \
        (["rename", "copy", "chmod", "symlink"] if git_form else [])
    done: set[str] = set()
    touched: set[str] = set()  # a name is changed once per case, so ops stay what they say
    for _ in range(rng.randint(1, 3)):
        existing = [n for n in names if (repo / n).is_file() and not (repo / n).is_symlink()]
        free = [n for n in NAMES if not (repo / n).exists() and not (repo / n).is_symlink()
                and n not in touched]
        op = rng.choice(operations)
        if op in ("create", "create-x", "symlink") or not existing:
            if not free:
                continue
            name = rng.choice(free)
            touched.add(name)
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            if op == "symlink":
                (repo / name).symlink_to("mod.py")
            else:
                (repo / name).write_text(_body(rng, name))
                if op == "create-x" and git_form:
                    (repo / name).chmod(0o755)
            done.add(op if op in ("symlink", "create-x") else "create")
            continue
        name = rng.choice(existing)
        touched.add(name)
        lines = (repo / name).read_text().splitlines(keepends=True)
        if op == "edit":
            at = rng.randrange(1, len(lines))
            lines[at] = f"    changed_{rng.randint(0, 999)}(x)\n"
            if rng.random() < 0.5:
                lines.insert(rng.randrange(1, len(lines)), "    inserted(x)\n")
            (repo / name).write_text("".join(lines))
        elif op == "delete":
            (repo / name).unlink()
        elif op in ("rename", "copy") and free:
            target = rng.choice(free)
            touched.add(target)
            (repo / target).parent.mkdir(parents=True, exist_ok=True)
            (shutil.move if op == "rename" else shutil.copy2)(repo / name, repo / target)
        elif op == "chmod":
            (repo / name).chmod((repo / name).stat().st_mode ^ 0o111)
        done.add(op)
    _git(repo, "add", "-A")
    patch = work / "case.patch"
    strip = 1
    if git_form:
        args = ["diff", "--cached", "-M", "-C"] + (["-U0"] if form == "git-U0" else [])
        text = _git(repo, *args)
    else:
        pair = work / "pair"
        shutil.copytree(base, pair / "a", symlinks=True)
        truth_copy = pair / "b"
        shutil.copytree(repo, truth_copy, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        zone = {"diff-N-zone": "XST+5"}.get(form, "UTC0")
        made = subprocess.run(["diff", "-ruN", "a", "b"], cwd=pair, capture_output=True,
                              env={"TZ": zone, "LC_ALL": "C", "PATH": "/usr/bin:/bin"})
        text = made.stdout.decode("utf-8", "surrogateescape")
        if form == "diff-N-nozone":
            text = re.sub(r"(?m)^((?:---|\+\+\+) .*\t\S+ \S+) [+-]\d{4}$", r"\1", text)
        elif form == "diff-N-seconds":
            text = re.sub(r"(?m)^((?:---|\+\+\+) .*\t\S+ \d\d:\d\d:\d\d)\.\d+", r"\1", text)
        elif form == "svn":
            text, strip = _svn(text), 0
    patch.write_bytes(text.encode("utf-8", "surrogateescape"))
    truth = work / "truth"
    shutil.copytree(repo, truth, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    return base, truth, patch, strip, done


def _series(patch: Path, strip: int) -> Series:
    return Series(path=None, entries=(SeriesEntry(path=patch, sha256=None, strip=strip,
                                                  versions=SpecifierSet()),))


def _builder_tree(base: Path, patch: Path, strip: int, work: Path
                  ) -> tuple[dict[str, Entry] | None, str, list[str]]:
    """The builder's tree (``None`` when it refused), its file statuses, its warnings."""
    shutil.copytree(base, work, symlinks=True)
    before = tree_state(work)
    series = _series(patch, strip)
    try:
        result = apply_series(local_source(work, "1.0"), series, in_place=True)
    except BuilderError as exc:
        assert tree_state(work) == before, "a refusal must leave the tree untouched"
        statuses = {f.status for p in exc.report.patches for f in p.files} \
            if exc.report else {"error"}
        return None, ",".join(sorted(statuses)), []
    return tree_state(work), "applied", result.report.warnings


def _without_modes(state: dict[str, Entry] | None) -> dict[str, Entry] | None:
    return None if state is None else {k: (v[0], v[1], 0) for k, v in state.items()}


FORM_CASES = 16  # per form


@pytest.mark.parametrize("form", FORMS)
def test_every_form_agrees_with_both_oracles(tmp_path: Path, form: str) -> None:
    rng = random.Random(f"forms-{form}")
    applied = refused = 0
    seen_ops: set[str] = set()
    differences: set[tuple[str, str]] = set()
    followed: set[str] = set()
    for case in range(FORM_CASES):
        work = tmp_path / str(case)
        base, truth_dir, patch, strip, ops = make_form_case(rng, work, form)
        if not patch.read_bytes():
            continue
        git_form = form.startswith("git")
        modes = git_form  # diff and svn carry no modes
        truth = tree_state(truth_dir, modes=modes)
        gnu_tree = oracle_tree("gnu", base, patch, work / "gnu", strip=strip, modes=modes)
        git_tree = oracle_tree("git", base, patch, work / "git", strip=strip, modes=modes)
        ours_full, status, warnings = _builder_tree(base, patch, strip, work / "ours")
        ours = ours_full if modes else _without_modes(ours_full)
        where = f"{form} case {case} ({sorted(ops)}):\n{patch.read_text(errors='replace')}"
        if ours is None:
            refused += 1
            assert set(status.split(",")) & DELIBERATE_REFUSALS, f"refused ({status}) {where}"
            assert "symlink" in ops, where
            continue
        applied += 1
        seen_ops |= {"create" if op == "create-x" else op for op in ops}
        for oracle, tree in (("gnu", gnu_tree), ("git", git_tree)):
            if tree != ours:
                kind = "refused" if tree is None else "other tree"
                assert kind in DIFFERENCES.get((form, oracle), {}), \
                    f"{oracle} gave {kind}, not recorded in DIFFERENCES: {where}"
                misread = form == "svn" and "tab\tname" in patch.read_text()
                if kind == "other tree" and not misread:  # an emptied file, for a deletion
                    assert tree is not None and "delete" in ops, where
                    extra = {k: v for k, v in tree.items() if ours.get(k) != v}
                    assert set(ours) <= set(tree) and all(
                        k not in ours and v == ("file", b"", 0) for k, v in extra.items()), where
                differences.add((oracle, kind))
        # The refresh round trip: the refreshed patch gives the builder's tree, modes
        # included, with git apply, and with GNU patch wherever it read the original.
        (refreshed,) = refresh_series(local_source(base, "1.0"), _series(patch, strip),
                                      output_dir=work / "refreshed")
        assert refreshed.written is not None
        again = parse_patch(refreshed.written, strip)
        assert len(again.files) >= 1
        for oracle in ("git", "gnu"):
            tree = oracle_tree(oracle, base, refreshed.written, work / f"refreshed-{oracle}",
                               strip=strip)
            if tree is None and oracle == "gnu" and gnu_tree is None:
                continue
            assert tree == ours_full, f"refreshed, {oracle}: {where}\nrefreshed:\n" + \
                refreshed.written.read_text(errors="replace")
        if gnu_tree != git_tree:
            followed.add("gnu" if ours == gnu_tree else "git" if ours == git_tree
                         else "neither")
        assert ours == truth, f"the builder's tree is not the tree the patch was made from: {where}"
        if gnu_tree == git_tree and gnu_tree is not None and gnu_tree != ours:
            assert form == "svn", f"both oracles agree on another tree: {where}"
        if form == "git-U0" and "edit" in ops:
            assert warnings, f"a -U0 hunk placed without a warning: {where}"
    assert followed <= FOLLOWS.get(form, set()), followed
    assert applied >= FORM_CASES // 2, (applied, refused)
    if form == "git":
        assert refused, "the corpus made no symbolic link"
    expected = {"edit", "create", "delete"} | (
        {"rename", "copy", "chmod"} if form.startswith("git") else set())
    assert expected <= seen_ops, seen_ops


def test_generated_corpus_agrees_with_git_apply_and_refreshes(tmp_path: Path) -> None:
    """The hunk corpus again, with `git apply` as the second oracle (it places a hunk at
    the nearest exact match and never fuzzes) and the refresh round trip: the refreshed
    patch gives the builder's file with both oracles."""
    rng = random.Random(20261130)
    agreed = refreshed = 0
    for case in range(CASES // 2):
        _, patch_text, drifted = make_case(rng)
        if not patch_text:
            continue
        work = tmp_path / str(case)
        tree = work / "tree"
        (tree / "python").mkdir(parents=True)
        (tree / "python" / "pyproject.toml").write_text("[project]\n")
        (tree / "f.py").write_text("".join(drifted))
        patch = work / "case.diff"
        patch.write_text(patch_text)
        hunks = parse_patch(patch, 1).files[0].hunks
        ours = apply_file_hunks(split_lines("".join(drifted)), hunks)
        git_tree = oracle_tree("git", tree, patch, work / "git")
        exact = ours.new_lines is not None and all(r.fuzz == 0 for r in ours.results)
        if exact and git_tree is not None:
            assert git_tree["f.py"][1] == "".join(ours.new_lines or []).encode(), \
                f"case {case}: git apply gave another file\n{patch_text}"
            agreed += 1
        elif git_tree is not None:  # git applied where the builder refused or fuzzed
            assert ours.new_lines is None or any(r.fuzz for r in ours.results), case
            assert any(r.status in DELIBERATE | {HunkStatus.FAILED, HunkStatus.FUZZ}
                       for r in ours.results), (case, ours.results)
        if ours.new_lines is None:
            continue
        done = refresh_series(local_source(tree, "1.0"), _series(patch, 1), accept_fuzz=True,
                              output_dir=work / "refreshed")
        assert done[0].written is not None
        for oracle in ("gnu", "git"):
            again = oracle_tree(oracle, tree, done[0].written, work / f"again-{oracle}")
            assert again is not None and again["f.py"][1] == "".join(ours.new_lines).encode(), \
                f"case {case}: the refreshed patch gives another file with {oracle}"
        refreshed += 1
    assert agreed >= 50 and refreshed >= 80, (agreed, refreshed)
