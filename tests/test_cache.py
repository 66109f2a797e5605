"""The cache: one recipe for every entry (found and verified, or built with a manifest),
and a killed build's leftovers go, nobody else's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from builder.core.cache import MANIFEST, Cache, _pid_namespace, legacy_entry, sha256_file
from builder.core.errors import BuildError


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
    cache.artifact("kernels", "d" * 64, lambda tmp: (tmp / "file").write_text("x") and None)
    assert not dead.exists() and alive.exists() and other.exists()
    assert (kind / ("d" * 64) / "file").read_text() == "x"


class _Counting:
    """A build that writes ``a.whl`` and ``log.txt`` and counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, tmp: Path) -> dict[str, Any]:
        self.runs += 1
        (tmp / "a.whl").write_bytes(b"wheel %d" % self.runs)
        (tmp / "log.txt").write_text("log")
        return {"file": "a.whl", "run": self.runs}


def test_an_entry_is_built_once_with_one_manifest_then_found(tmp_path: Path) -> None:
    cache, build = Cache(tmp_path), _Counting()
    made = cache.artifact("wheel", "k" * 64, build, record="*.whl")
    assert not made.cached and build.runs == 1
    manifest = json.loads((made.path / MANIFEST).read_text())
    assert manifest["meta"] == {"file": "a.whl", "run": 1}
    assert manifest["files"] == [{"name": "a.whl", "size": 7,
                                  "sha256": sha256_file(made.path / "a.whl")}]
    found = cache.artifact("wheel", "k" * 64, build, record="*.whl")
    assert found.cached and build.runs == 1 and found.meta == made.meta
    copy = found.copy_to("a.whl", tmp_path / "dist")
    assert sha256_file(copy) == found.files["a.whl"].sha256


def test_a_failed_build_leaves_no_entry(tmp_path: Path) -> None:
    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise BuildError("compiler died", "")

    with pytest.raises(BuildError, match="compiler died"):
        Cache(tmp_path).artifact("wheel", "k" * 64, broken)
    assert list((tmp_path / "wheel").iterdir()) == []


def test_an_edited_entry_is_rebuilt_or_refused_as_the_stage_says(tmp_path: Path) -> None:
    cache, build = Cache(tmp_path), _Counting()
    entry = cache.artifact("wheel", "k" * 64, build, record="*.whl").path
    (entry / "a.whl").write_bytes(b"wheel 9")  # same size, other bytes
    again = cache.artifact("wheel", "k" * 64, build, record="*.whl")
    assert not again.cached and build.runs == 2 and again.meta["run"] == 2
    (entry / "log.txt").write_text("not recorded, not checked")
    assert cache.artifact("wheel", "k" * 64, build, record="*.whl").cached
    (entry / "a.whl").unlink()
    with pytest.raises(BuildError, match=r"was damaged \(a.whl changed\); it was removed"):
        cache.artifact("wheel", "k" * 64, build, record="*.whl", on_damage="refuse")
    assert not entry.exists() and build.runs == 2


def test_a_trusted_entry_is_not_hashed_on_read_but_can_be_checked(tmp_path: Path) -> None:
    cache, build = Cache(tmp_path), _Counting()
    entry = cache.artifact("wheelhouse", "k" * 64, build, on_damage="trust").path
    (entry / "a.whl").write_bytes(b"edited!")
    found = cache.artifact("wheelhouse", "k" * 64, build, on_damage="trust")
    assert found.cached and found.damaged() == ["a.whl"]


def test_stale_metadata_and_older_entries(tmp_path: Path) -> None:
    cache, build = Cache(tmp_path), _Counting()
    cache.artifact("source", "k" * 64, build)
    again = cache.artifact("source", "k" * 64, build, valid=lambda meta: meta["run"] > 1)
    assert not again.cached and build.runs == 2
    # an entry an older builder made: adopted when its own record vouches for it
    old = tmp_path / "wheel" / ("o" * 64)
    old.mkdir(parents=True)
    (old / "a.whl").write_bytes(b"old")
    (old / "wheel.json").write_text(json.dumps({"file": "a.whl",
                                                "sha256": sha256_file(old / "a.whl")}))
    adopt = legacy_entry("wheel.json", lambda meta: {meta["file"]: meta["sha256"]})
    found = cache.artifact("wheel", "o" * 64, build, record="*.whl", adopt=adopt)
    assert found.cached and found.meta["file"] == "a.whl" and (old / MANIFEST).is_file()
    # and made again when it does not
    older = tmp_path / "wheel" / ("p" * 64)
    older.mkdir()
    (older / "wheel.json").write_text(json.dumps({"file": "a.whl", "sha256": "0" * 64}))
    (older / "a.whl").write_bytes(b"edited")
    made = cache.artifact("wheel", "p" * 64, build, record="*.whl", adopt=adopt)
    assert not made.cached and made.meta["run"] == 3
