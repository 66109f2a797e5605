"""Fuzz test of the patch engine (hypothesis): random patch texts on random trees.

Whatever the text, the builder never raises anything but a ``BuilderError``, never writes
outside the tree (a folder beside it, reachable through links in the tree, is watched),
and when it refuses the tree is byte-identical to before. The texts are built from the
pieces real patches are made of (git, diff -N and svn headers, quoted names, links,
``..``, absolute paths, modes, renames, copies, binary markers, hunks with right and
wrong counts) plus raw noise.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet

from builder import BuilderError
from builder.patching.apply import apply_series
from builder.patching.refresh import refresh_series
from builder.patching.series import Series, SeriesEntry
from builder.source.fetch import local_source

pytestmark = pytest.mark.slow(reason="hypothesis: hundreds of random patches")

FILES = ["python/sglang/a.py", "python/sglang/naïve.py", "python/sglang/sp ace.py",
         "python/x.py", "python/sglang/sub/b.py"]
PATHS = [*FILES, *FILES, *FILES, "python/out/victim.py", "python/lf", "python/inlink/a.py",
         "../escape.py", "/etc/passwd", "python/../../escape.py", "python/sglang/new.py",
         "python/pyproject.toml/x.py", "python/sglang", "python/sglang/tab\tx.py",
         "python/sglang/q\"x.py", ".git/config", "python/new dir/n.py"]
LINES = ["a\n", "b\n", "c\n", "a\n", "b\n", "c\n", "\n", "victim\n", "a\r\n", "é\n"]
STAMPS = ["", "", "", "", "", "", "\t1970-01-01 00:00:00.000000000 +0000",
          "\t2026-01-01 10:00:00 +0100", "\t(nonexistent)", "\t(working copy)",
          "\t1969-12-31 19:00:00 -0500", "\t1970-01-01 00:00:00"]
EXTENDED = ["new file mode 100644", "new file mode 100755", "new file mode 120000",
            "deleted file mode 100644", "deleted file mode 120000", "old mode 100644",
            "new mode 100755", "similarity index 90%", "index 0000000..1111111 100644",
            "GIT binary patch", "literal 0", "Binary files a/x and b/x differ"]


def _quote(name: str, how: int) -> str:
    if how == 0:
        return name
    if how == 1:  # C-quoted as git does
        out = "".join(f"\\{b:03o}" if b >= 0x80 or b < 0x20 else
                      ("\\" + chr(b) if chr(b) in '"\\' else chr(b))
                      for b in name.encode())
        return f'"{out}"'
    return '"' + name + ("\\q" if how == 2 else "")  # broken quoting


names = st.builds(lambda p, prefix, how: _quote(prefix + p, how), st.sampled_from(PATHS),
                  st.sampled_from(["a/"] * 6 + ["", "a//", "x/y/"]),
                  st.sampled_from([0] * 6 + [1] * 3 + [2]))


@st.composite
def hunk(draw: st.DrawFn) -> str:
    kinds = [" "] * 8 + ["-"] * 6 + ["+"] * 6 + ["\\", "?"]
    body = draw(st.lists(st.tuples(st.sampled_from(kinds), st.sampled_from(LINES)),
                         max_size=8))
    old = sum(1 for k, _ in body if k in " -")
    new = sum(1 for k, _ in body if k in " +")
    if draw(st.integers(0, 5)) == 0:  # sometimes lie about the counts
        old, new = draw(st.integers(0, 9)), draw(st.integers(0, 9))
    start = draw(st.integers(0, 4))
    text = "".join("\\ No newline at end of file\n" if k == "\\" else k + line
                   for k, line in body)
    return f"@@ -{start},{old} +{draw(st.integers(0, 12))},{new} @@\n" + text


@st.composite
def file_section(draw: st.DrawFn) -> str:
    old, new = draw(names), draw(names)
    parts = []
    if draw(st.booleans()):
        parts.append(f"diff --git {old} {new}\n")
        for line in draw(st.lists(st.sampled_from(EXTENDED), max_size=3)):
            parts.append(line + "\n")
        for verb in draw(st.lists(st.sampled_from(["rename", "copy"]), max_size=1)):
            parts.append(f"{verb} from {draw(names)}\n{verb} to {draw(names)}\n")
    elif draw(st.booleans()):
        parts.append(f"Index: {old}\n" + "=" * 67 + "\n")
    if draw(st.integers(0, 9)):
        minus = "/dev/null" if draw(st.integers(0, 7)) == 0 else old
        plus = "/dev/null" if draw(st.integers(0, 7)) == 0 else new
        parts.append(f"--- {minus}{draw(st.sampled_from(STAMPS))}\n")
        parts.append(f"+++ {plus}{draw(st.sampled_from(STAMPS))}\n")
        parts.extend(draw(st.lists(hunk(), min_size=1, max_size=3)))
    return "".join(parts)


LINKED = ["python/out/victim.py", "python/out/new.py", "python/out/sub/new.py", "python/lf",
          "python/inlink/a.py", "python/inlink/new.py", "python/dangling"]


@st.composite
def attack(draw: st.DrawFn) -> str:
    """A well-formed patch aimed through the tree's links (they lead outside, to a file
    outside, into the tree, and nowhere)."""
    path = draw(st.sampled_from(LINKED))
    source = draw(st.sampled_from([*FILES, path]))
    op = draw(st.sampled_from(["edit", "create", "delete", "rename", "copy", "mode"]))
    git = f"diff --git a/{source} b/{path}\n"
    if op == "edit":
        return f"--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-victim\n+PWNED\n"
    if op == "create":
        return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+PWNED\n"
    if op == "delete":
        return f"--- a/{path}\n+++ /dev/null\n@@ -1 +0,0 @@\n-victim\n"
    if op == "mode":
        return f"diff --git a/{path} b/{path}\nold mode 100644\nnew mode 100755\n"
    verb = "rename" if op == "rename" else "copy"
    return git + f"similarity index 100%\n{verb} from {source}\n{verb} to {path}\n"


patch_texts = st.one_of(
    st.lists(attack(), min_size=1, max_size=2).map("".join),
    st.lists(attack(), min_size=1, max_size=2).map("".join),
    st.lists(file_section(), min_size=1, max_size=4).map("".join),
    st.lists(file_section(), min_size=1, max_size=2).map("".join),
    st.lists(file_section(), min_size=1, max_size=2).map("".join),
    st.builds(lambda a, b: a + b, st.sampled_from(["From x\nSubject: y\n\n---\n", ""]),
              st.lists(file_section(), min_size=1, max_size=3).map("".join)),
    st.text(alphabet=st.sampled_from(list("-+@ \n\tab/\"\\0123456789,diffgt")), max_size=300),
)
trees = st.dictionaries(st.sampled_from(FILES),
                        st.lists(st.sampled_from(LINES), max_size=12).map("".join),
                        max_size=len(FILES))


def _state(root: Path) -> dict[str, tuple[str, bytes | str, int]]:
    out: dict[str, tuple[str, bytes | str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path), 0)
            elif path.is_file():
                out[rel] = ("file", path.read_bytes(), path.stat().st_mode & 0o777)
            else:
                out[rel] = ("dir", b"", path.stat().st_mode & 0o777)
    return out


@settings(max_examples=600, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(text=patch_texts, files=trees, strip=st.sampled_from([1, 1, 1, 0, 2]))
def test_random_patches_never_escape_or_half_write(text: str, files: dict[str, str],
                                                   strip: int) -> None:
    with tempfile.TemporaryDirectory() as temp:
        top = Path(temp)
        outside = top / "outside"
        outside.mkdir()
        (outside / "victim.py").write_text("victim\n")
        (outside / "a.py").write_text("a\n")
        tree = top / "tree"
        (tree / "python").mkdir(parents=True)
        (tree / "python" / "pyproject.toml").write_text("[project]\nname = 'x'\n")
        for name, content in files.items():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_text(content)
        (tree / "python" / "out").symlink_to(outside)
        (tree / "python" / "lf").symlink_to(outside / "victim.py")
        (tree / "python" / "inlink").symlink_to("sglang")
        (tree / "python" / "dangling").symlink_to(outside / "nowhere.py")
        patch = top / "fuzz.patch"
        patch.write_bytes(text.encode("utf-8", "surrogateescape"))
        series = Series(path=None, entries=(SeriesEntry(path=patch, sha256=None, strip=strip,
                                                        versions=SpecifierSet()),))
        before_tree, before_top = _state(tree), _state(top)
        try:
            result = apply_series(local_source(tree, "1.0"), series, in_place=True)
            event("applied: " + ",".join(sorted({f.status for p in result.report.patches
                                                 for f in p.files})))
        except BuilderError as exc:
            event("refused" + (": " + ",".join(sorted({f.status for p in exc.report.patches
                                                       for f in p.files}))
                               if exc.report else " before any file: " +
                               exc.cause.split(": ")[-1][:30]))
            assert _state(tree) == before_tree, "a refusal must leave the tree untouched"
        after = _state(top)
        changed = {k for k in set(before_top) | set(after) if before_top.get(k) != after.get(k)}
        assert all(k.startswith("tree/") for k in changed), changed
        assert _state(outside) == {k.removeprefix("outside/"): v for k, v in
                                   before_top.items() if k.startswith("outside/")}
        # A refresh of whatever applied never raises anything else either.
        with contextlib.suppress(BuilderError):
            refresh_series(local_source(tree, "1.0"), series, dry_run=True)
