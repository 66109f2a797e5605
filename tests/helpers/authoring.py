"""The authoring tests' case: a copy of the refresh case with a patch to add, a snapshot of
a tree (to show nothing was written) and the refusal check (exit 2, the message's parts)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.helpers.paths import TESTS

CASE = TESTS / "cases" / "refresh-new-file-mode"
PATCH = """\
--- a/python/sglang/base.py
+++ b/python/sglang/base.py
@@ -1,3 +1,3 @@
 A = 1
-B = 2
+B = 20
 C = 3
"""
SHIFTED = "my message\n\n" + PATCH.replace("@@ -1,3 +1,3 @@", "@@ -2,3 +2,3 @@")


def snapshot(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every entry under ``root``: files with their bytes, links with their target."""
    out: dict[str, tuple[str, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_file():
            out[rel] = ("file", path.read_bytes())
        elif stat.S_ISFIFO(path.lstat().st_mode):
            out[rel] = ("fifo", b"")
        else:
            out[rel] = ("dir", b"")
    return out


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A copy of the refresh case (project in ``refresh/``, upstream tree in ``tree/``)
    and a patch to add, ``mine.patch``, beside them."""
    root = tmp_path / "w"
    shutil.copytree(CASE, root, symlinks=True)
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    (root / "mine.patch").write_text(PATCH)
    return root


def refused(done: object, *parts: str) -> None:
    """Exit 2 with every one of ``parts`` in the message."""
    assert done.returncode == 2, (done.stdout, done.stderr)  # type: ignore[attr-defined]
    text = " ".join(done.stderr.split())  # type: ignore[attr-defined]
    for part in parts:
        assert part in text, text
