"""Exit statuses and hints from paths that used to end in a catch-all (issue 38, class E):
a read-only cache is named with its permissions, never "remove a file"; the release
parser's own exit under ``serve-command --check`` is the user's argument (exit 2, with what
the parser said), never a build error. The index address's port: tests/cli/test_addresses.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.services import need, need_root
from tests.helpers.tiers import BEHAVIOUR


def test_a_read_only_cache_is_named_with_its_permissions(tmp_path: Path) -> None:
    """The cache on a read-only mount (a private mount namespace: root and unshare)."""
    need_root("a read-only bind mount")
    unshare = need("unshare", "util-linux")
    cache = tmp_path / "cache"
    cache.mkdir()
    script = (f'mount --bind "{cache}" "{cache}" && mount -o remount,bind,ro "{cache}" && '
              f'exec "{sys.executable}" -m builder fetch --json')
    done = subprocess.run([unshare, "-m", "--propagation", "private", "sh", "-c", script],
                          cwd=REPO, env={**os.environ, "SGLANG_SM120_CACHE": str(cache)},
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"the cache {cache} is not writable: Read-only file system" in done.stdout
    assert "remove" not in done.stdout and "--cache-dir" in done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.slow(reason="runs 0.5.23's own parser in its behaviour environment",
                  group=BEHAVIOUR)
def test_serve_command_check_refuses_an_argument_that_ends_the_parse(
        shared_cache: Path) -> None:
    """-h ends argparse's parse with an exit (after printing the help): the release's
    parser answered about the user's arguments."""
    done = run_cli("serve-command", "--target", "sglang-0.5.23", "--gpu", "rtx-5090",
                   "--tp", "1", "--model", "m", "--check", "--", "--help", cache=shared_cache)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "own argument parser refuses the command: the parser exits (status 0)" \
        in " ".join(done.stderr.split())
    assert "build error" not in done.stderr
