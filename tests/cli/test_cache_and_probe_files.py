"""Hostile inputs to ``cache clean``/``prune``, ``warm-cache`` and ``smoke host --probe-output``:
another program's cache, a linked lock file, a folder or a named pipe where a file is
meant, and probe outputs of every malformed shape. Each is one refusal (exit 2) or the
documented outcome, never a traceback, never a wait, and nothing is written or deleted.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builder.core.cache import CACHEDIR_SIGNATURE, CACHEDIR_TAG, IN_USE_FILE
from builder.smoke.shared import RESULT_PREFIX
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO

OTHER_TAG = CACHEDIR_SIGNATURE + b"\n# created by cargo\n"


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (``None``: a folder or a link)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink()
                                       else None) for p in sorted(root.rglob("*"))}


def _builder_cache(root: Path) -> None:
    """A cache the builder made, with one wheel entry (in a child process: this process's
    shared hold would block the clean)."""
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                    "from builder.core.cache import Cache; c = Cache(Path(sys.argv[1])); "
                    "c.artifact('wheel', 'a' * 8, lambda t: (t / 'f').write_text('x') and None)",
                    str(root)], check=True, cwd=REPO)


def _run_bounded(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m builder ARGS`` in a process of its own, killed after ``timeout`` seconds
    (for inputs that used to block forever: a run in this process would hang the suite)."""
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


# ---------------------------------------------------------------- 1. another program's tag


@pytest.mark.parametrize("action", [("clean",), ("prune", "--older-than", "0")])
def test_a_folder_tagged_by_another_program_is_not_cleaned(tmp_path: Path,
                                                           action: tuple[str, ...]) -> None:
    cargo = tmp_path / "cargo"
    for folder in ("downloads/important", "git/myrepo"):
        (cargo / folder).mkdir(parents=True)
        (cargo / folder / "keep.txt").write_text("mine")
    (cargo / CACHEDIR_TAG).write_bytes(OTHER_TAG)
    before = _tree(cargo)
    done = run_cli("cache", *action, "--cache-dir", str(cargo))
    assert done.returncode == 2, done.stderr
    assert f"{cargo} is not a builder cache" in done.stderr and "nothing was removed" in \
        done.stderr and "Traceback" not in done.stderr
    assert _tree(cargo) == before  # nothing deleted, and no .in-use made in it


def test_a_build_using_another_programs_cache_leaves_its_tag(tmp_path: Path) -> None:
    # Rewriting the tag would make the folder look like the builder's to a later clean.
    cargo = tmp_path / "cargo"
    (cargo / "downloads" / "important").mkdir(parents=True)
    (cargo / CACHEDIR_TAG).write_bytes(OTHER_TAG)
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                    "from builder.core.cache import Cache; "
                    "Cache(Path(sys.argv[1])).lookup('wheel', 'x')", str(cargo)],
                   check=True, cwd=REPO)
    assert (cargo / CACHEDIR_TAG).read_bytes() == OTHER_TAG
    assert run_cli("cache", "clean", "--cache-dir", str(cargo)).returncode == 2
    assert (cargo / "downloads" / "important").is_dir()


