"""The kernel stage's fixed build root and its lock, in a world-writable folder (issue 38,
class D): nothing there is followed, emptied or trusted; what is not this user's own is
refused with exit 3 and a hint naming it. The root is moved into a sticky, world-writable
folder of the test (as ``/tmp`` is), so the machine's real root is never touched."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from builder.core.errors import BuilderError, BuildError, MissingToolError
from builder.core.progress import Reporter
from builder.kernels import build as kernel_build
from builder.kernels import reproducible
from tests.helpers.services import need_root


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fixed root, in a folder with /tmp's mode (1777)."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    folder = shared / "sglang-sm120-build"
    monkeypatch.setattr(reproducible, "FIXED_ROOT", str(folder))
    return folder


def _build(tmp_path: Path) -> Any:
    """The two things the workspace reads of a build: its reporter and a build environment
    (here one without FlashInfer, so the build stops right after the root is claimed)."""
    site = tmp_path / "site-packages"
    site.mkdir(exist_ok=True)
    return SimpleNamespace(reporter=Reporter(quiet=True),
                           env=SimpleNamespace(site_packages=site))


def _enter(tmp_path: Path) -> BuilderError:
    with pytest.raises(BuilderError) as stopped, kernel_build._workspace(_build(tmp_path)):
        pass
    return stopped.value


def _lock_names(root: Path) -> list[Path]:
    """Every name the lock beside the root had or has (0.1's machine-wide one, the
    per-user one)."""
    return [root.with_name(root.name + ".lock"),
            root.with_name(f"{root.name}-{os.geteuid()}.lock")]


def test_a_link_planted_as_the_lock_is_never_followed(root: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("export PATH=...  # my secrets\n")
    for name in _lock_names(root):
        name.symlink_to(victim)
    error = _enter(tmp_path)
    assert victim.read_text() == "export PATH=...  # my secrets\n"
    assert isinstance(error, MissingToolError) and error.exit_status == 3, error
    assert "is a symbolic link" in error.cause and str(_lock_names(root)[1]) in error.hint


@pytest.mark.parametrize("kind", ["link", "file"])
def test_a_root_that_is_a_link_or_a_file_is_refused_naming_it(root: Path, tmp_path: Path,
                                                               kind: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("kept")
    if kind == "link":
        root.symlink_to(elsewhere)
    else:
        root.write_text("kept")
    error = _enter(tmp_path)
    assert isinstance(error, MissingToolError) and error.exit_status == 3, error
    assert str(root) in error.cause and str(root) in error.hint
    assert (elsewhere / "keep").read_text() == "kept"
    assert root.is_symlink() if kind == "link" else root.read_text() == "kept"


def test_a_root_of_another_user_is_refused_and_left_alone(root: Path, tmp_path: Path) -> None:
    need_root("giving the root to another user")
    root.mkdir()
    (root / "theirs").write_text("a build of theirs")
    os.chown(root, 65534, 65534)
    error = _enter(tmp_path)
    assert isinstance(error, MissingToolError) and error.exit_status == 3, error
    assert "belongs to another user (uid 65534)" in error.cause
    assert str(root) in error.hint and "--dist" not in error.hint
    assert (root / "theirs").read_text() == "a build of theirs"


def test_a_lock_of_another_user_is_refused(root: Path, tmp_path: Path) -> None:
    need_root("giving the lock to another user")
    lock = _lock_names(root)[1]
    lock.write_text("")
    os.chown(lock, 65534, 65534)
    error = _enter(tmp_path)
    assert isinstance(error, MissingToolError) and "belongs to another user" in error.cause
    assert str(lock) in error.hint


def test_the_root_is_owner_only_and_a_left_one_of_this_user_is_replaced(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root.mkdir(mode=0o755)
    (root / "left").write_text("from a killed build")
    seen: list[int] = []

    def stage(site: Path, destination: Path) -> list[Path]:  # what the root is at staging
        seen.append(root.lstat().st_mode & 0o777)
        assert not (root / "left").exists()
        raise BuildError("stop here", "")

    monkeypatch.setattr(reproducible, "stage", stage)
    assert _enter(tmp_path).cause == "stop here"
    assert seen == [0o700] and not root.exists()
    lock = _lock_names(root)[1].lstat()
    assert (lock.st_mode & 0o777, lock.st_uid) == (0o600, os.geteuid())
    assert not _lock_names(root)[0].exists()  # 0.1's machine-wide lock is gone
