"""The two oracles the patch engine is compared with: GNU patch 2.7 and ``git apply``.

Never part of the build path. Each is run on a copy of a tree, as a user runs it, and the
resulting tree is read back whole (files with their bytes and executable bit, links with
their target) so that trees can be compared with the builder's.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

Entry = tuple[str, bytes | str, int]


def tree_state(root: Path, *, modes: bool = True) -> dict[str, Entry]:
    """Every file and link under ``root`` (``.git`` left out): ``("file", bytes, x)``
    where ``x`` is the owner's executable bit (git records no finer mode), or
    ``("link", target, 0)``. Folders are not entries: git does not track them."""
    out: dict[str, Entry] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] == ".git":
            continue
        if path.is_symlink():
            out[rel.as_posix()] = ("link", os.readlink(path), 0)
        elif path.is_file():
            x = path.stat().st_mode & stat.S_IXUSR if modes else 0
            out[rel.as_posix()] = ("file", path.read_bytes(), x)
    return out


def _need(tool: str, package: str) -> None:
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is a test oracle and must be installed (apt-get install {package})")


def oracle_tree(tool: str, tree: Path, patch: Path, work: Path, *, strip: int = 1,
                modes: bool = True) -> dict[str, Entry] | None:
    """Apply ``patch`` to a copy of ``tree`` in ``work`` with ``tool``.

    Args:
        tool: ``gnu`` (GNU patch: ``patch -pN --batch --forward`` with its default fuzz,
            no backups) or ``git`` (``git apply -pN`` outside any repository).
        tree: the tree (left untouched).
        patch: the patch file.
        work: a new folder for the copy.
        strip: the strip level.
        modes: compare executable bits too.

    Returns:
        The resulting tree (see :func:`tree_state`), or ``None`` when the tool refused or
        failed (its exit status was not 0).
    """
    shutil.copytree(tree, work, symlinks=True)
    env = {"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "GIT_CEILING_DIRECTORIES": str(work.parent), "HOME": str(work.parent),
           "GIT_CONFIG_NOSYSTEM": "1"}
    if tool == "gnu":
        _need("patch", "patch")
        command = ["patch", f"-p{strip}", "--batch", "--forward", "--no-backup-if-mismatch",
                   "-r", "-", "-i", str(patch)]
    else:
        _need("git", "git")
        command = ["git", "apply", f"-p{strip}", str(patch)]
    done = subprocess.run(command, cwd=work, capture_output=True, env=env, timeout=60)
    if done.returncode != 0:
        return None
    return tree_state(work, modes=modes)
