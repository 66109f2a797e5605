"""The builder's CLI run in the test's process (:func:`run_cli`) or in a new one
(:func:`run_cli_process`), as ``python -m builder ARGS`` would."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers.paths import REPO


def run_cli(*args: str, cwd: Path = REPO, cache: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI with ``ARGS`` as ``python -m builder ARGS`` would, in this process.

    ``builder.cli.main`` runs with ``cwd`` as the working directory and ``env`` (and
    ``SGLANG_SM120_CACHE=cache``) added to the environment, both restored afterwards, as is
    the SIGTERM handler. Its output is captured at both levels: what Python writes to
    ``sys.stdout``/``sys.stderr`` and what child processes write to file descriptors 1 and
    2. A usage error (argparse's ``SystemExit``) becomes its exit status, as in a process.
    Tests that need a real process (signals, pipes, interpreter flags, start-up cost) use
    :func:`run_cli_process`.

    Returns:
        The finished run, shaped like :func:`subprocess.run`'s result.
    """
    from builder.cli.main import main
    from builder.core.pipconfig import pip_index

    added = {**(env or {})}
    if cache is not None:
        added["SGLANG_SM120_CACHE"] = str(cache)
    saved_env = os.environ.copy()
    saved_cwd = os.getcwd()
    saved_sigterm = signal.getsignal(signal.SIGTERM)
    held_before = set(_cache_locks())
    out, err = io.StringIO(), io.StringIO()
    status: int | str | None
    with tempfile.TemporaryFile("w+b") as fd_out, tempfile.TemporaryFile("w+b") as fd_err:
        saved_fds = [os.dup(1), os.dup(2)]
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(fd_out.fileno(), 1)
            os.dup2(fd_err.fileno(), 2)
            os.environ.update(added)
            os.chdir(cwd)
            pip_index.cache_clear()  # pip's index is read once per process, from the env
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    status = main(list(args))
                except SystemExit as exc:  # argparse's usage errors and --help
                    status = exc.code
        finally:
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for saved in saved_fds:
                os.close(saved)
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
            pip_index.cache_clear()
            signal.signal(signal.SIGTERM, saved_sigterm)
            _release_caches(held_before)
        fd_out.seek(0)
        fd_err.seek(0)
        stdout = out.getvalue() + fd_out.read().decode(errors="replace")
        stderr = err.getvalue() + fd_err.read().decode(errors="replace")
    if isinstance(status, str):  # sys.exit("message"): printed, status 1
        stderr += status + "\n"
        status = 1
    return subprocess.CompletedProcess(["python", "-m", "builder", *args], status or 0,
                                       stdout, stderr)


def _cache_locks() -> dict[Path, int]:
    """The caches this process holds (``builder.core.cache``: root -> locked descriptor)."""
    from builder.core import cache

    held: dict[Path, int] = cache._HELD
    return held


def _release_caches(held_before: set[Path]) -> None:
    """Drop the cache locks a run took, as the end of its process would (the kernel
    releases a ``flock`` at exit): a later ``cache prune`` must not see them as its own."""
    held = _cache_locks()
    for root in set(held) - held_before:
        os.close(held.pop(root))


def release_refused_before_any_work(tmp_path: Path,
                                    kernel_wheel: Path) -> subprocess.CompletedProcess[str]:
    """Run the image release with ``kernel_wheel`` against ports nothing listens on (engine,
    registry, index) and check that it stopped with a publishing fault (7) before any work:
    no cache and no ``dist/`` under ``tmp_path``. The caller checks the message."""
    done = run_cli("release", "image", "--gate", "static", "--cache-dir",
                   str(tmp_path / "cache"),
                   "--registry", "127.0.0.1:9", "--repository-url", "http://127.0.0.1:9/",
                   "--kernel-wheel", str(kernel_wheel), "--dist", str(tmp_path / "dist"),
                   env={"DOCKER_HOST": "tcp://127.0.0.1:9"})
    assert done.returncode == 7, done.stdout + done.stderr
    assert not (tmp_path / "cache").exists() and not (tmp_path / "dist").exists()
    return done


def run_cli_process(*args: str, cwd: Path = REPO, cache: Path | None = None,
                    env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m builder ARGS`` in a new process, as a user would.

    For what :func:`run_cli` cannot show in-process: signals, pipes, interpreter start-up.

    Returns:
        The finished process.
    """
    full_env = {**os.environ, **(env or {})}
    if cache is not None:
        full_env["SGLANG_SM120_CACHE"] = str(cache)
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=900)
