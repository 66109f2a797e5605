"""The behaviour stage on a full disk: pip's ENOSPC, from a real ``pip install`` into a
256 KiB tmpfs (a private mount namespace: root and unshare(1)), is reported as a full disk
with its free space and the space the step needs, never as a network problem."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from builder.behaviour.env import SIZES, pip_failure
from tests.helpers.releases import download
from tests.helpers.services import need, need_root
from tests.helpers.targets import release_file


def _install_on_a_tiny_disk(folder: Path, wheel: Path) -> subprocess.CompletedProcess[str]:
    script = (f"mount -t tmpfs -o size=256k tmpfs {folder} || exit 97; "
              f"{sys.executable} -m pip install --quiet --disable-pip-version-check "
              f"--no-deps --no-index --target {folder}/site {wheel}")
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow(reason="a real pip install into a small tmpfs, in a private mount")
def test_a_full_disk_is_said_as_such_with_the_space_needed(tmp_path: Path) -> None:
    # Never a skip: the services' rule (tests/helpers/services.py), as the other unshare tests.
    need_root("a private mount namespace (unshare -m)")
    need("unshare", "util-linux")
    wheel = download(release_file("0.5.16"))  # about 4 MB: does not fit in 256 KiB
    folder = tmp_path / "small"
    folder.mkdir()
    done = _install_on_a_tiny_disk(folder, wheel)
    assert done.returncode not in (0, 97), done.stderr
    error = pip_failure(done, folder, "the behaviour environment (sglang 0.5.16)",
                        SIZES["environment"], "check the network (PyPI) and the release's pins")
    assert error.cause.startswith("the disk is full: the behaviour environment (sglang "
                                  f"0.5.16) could not be written under {folder} (")
    assert "it needs about 3.8 GB per release" in error.cause
    assert "network" not in error.cause + error.hint and "--cache-dir" in error.hint
    assert error.exit_status == 6
    # Any other pip failure keeps its own words and hint.
    other = pip_failure(subprocess.CompletedProcess([], 1, "", "ERROR: No matching "
                        "distribution found for tilelang==9"), folder, "tilelang", "x",
                        "check the network (PyPI)")
    assert other.cause.endswith("No matching distribution found for tilelang==9")
    assert other.hint == "check the network (PyPI)"


def test_the_torch_size_is_what_pip_installs_with_or_without_a_cpu_index(tmp_path: Path) -> None:
    # Issue 37: PyPI's torch 2.13.0 is the CUDA build (about 4.7 GB with its nvidia-*
    # wheels); 0.9 GB holds only for the +cpu build a CPU index or a wheelhouse offers.
    error = pip_failure(subprocess.CompletedProcess([], 1, "", "OSError: [Errno 28] No "
                        "space left on device"), tmp_path, "torch", SIZES["torch"], "x")
    assert error.exit_status == 6
    assert "0.9 GB once as the +cpu build" in error.cause
    assert "about 4.7 GB as PyPI's CUDA build" in error.cause
