"""The cache's temporary entries: a killed build's leftovers go, nobody else's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from builder.core.cache import Cache, _pid_namespace


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_leftovers_of_dead_builds_in_this_namespace_only_are_removed(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    kind = tmp_path / "kernels"
    kind.mkdir()
    mine = os.readlink("/proc/self/ns/pid")
    assert _pid_namespace() in mine
    dead = kind / f".aaaa.{_dead_pid()}.{_pid_namespace()}.x1.tmp"
    alive = kind / f".bbbb.{os.getpid()}.{_pid_namespace()}.x2.tmp"
    other = kind / f".cccc.{_dead_pid()}.1.x3.tmp"  # a container's PID namespace
    for folder in (dead, alive, other):
        folder.mkdir()
    with cache.building("kernels", "d" * 64) as tmp:
        (tmp / "file").write_text("x")
    assert not dead.exists() and alive.exists() and other.exists()
    assert (kind / ("d" * 64) / "file").read_text() == "x"
