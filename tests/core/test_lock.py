"""The version lock: one version, one content, whatever the target's name or a second
writer. Real lock files; the concurrent writers are real processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from builder.core.errors import ConfigurationError
from builder.core.lock import VersionLock
from tests.helpers.paths import REPO

A, B = "a" * 64, "b" * 64


def test_a_wheel_version_belongs_to_one_target(tmp_path: Path) -> None:
    lock = VersionLock(tmp_path / "versions.lock")
    assert lock.record("wheel", "sglang-0.5.9", "0.5.9+sm120.1", A)
    for digest in (A, B):  # even the same digest: the provenance names the target
        with pytest.raises(ConfigurationError, match="one version must always mean one"):
            VersionLock(tmp_path / "versions.lock").record("wheel", "renamed", "0.5.9+sm120.1",
                                                           digest)


def test_a_kernel_version_shared_by_targets_is_one_content(tmp_path: Path) -> None:
    lock = VersionLock(tmp_path / "versions.lock")
    lock.record("kernels", "sglang-0.5.9", "0.6.3+sm120.1.cu130", A)
    assert lock.record("kernels", "sglang-0.5.10", "0.6.3+sm120.1.cu130", A)
    with pytest.raises(ConfigurationError, match="one version must always mean one"):
        lock.record("kernels", "sglang-0.5.11", "0.6.3+sm120.1.cu130", B)


WRITER = """
import sys
from pathlib import Path
from builder.core.lock import VersionLock
path, me = Path(sys.argv[1]), sys.argv[2]
for n in range(15):
    VersionLock(path).record("wheel", f"t{me}", f"0.{me}.{n}+sm120.1", "%064x" % n)
"""


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "versions.lock"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(me)],
                                cwd=REPO, env={"PYTHONPATH": str(REPO)})
               for me in range(6)]
    assert [w.wait(timeout=120) for w in writers] == [0] * 6
    entries = VersionLock(path).entries["wheel"]
    assert {t: len(v) for t, v in entries.items()} == {f"t{me}": 15 for me in range(6)}
