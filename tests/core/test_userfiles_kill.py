"""A ``kill -9`` at any moment of a rewrite of the user's files leaves each file whole.

Each command that rewrites a user's file runs in a real process (``python -m builder``
under tests/helpers/stop_at_write.py) once to the end, which lists every moment of its writes into
the user's folders (a write, a rename, just after a rename) and gives the new content; then
once per moment, stopped there and sent a real ``SIGKILL``. After each kill every file the
command writes is, byte for byte, its old content or its new one, and is read by the
builder's own loader; a temporary left beside it has the rewrite's name
(``.NAME.XXXXXXXX.sglang-sm120-tmp``) and the next rewrite of that file removes it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from builder.core.basepins import load_base_pins
from builder.core.config import load_targets
from builder.core.lock import VersionLock
from builder.core.userfiles import SUFFIX
from builder.patching.patchfile import parse_patch
from builder.patching.series import load_series
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO, TESTS
from tests.helpers.project import write_project
from tests.helpers.registry import Hostile

STOPPER = TESTS / "helpers" / "stop_at_write.py"
LEFTOVER = re.compile(r"\.(.+)\.[a-z0-9_]{8}" + re.escape(SUFFIX))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _run(root: Path, args: list[str], watched: list[Path], stop: int, log: Path,
         env: dict[str, str]) -> tuple[str, int]:
    """Run the command under the stopper; return ("stopped", -9) after the kill or
    ("exited", status)."""
    child = subprocess.Popen(
        [sys.executable, str(STOPPER), str(log), str(stop),
         os.pathsep.join(str(root / w) for w in watched), "--", *args],
        cwd=root, env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _, status = os.waitpid(child.pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
        return "stopped", -9
    child.returncode = os.waitstatus_to_exitcode(status)
    output = child.stdout.read().decode() if child.stdout else ""
    if child.returncode != 0:
        print(output)
    return "exited", child.returncode


def kill_everywhere(base: Path, args: list[str], files: dict[str, Callable[[Path], object]],
                    tmp_path: Path, env: dict[str, str] | None = None) -> list[dict]:
    """Kill ``args`` (run in a copy of ``base``) at each moment of its writes.

    Args:
        base: the project as the user has it.
        args: the builder command line.
        files: each file the command writes (relative to the project) and its loader.
        tmp_path: where the copies go.
        env: added to the environment.

    Returns:
        The moments (kind, path), each killed at once.
    """
    env = env or {}
    watched = sorted({str(Path(name).parent) for name in files})
    done, log = tmp_path / "to-the-end", tmp_path / "to-the-end.log"
    shutil.copytree(base, done, symlinks=True)
    assert _run(done, args, [Path(w) for w in watched], -1, log, env) == ("exited", 0)
    moments = [json.loads(line) for line in log.read_text().splitlines()]
    old, new = _snapshot(base), _snapshot(done)
    changed = [name for name in files if old.get(name) != new.get(name)]
    assert changed, "the command changed none of the files"
    assert {m["kind"] for m in moments} >= {"write", "rename", "renamed"}, moments
    for number, moment in enumerate(moments):
        copy = tmp_path / f"kill-{number}"
        shutil.copytree(base, copy, symlinks=True)
        outcome = _run(copy, args, [Path(w) for w in watched], number,
                       tmp_path / f"kill-{number}.log", env)
        assert outcome == ("stopped", -9), (number, moment, outcome)
        after = _snapshot(copy)
        for name, load in files.items():
            assert after.get(name) in (old.get(name), new.get(name)), (number, moment, name)
            if name in after:
                load(copy / name)  # the builder reads it
        for name in set(after) - set(old) - set(files):  # only the rewrite's temporaries
            found = LEFTOVER.fullmatch(Path(name).name)
            assert found and str(Path(name).parent / found.group(1)) in files, (number, name)
    return moments


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if LEFTOVER.fullmatch(p.name)]


def test_next_label_killed_anywhere(tmp_path: Path) -> None:
    base = write_project(tmp_path / "base")
    targets = base / "targets.toml"
    targets.write_bytes(targets.read_bytes().replace(b"\n", b"\r\n"))
    moments = kill_everywhere(base, ["next-label", "--target", "t"],
                              {"targets.toml": load_targets}, tmp_path)
    # killed after the temporary's creation, before its rename: the next rewrite removes it
    copy = tmp_path / f"kill-{[m['kind'] for m in moments].index('rename')}"
    assert [p.name.startswith(".targets.toml.") for p in _leftovers(copy)] == [True]
    done = run_cli("next-label", "--target", "t", cwd=copy, cache=tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _leftovers(copy) == []
    assert load_targets(copy / "targets.toml").get("t").local_label == "sm120.8"


def test_lock_record_killed_anywhere(tmp_path: Path) -> None:
    base = write_project(tmp_path / "base")
    kill_everywhere(base, ["lock"],
                    {"versions.lock": lambda p: VersionLock(p).entries}, tmp_path)


@pytest.mark.slow(reason="runs the command once per write it makes: tens of runs")
def test_refresh_killed_anywhere(sdists: dict[str, Path], tmp_path: Path) -> None:
    base = write_project(tmp_path / "base", sdist=sdists["0.5.10.post1"],
                         version="0.5.10.post1")
    patches = {f"patches/{e.name}": lambda p: parse_patch(p, 1)
               for e in load_series(base / "patches" / "series.toml").entries}
    kill_everywhere(base, ["refresh", "--accept-fuzz"],
                    {**patches, "patches/series.toml": load_series}, tmp_path,
                    env={"SGLANG_SM120_CACHE": str(tmp_path / "cache")})


def test_pin_images_killed_anywhere(tmp_path: Path, hostile: tuple[Hostile, str]
                                    ) -> None:
    _, name = hostile
    base = tmp_path / "base"
    (base / "images").mkdir(parents=True)
    (base / "images" / "pins.toml").write_bytes(
        f'# mine\r\n[[kernel_base]]\r\ncuda_lane = "13.0"\r\nname = "{name}"\r\n'
        'digest = ""\r\n'.encode())
    (base / "docker").mkdir()
    (base / "docker" / "config.json").write_text("{}")
    kill_everywhere(base, ["pin-images", "--pins-file", "images/pins.toml"],
                    {"images/pins.toml": load_base_pins}, tmp_path,
                    env={"DOCKER_CONFIG": str(base / "docker")})


@pytest.mark.slow(reason="runs the command once per write it makes: tens of runs")
def test_add_target_killed_anywhere(index: str, project: Path,
                                    tmp_path: Path) -> None:
    files: dict[str, Callable[[Path], object]] = {
        "targets.toml": load_targets, "images/pins.toml": load_base_pins,
        "images/profiles/sglang-0.5.16.toml": lambda p: tomllib.loads(p.read_text())}
    kill_everywhere(project, ["add-target", "0.5.16", "--index-url", index], files, tmp_path,
                    env={"SGLANG_SM120_CACHE": str(tmp_path / "cache")})


def test_add_patch_killed_anywhere(tmp_path: Path) -> None:
    base = write_project(tmp_path / "base")
    (base / "mine.patch").write_text("--- a/python/sglang/x.py\n+++ b/python/sglang/x.py\n"
                                     "@@ -1 +1 @@\n-a = 1\n+a = 2\n")
    kill_everywhere(base, ["add-patch", "mine.patch", "--versions", ">=0.5.9",
                           "--description", "mine", "--series", "patches/series.toml"],
                    {"patches/mine.patch": lambda p: parse_patch(p, 1),
                     "patches/series.toml": load_series}, tmp_path)
