"""The cache: one recipe for every entry (found and verified, or built with a manifest),
and a killed build's leftovers go, nobody else's."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builder.core.cache import (
    CACHEDIR_SIGNATURE,
    CACHEDIR_TAG,
    MANIFEST,
    MAX_AGE_DAYS,
    Cache,
    _pid_namespace,
    legacy_entry,
    prune_cache,
    sha256_file,
)
from builder.core.errors import BuildError, ConfigurationError
from tests.helpers.cli import run_cli


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


# ---------------------------------------------------------------- removal trusts nothing


def _made(root: Path, kind: str, key: str) -> Path:
    """A real entry, made the way every stage makes one (this writes the root's tag)."""
    return Cache(root).artifact(kind, key, lambda tmp: (tmp / "f").write_text(key) and None).path


def _clean(cache: Path) -> tuple[int, dict[str, Any]]:
    done = run_cli("cache", "clean", "--json", "--cache-dir", str(cache))
    return done.returncode, json.loads(done.stdout)


def test_a_cache_marks_itself_and_removal_refuses_a_folder_it_did_not_mark(
        tmp_path: Path) -> None:
    # Cache(...) is used in a child: this process's shared hold would block the prune.
    subprocess.run(["python", "-c", "import sys; from pathlib import Path; "
                    "from builder.core.cache import Cache; "
                    "Cache(Path(sys.argv[1])).lookup('wheel', 'x')", str(tmp_path / "c")],
                   check=True, env={**os.environ})
    tag = (tmp_path / "c" / CACHEDIR_TAG).read_bytes()
    assert tag.splitlines()[0] == CACHEDIR_SIGNATURE  # https://bford.info/cachedir/
    # $HOME typed where the cache was meant: second-level folders of known kind names
    home = tmp_path / "home"
    for folder in ("wheel/thesis", "source/taxes", "projects/x"):
        (home / folder).mkdir(parents=True)
        (home / folder / "keep.txt").write_text("mine")
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    code, data = _clean(home)
    assert code == 2 and CACHEDIR_TAG in data["error"] and str(home) in data["error"]
    assert "printf" in data["hint"]
    with pytest.raises(ConfigurationError, match="not a builder cache"):
        prune_cache(home, older_than_days=None)
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before
    # a tag that is a link (to a real tag elsewhere) marks nothing
    (home / CACHEDIR_TAG).symlink_to(tmp_path / "c" / CACHEDIR_TAG)
    assert _clean(home)[0] == 2 and (home / "wheel" / "thesis" / "keep.txt").exists()


def test_removal_follows_no_link_and_leaves_other_kinds_alone(tmp_path: Path) -> None:
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    subprocess.run(["python", "-c", "import sys; from pathlib import Path; "
                    "from builder.core.cache import Cache; c = Cache(Path(sys.argv[1])); "
                    "c.artifact('wheel', 'a' * 8, lambda t: (t / 'f').write_text('x') and None)",
                    str(cache)], check=True)
    for folder in ("victim", "kind/victim2"):
        (outside / folder).mkdir(parents=True)
        (outside / folder / "keep.txt").write_text("mine")
    (cache / "source").symlink_to(outside / "kind")       # a linked kind folder
    (cache / "wheel" / ("b" * 8)).symlink_to(outside / "victim")  # a linked entry
    (cache / "behaviour-models" / "m").mkdir(parents=True)  # not an entry kind
    code, data = _clean(cache)
    assert code == 0, data
    assert [e["key"] for e in data["removed"]] == ["a" * 8]
    assert sorted(s["path"] for s in data["skipped"]) == \
        [str(cache / "source"), str(cache / "wheel" / ("b" * 8))]
    assert (outside / "victim" / "keep.txt").exists()
    assert (outside / "kind" / "victim2" / "keep.txt").exists()
    assert (cache / "behaviour-models" / "m").is_dir()
    assert (cache / "wheel" / ("b" * 8)).is_symlink()


def test_prune_and_clean_can_take_one_kind_alone(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    subprocess.run(["python", "-c", "import sys; from pathlib import Path; "
                    "from builder.core.cache import Cache; c = Cache(Path(sys.argv[1])); "
                    "[c.artifact(k, 'a' * 8, lambda t: (t / 'f').write_text('x') and None) "
                    "for k in ('behaviour-env', 'behaviour-tilelang', 'wheel')]",
                    str(cache)], check=True)
    done = run_cli("cache", "prune", "--older-than", "0", "behaviour-env", "--json",
                   "--cache-dir", str(cache))
    assert done.returncode == 0, done.stdout
    assert [e["kind"] for e in json.loads(done.stdout)["removed"]] == ["behaviour-env"]
    done = run_cli("cache", "clean", "behaviour-tilelang", "wheel", "--json", "--cache-dir",
                   str(cache))
    assert sorted(e["kind"] for e in json.loads(done.stdout)["removed"]) == \
        ["behaviour-tilelang", "wheel"]
    done = run_cli("cache", "clean", "behaviour-envs", "--cache-dir", str(cache))
    assert done.returncode == 2 and "'behaviour-envs' is not a cache kind" in done.stderr


def test_a_delete_that_fails_is_reported_and_never_counted(tmp_path: Path) -> None:
    """A real failure even as root: an immutable file (``chattr +i``) cannot be unlinked."""
    cache = tmp_path / "cache"
    subprocess.run(["python", "-c", "import sys; from pathlib import Path; "
                    "from builder.core.cache import Cache; c = Cache(Path(sys.argv[1])); "
                    "[c.artifact('wheel', k * 8, lambda t: (t / 'f').write_text('x') and None)"
                    " for k in 'ab']", str(cache)], check=True)
    stuck = cache / "wheel" / ("a" * 8) / "f"
    # e2fsprogs' chattr on an ext4 or xfs folder; a test machine without it fails, never skips
    assert shutil.which("chattr"), "install e2fsprogs (chattr)"
    marked = subprocess.run(["chattr", "+i", str(stuck)], capture_output=True, text=True)
    assert marked.returncode == 0, f"chattr +i failed here: {marked.stderr}"
    try:
        code, data = _clean(cache)
        assert code == BuildError.exit_status, data
        assert "could not remove" in data["error"] and "removed 1 entry" in data["error"]
        # the entry is gone from its name (never trusted), its stuck file is reported
        assert not (cache / "wheel" / ("a" * 8)).exists()
        assert f"{'a' * 8}" in data["error"] and "/f (" in data["error"]
        assert not (cache / "wheel" / ("b" * 8)).exists()
    finally:
        for left in cache.rglob("f"):
            subprocess.run(["chattr", "-i", str(left)], check=False)


_SOME_DAYS = st.one_of(st.floats(), st.sampled_from(["nan", "-nan", "inf", "-inf", "1e308",
                                                      "-0", "36500", "36500.01", "1e-300"]))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(days=_SOME_DAYS)
def test_older_than_is_a_bounded_number_of_days_or_one_refusal(
        tmp_path: Path, days: float | str) -> None:
    cache = tmp_path / "cache"
    if not cache.exists():
        subprocess.run(["python", "-c", "import sys; from pathlib import Path; "
                        "from builder.core.cache import Cache; Cache(Path(sys.argv[1]))"
                        ".lookup('wheel', 'x')", str(cache)], check=True)
    old = cache / "wheel" / "old"
    old.mkdir(parents=True, exist_ok=True)
    stamp = time.time() - 400 * 365 * 86400  # older than any age allowed
    os.utime(old, (stamp, stamp))
    text = days if isinstance(days, str) else repr(days)
    # "=": argparse reads "-1e+16" after a space as an option, not a value
    done = run_cli("cache", "prune", f"--older-than={text}", "--json", "--cache-dir", str(cache))
    value = float(text)
    if math.isfinite(value) and 0 <= value <= MAX_AGE_DAYS:
        assert done.returncode == 0, done.stdout + done.stderr
        assert not old.exists()
    else:
        assert done.returncode == 2, done.stdout + done.stderr
        assert "is not a number of days from 0 to 36500" in done.stderr
        assert old.exists()
        with pytest.raises(ConfigurationError):
            prune_cache(cache, older_than_days=value)