def test_a_cache_the_builder_made_is_still_cleaned(tmp_path: Path) -> None:
    _builder_cache(tmp_path / "c")
    assert (tmp_path / "c" / "wheel" / ("a" * 8)).is_dir()
    done = run_cli("cache", "clean", "--json", "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == 0, done.stderr
    assert [e["kind"] for e in json.loads(done.stdout)["removed"]] == ["wheel"]
    assert not (tmp_path / "c" / "wheel" / ("a" * 8)).exists()


# ---------------------------------------------------------------- 2. the .in-use lock file


@pytest.mark.parametrize("dangling", [True, False])
def test_a_linked_in_use_file_is_never_followed(tmp_path: Path, dangling: bool) -> None:
    cache, outside = tmp_path / "c", tmp_path / "outside"
    _builder_cache(cache)
    outside.mkdir()
    target = outside / "lock"
    if not dangling:
        target.write_text("someone's file")
    (cache / IN_USE_FILE).unlink()
    (cache / IN_USE_FILE).symlink_to(target)
    before, seen = _tree(cache), _tree(outside)
    done = run_cli("cache", "clean", "--cache-dir", str(cache))
    assert done.returncode == 2, done.stderr
    assert f"{cache / IN_USE_FILE} is a symbolic link" in done.stderr
    assert _tree(cache) == before and _tree(outside) == seen  # nothing made, nothing gone
    # a build refuses it too, before it creates anything through it
    used = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                           "from builder.core.cache import Cache; "
                           "Cache(Path(sys.argv[1])).lookup('wheel', 'x')", str(cache)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert used.returncode != 0 and "is a symbolic link" in used.stderr
    assert _tree(outside) == seen and (cache / IN_USE_FILE).is_symlink()


# ---------------------------------------------------------------- 3. warm-cache's files

KEY = {"gpu_name": "NVIDIA H200", "compute_capability": "9.0", "flashinfer_version": "0.6.14",
       "release": "sglang-0.5.16", "hidden": 1024, "experts": 8, "top_k": 2,
       "intermediate": 512, "tp": 1, "dtype": "bf16"}


def _artifact(path: Path) -> Path:
    path.write_text(json.dumps({"format": 1, "key": KEY,
                                "flashinfer_cache": {"_metadata": {"gpu": "NVIDIA H200"}}}))
    return path


@pytest.mark.parametrize("artifact", ["good", "unreadable", "missing"])
def test_restore_to_a_folder_is_the_users_error(tmp_path: Path, artifact: str) -> None:
    (tmp_path / "key.json").write_text(json.dumps(KEY))
    given_artifact = tmp_path / "warm.json"
    if artifact == "good":
        _artifact(given_artifact)
    elif artifact == "unreadable":
        given_artifact.write_text("{not json")
    dest = tmp_path / "dest"
    dest.mkdir()
    before = _tree(tmp_path)
    done = run_cli("warm-cache", "restore", "--artifact", str(given_artifact), "--key",
                   str(tmp_path / "key.json"), "--dest", str(dest))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"{dest} is a folder, not a file the output can replace" in done.stderr
    assert _tree(tmp_path) == before


def test_warm_cache_never_waits_on_a_named_pipe(tmp_path: Path) -> None:
    (tmp_path / "key.json").write_text(json.dumps(KEY))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    key, dest = str(tmp_path / "key.json"), tmp_path / "out.json"
    # the artifact: unreadable, so ignored with one warning (documented: exit 0), at once
    done = _run_bounded("warm-cache", "restore", "--artifact", str(fifo), "--key", key,
                        "--dest", str(dest), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["restored"] is False, done.stderr
    assert "is a named pipe" in done.stderr and not dest.exists()
    # the key and capture's input: the user's bad input, exit 2
    for args in (("restore", "--artifact", str(_artifact(tmp_path / "warm.json")),
                  "--key", str(fifo), "--dest", str(dest)),
                 ("capture", "--autotune-file", str(fifo), "--key", key,
                  "--output", str(dest))):
        done = _run_bounded("warm-cache", *args)
        assert done.returncode == 2 and f"{fifo} is a named pipe" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and not dest.exists()
    done = _run_bounded("warm-cache", "restore", "--artifact", str(tmp_path / "warm.json"),
                        "--key", str(tmp_path), "--dest", str(dest))
    assert done.returncode == 2 and "cannot read the key" in done.stderr and \
        "is a folder" in done.stderr


# ---------------------------------------------------------------- 4. smoke --probe-output

PROVENANCE = {"version": "0.5.9+sm120.1", "target": "sglang-0.5.9", "upstream_version": "0.5.9",
              "patches": [{"name": "0001-x.patch", "status": "applied", "sha256": "0" * 64}]}
MANIFEST = {"schema": 1, "flashinfer_version": "0.6.3", "version": "0.6.3+sm90.test",
            "arch_list": ["9.0a"], "cuda_version": "13.0", "nvcc_version": "13.0.88",
            "flags_sha256": "0" * 64,
            "modules": [{"name": "norm", "path": "norm/norm.so", "sha256": "a" * 64,
                         "sass": ["sm_90a"]}]}


def _valid_results() -> list[dict[str, Any]]:
    """Results shaped as ``smoke_probe.py`` prints them (every check of a host run)."""
    runner = {"gpu": "NVIDIA H200", "compute_capability": "9.0", "driver": "580",
              "cuda_runtime": "13.0", "devices": 1}
    sglang = {"version": "0.5.9+sm120.1", "provenance": json.dumps(PROVENANCE),
              "requires": ["flashinfer_python==0.6.3", "flashinfer_cubin==0.6.3",
                           "decord2; extra == 'test'"],
              "record": {"sglang/__init__.py": "sha256=abc", "sglang/x.pyc": None},
              "mismatched": [], "missing": [],
              "texts": {"sglang/srt/model_executor/model_runner.py": "x = 1\n"}}
    versions = {"versions": {"flashinfer-python": "0.6.3", "flashinfer-cubin": "0.6.3",
                             "flashinfer-jit-cache": "0.6.3+sm90.test", "torch": "2.11.0",
                             "sglang": "0.5.9+sm120.1"},
                "manifest": copy.deepcopy(MANIFEST), "manifest_error": None,
                "torch_cuda": "13.0"}
    return [{"name": "runner", "status": "passed", "detail": "a GPU", "data": runner},
            {"name": "sglang-data", "status": "passed", "detail": "collected", "data": sglang},
            {"name": "versions-data", "status": "passed", "detail": "collected",
             "data": versions},
            {"name": "kernels", "status": "passed", "detail": "all load", "data": {}},
            {"name": "moe-autotune", "status": "not-run", "detail": "no module", "data": {}}]


def _write_probe(path: Path, results: list[dict[str, Any]]) -> Path:
    path.write_text("some library's print\n" + "".join(
        RESULT_PREFIX + json.dumps(r) + "\n" for r in results))
    return path


def _smoke(probe: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli("smoke", "host", "--json", "--probe-output", str(probe), *extra)


def _report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The report a judged smoke printed (inside the error object when it failed)."""
    out: dict[str, Any] = json.loads(done.stdout)
    return out["report"] if done.returncode else out


def test_a_valid_probe_output_is_judged(tmp_path: Path) -> None:
    done = _smoke(_write_probe(tmp_path / "probe.out", _valid_results()))
    assert done.returncode == 1, done.stderr  # judged: the sglang check fails (no intent)
    report = _report(done)
    assert report["artifacts"]["kernels"]["version"] == "0.6.3+sm90.test"
    assert {c["name"]: c["status"] for c in report["checks"]}["lockstep"] == "passed"


def _mutated(index: int, change: dict[str, Any], drop: tuple[str, ...] = ()
             ) -> list[dict[str, Any]]:
    results = _valid_results()
    data = results[index]["data"]
    data.update(change)
    for key in drop:
        del data[key]
    return results


@pytest.mark.parametrize(("results", "message"), [
    (_mutated(1, {"requires": 5}), "data key 'requires' must be a list of strings"),
    (_mutated(1, {}, drop=("version",)), "'sglang-data' (passed) has no data key 'version'"),
    (_mutated(1, {"record": []}), "data key 'record' must be an object"),
    (_mutated(2, {"manifest": {}}, drop=("versions",)),
     "'versions-data' (passed) has no data key 'versions'"),
    (_mutated(2, {"versions": 5}), "data key 'versions' must be an object"),
    (_mutated(2, {"versions": {"torch": "2"}}), "versions names no flashinfer-python"),
    (_mutated(2, {"manifest": 5}), "data key 'manifest' must be an object or null"),
    ([{**r, "status": "failed"} if r["name"] == "versions-data" else r
      for r in _mutated(2, {"manifest": {}}, drop=("versions",))],
     "'versions-data' (failed) has no data key 'versions'"),
])
def test_a_malformed_probe_output_is_one_error(tmp_path: Path, results: list[dict[str, Any]],
                                               message: str) -> None:
    probe = _write_probe(tmp_path / "probe.out", results)
    done = _smoke(probe, "--output", str(tmp_path / "report.json"))
    assert done.returncode == 2, done.stderr
    said = json.loads(done.stdout)["error"]  # --json: the error is the object printed
    assert said.startswith(f"{probe} is not the probe's output: probe result"), said
    assert message in said and "Traceback" not in done.stderr
    assert not (tmp_path / "report.json").exists()


@pytest.mark.parametrize(("provenance", "message"), [
    ("{not json", "is not JSON"), ("[1]", "is a JSON list, not an object"),
    (json.dumps({"patches": 5}), "has patches that are not a list"),
    (json.dumps({"patches": [{"status": "applied"}]}), "has patches that are not a list"),
])
def test_an_installed_provenance_that_is_not_ours_fails_the_check(
        tmp_path: Path, provenance: str, message: str) -> None:
    # the wheel's own file, read as it is installed: the sglang check fails, judged
    done = _smoke(_write_probe(tmp_path / "probe.out",
                               _mutated(1, {"provenance": provenance})))
    assert done.returncode == 1, done.stderr
    sglang = {c["name"]: c for c in _report(done)["checks"]}["sglang"]
    assert sglang["status"] == "failed" and message in sglang["detail"]


def test_an_unjudgeable_requirement_marker_pins_nothing(tmp_path: Path) -> None:
    done = _smoke(_write_probe(tmp_path / "probe.out", _mutated(1, {"requires": [
        "flashinfer_python==0.6.3; os_name ~= 'x'"]})))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr


def test_an_expected_provenance_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    (tmp_path / "expected.json").write_text("[1, 2]")
    done = _smoke(_write_probe(tmp_path / "probe.out", _valid_results()),
                  "--expect-provenance", str(tmp_path / "expected.json"))
    assert done.returncode == 2, done.stderr
    assert "is a JSON list, not an object" in json.loads(done.stdout)["error"]


def test_smoke_never_waits_on_a_named_pipe(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    probe = _write_probe(tmp_path / "probe.out", _valid_results())
    for args in (("--probe-output", str(fifo)),
                 ("--probe-output", str(probe), "--expect-provenance", str(fifo))):
        done = _run_bounded("smoke", "host", *args)
        assert done.returncode == 2 and f"{fifo} is a named pipe" in done.stderr, done.stderr


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and indexes) into ``value``, itself included."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


@st.composite
def _hostile_results(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Valid results with 1-3 changes: a value replaced (by any JSON, or a valid value of
    another place) or a key deleted, anywhere in them."""
    results = _valid_results()
    pool = [v for r in _valid_results() for p in _paths(r) if (v := _get(r, p)) is not None]
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(results) if p]
        where = draw(st.sampled_from(paths))
        parent = _get(results, where[:-1])
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[where[-1]]
        else:
            # a copy: a later change must not edit a value Hypothesis may hand out again
            parent[where[-1]] = copy.deepcopy(draw(_JSON | st.sampled_from(pool)))
    return results


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(results=_hostile_results(), as_json=st.booleans())
def test_no_mutated_probe_output_gives_a_traceback(tmp_path: Path, results: list[dict[str, Any]],
                                                   as_json: bool) -> None:
    probe = _write_probe(tmp_path / "probe.out", results)
    if not as_json:  # the table people read: every detail as the probe wrote it
        shown = run_cli("smoke", "host", "--probe-output", str(probe))
        assert shown.returncode in (0, 1, 2) and "Traceback" not in shown.stderr, \
            shown.stderr[-2000:]
        return
    done = _smoke(probe)
    assert done.returncode in (0, 1, 2), (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    if done.returncode == 2:
        assert "is not the probe's output" in json.loads(done.stdout)["error"], done.stdout
    else:
        assert _report(done)["checks"]  # a report, whatever it says
