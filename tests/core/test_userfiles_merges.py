"""Issue 38, class H: the user's files under merges, hand edits, line endings, links and
concurrent writers. A JSON object naming one key twice (a merge) is refused wherever the
builder reads JSON; a CRLF ``versions.lock`` stays CRLF; two projects sharing one lock
through links lose no entry under concurrent writers; concurrent ``next-label`` runs lose
no bump. Real files, real processes, the CLI as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.core.config import load_targets
from builder.core.lock import VersionLock
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.project import write_project

A = "a" * 64


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "SGLANG_SM120_CACHE": str(cache), "NO_COLOR": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")]))}


def test_a_lock_with_one_version_twice_is_refused_naming_it(tmp_path: Path) -> None:
    """A merge left two digests for one version (the same JSON key twice; Python's json
    keeps the last): ``lock --verify`` refuses the file and names the version."""
    project = write_project(tmp_path / "p")
    done = run_cli("lock", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    lock = project / "versions.lock"
    text = lock.read_text()
    version = next(iter(json.loads(text)["wheel"]["t"]))
    digest = json.loads(text)["wheel"]["t"][version]
    lock.write_text(text.replace(f'"{version}": "{digest}"',
                                 f'"{version}": "{"0" * 64}",\n      "{version}": "{digest}"'))
    done = run_cli("lock", "--verify", "--json", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert f"the key '{version}' appears twice" in error and str(lock) in error


def test_a_kernel_request_with_a_key_twice_is_refused(tmp_path: Path) -> None:
    """Every JSON file the builder reads goes through one parser: a request naming a field
    twice is refused before anything is built."""
    request = tmp_path / "request.json"
    request.write_text('{"schema": 1, "schema": 2}\n')
    done = run_cli("kernels", "build", "--request", str(request), "--dist",
                   str(tmp_path / "dist"), "--json", cwd=tmp_path, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the key 'schema' appears twice" in json.loads(done.stdout)["error"]
    assert not (tmp_path / "dist").exists()


def test_a_crlf_lock_stays_crlf(tmp_path: Path) -> None:
    """A lock checked out with CRLF (git's autocrlf) is written back with CRLF: a
    recording changes only the lines it adds."""
    lock = tmp_path / "versions.lock"
    VersionLock(lock).record("wheel", "t", "0.5.9+sm120.1", A)
    lock.write_bytes(lock.read_bytes().replace(b"\n", b"\r\n"))
    VersionLock(lock).record("wheel", "t", "0.5.9+sm120.2", A)
    data = lock.read_bytes()
    assert data.count(b"\n") == data.count(b"\r\n") > 5
    assert VersionLock(lock).entries["wheel"]["t"] == {"0.5.9+sm120.1": A, "0.5.9+sm120.2": A}


WRITER = """
import sys
from pathlib import Path
from builder.core.lock import VersionLock
path, me = Path(sys.argv[1]), sys.argv[2]
for n in range(12):
    VersionLock(path).record("wheel", f"t{me}", f"0.{me}.{n}+sm120.1", "%064x" % n)
"""


def test_two_projects_sharing_a_lock_through_links_lose_nothing(tmp_path: Path) -> None:
    """Two projects whose ``versions.lock`` are links to one file: writers in both at once
    serialise on the file itself, not on each link's folder."""
    shared = tmp_path / "shared" / "versions.lock"
    shared.parent.mkdir()
    VersionLock(shared).record("wheel", "base", "0.1+sm120.1", A)
    links = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "versions.lock").symlink_to(shared)
        links.append(tmp_path / name / "versions.lock")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(links[me % 2]), str(me)],
                                cwd=REPO, env=_env(tmp_path / "cache")) for me in range(6)]
    assert [w.wait(timeout=120) for w in writers] == [0] * 6
    entries = VersionLock(shared).entries["wheel"]
    assert {t: len(v) for t, v in entries.items()} == {"base": 1, **{f"t{me}": 12
                                                                     for me in range(6)}}
    assert all(link.is_symlink() for link in links)


def test_concurrent_next_label_runs_lose_no_bump(tmp_path: Path) -> None:
    """Each ``next-label`` that exits 0 raised the label once: six at once end six higher,
    each reporting a different new label."""
    project = write_project(tmp_path / "p")
    old = load_targets(project / "targets.toml").get("t").local_label
    runs = [subprocess.Popen([sys.executable, "-m", "builder", "next-label", "--target", "t",
                              "--json"], cwd=project, env=_env(tmp_path / "cache"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(6)]
    outputs = [r.communicate(timeout=120) for r in runs]
    assert [r.returncode for r in runs] == [0] * 6, outputs
    new = sorted((json.loads(out)["new"] for out, _ in outputs),
                 key=lambda label: int(label.rsplit(".", 1)[1]))
    number = int(old.rsplit(".", 1)[1])
    prefix = old.rsplit(".", 1)[0]
    assert new == [f"{prefix}.{number + n}" for n in range(1, 7)]
    assert load_targets(project / "targets.toml").get("t").local_label == new[-1]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_next_label_keeps_the_targets_files_line_endings(tmp_path: Path,
                                                         newline: bytes) -> None:
    project = write_project(tmp_path / "p")
    targets = project / "targets.toml"
    targets.write_bytes(targets.read_bytes().replace(b"\n", newline))
    done = run_cli("next-label", "--target", "t", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    data = targets.read_bytes()
    assert data.count(b"\r\n") == (data.count(b"\n") if newline == b"\r\n" else 0)
