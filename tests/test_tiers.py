"""The test tiers and the in-process CLI runner of tests/helpers/cli.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli, run_cli_process
from tests.helpers.paths import REPO


def _collect(*args: str) -> subprocess.CompletedProcess[str]:
    """``pytest --collect-only -q ARGS`` over the whole suite, in a new process."""
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.slow(reason="collects the whole suite in a child pytest")
def test_every_test_is_in_exactly_one_tier() -> None:
    """The union of the tiers is the whole suite and they do not overlap: no test is in
    both or in neither (and every test on a slow fixture is marked slow, or collection
    fails)."""
    done = _collect("-m", "(fast and slow) or (not fast and not slow)")
    assert done.returncode == 5, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no tests collected" in done.stdout and "deselected" in done.stdout, done.stdout


@pytest.mark.slow(reason="collects the whole suite in a child pytest")
def test_the_heavy_tests_are_slow_and_the_refusals_fast() -> None:
    """A test on a Docker Engine and one building FlashInfer are slow; a CLI refusal and
    the patch engine's unit tests are fast."""
    slow = _collect("-m", "slow").stdout.splitlines()
    fast = _collect("-m", "fast", "tests/cli/test_main.py", "tests/patching/test_hunks.py").stdout
    assert any(line.startswith("tests/image/test_build.py::") for line in slow)
    assert any(line.startswith("tests/kernels/test_build.py::") for line in slow)
    assert "tests/cli/test_main.py::test_unknown_target" in fast
    assert "tests/patching/test_hunks.py::" in fast


def test_a_slow_fixture_without_the_mark_stops_the_collection(tmp_path: Path) -> None:
    """The plugin's one rule, on a suite of its own: a test on ``docker_engine`` without
    ``@pytest.mark.slow(reason=...)``, and a ``slow`` mark without a reason, each stop the
    collection (usage error) with the test, the fixture and why it is slow; a marked test
    on the same fixture is collected."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  fast: f\n  slow: s\n")
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\npytest_plugins = ['tests.helpers.tiers']\n\n\n"
        "@pytest.fixture\ndef docker_engine():\n    return None\n")
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n\ndef test_unmarked(docker_engine):\n    pass\n\n\n"
        "@pytest.mark.slow\ndef test_no_reason():\n    pass\n\n\n"
        "@pytest.mark.slow(reason='r')\ndef test_marked(docker_engine):\n    pass\n")
    run = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 4, done.stdout + done.stderr
    assert ("test_x.py::test_unmarked uses docker_engine (starts a Docker Engine): mark it "
            '@pytest.mark.slow(reason="...")') in done.stderr, done.stderr
    assert "test_x.py::test_no_reason is marked slow without a reason" in done.stderr
    assert "test_marked" not in done.stderr
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n\n@pytest.mark.slow(reason='r')\n"
        "def test_marked(docker_engine):\n    pass\n\n\ndef test_plain():\n    pass\n")
    fast = subprocess.run([*run, "-m", "fast"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert fast.returncode == 0 and "test_x.py::test_plain" in fast.stdout, fast.stdout
    assert "test_marked" not in fast.stdout


def test_in_process_run_restores_env_cwd_and_sigterm(tmp_path: Path) -> None:
    """The run sees its env and cwd; afterwards the test's are back, and so is the
    SIGTERM handler the CLI replaces while it runs."""
    before_env, before_cwd = dict(os.environ), os.getcwd()
    before_term = signal.getsignal(signal.SIGTERM)
    (tmp_path / "targets.toml").write_text("this is = = not toml\n")
    done = run_cli("targets", cwd=tmp_path, cache=tmp_path / "cache",
                   env={"SGLANG_SM120_TIERS_PROBE": "1"})
    assert done.returncode != 0 and "targets.toml" in done.stderr, done.stderr
    assert dict(os.environ) == before_env and os.getcwd() == before_cwd
    assert signal.getsignal(signal.SIGTERM) is before_term


def test_in_process_and_process_runs_agree() -> None:
    """Same exit status and output both ways: a refusal (stderr, status 2), a usage error
    (argparse's SystemExit 2) and --help (stdout, 0)."""
    for args in (("wheel", "--target", "nope"), ("wheel", "--no-such-flag"), ("--help",)):
        inside, outside = run_cli(*args), run_cli_process(*args)
        assert (inside.returncode, inside.stdout, inside.stderr) == (
            outside.returncode, outside.stdout, outside.stderr), args
