"""Rewriting the user's files keeps every other byte and the file's identity.

``label --bump`` (targets.toml) and ``pin-images`` (images/pins.toml) on real files: a
CRLF file stays CRLF, its permission bits stay, a symbolic link stays a link with its
target edited, a file with two hard links is refused with both names unchanged.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.project import write_project
from tests.helpers.registry import Hostile


def _project(tmp_path: Path) -> tuple[Path, Path]:
    root = write_project(tmp_path / "p")
    targets = root / "targets.toml"
    targets.write_bytes(targets.read_bytes().replace(b"\n", b"\r\n"))
    targets.chmod(0o640)
    return root, targets


def _bump(root: Path, path: Path, cache: Path):
    return run_cli("next-label", "--target", "t", "--targets-file", str(path),
                   cwd=root, cache=cache)


def test_a_symlinked_targets_file_is_edited_through_its_link(tmp_path: Path) -> None:
    root, targets = _project(tmp_path)
    real = root / "real-targets.toml"
    targets.rename(real)
    targets.symlink_to(real.name)
    before = real.read_bytes()
    done = _bump(root, targets, tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    assert targets.is_symlink() and os.readlink(targets) == real.name
    after = real.read_bytes()
    assert after != before and after.count(b"\r\n") == before.count(b"\r\n")
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    changed = [(a, b) for a, b in zip(before.split(b"\r\n"), after.split(b"\r\n"),
                                      strict=True) if a != b]
    assert len(changed) == 1 and b"local_label" in changed[0][1]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_hardlinked_targets_file_is_refused_and_both_names_kept(tmp_path: Path) -> None:
    root, targets = _project(tmp_path)
    other = tmp_path / "other-name.toml"
    os.link(targets, other)
    before = targets.read_bytes()
    done = _bump(root, targets, tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "has 2 hard links" in " ".join(done.stderr.split())
    assert targets.read_bytes() == other.read_bytes() == before
    assert targets.stat().st_ino == other.stat().st_ino


@pytest.mark.parametrize("linked", [False, True])
def test_pin_images_keeps_line_endings_mode_and_link(
        tmp_path: Path, hostile: tuple[Hostile, str], linked: bool) -> None:
    _, name = hostile
    real = tmp_path / "real-pins.toml"
    real.write_bytes(f'# mine\r\n[[kernel_base]]\r\ncuda_lane = "13.0"\r\nname = "{name}"'
                     '\r\ndigest = ""\r\n'.encode())
    real.chmod(0o600)
    pins = tmp_path / "pins.toml" if linked else real
    if linked:
        pins.symlink_to(real.name)
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "config.json").write_text("{}")
    done = run_cli("pin-images", "--pins-file", str(pins),
                   env={"DOCKER_CONFIG": str(tmp_path / "docker")})
    assert done.returncode == 0, done.stdout + done.stderr
    data = real.read_bytes()
    assert b'digest = "sha256:' in data and b"\n" not in data.replace(b"\r\n", b"")
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    assert pins.is_symlink() == linked
