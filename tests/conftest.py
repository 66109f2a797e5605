"""Shared fixtures: real SGLang sdists from PyPI (pinned by sha256, cached between runs),
a local git repository built from those releases, and a CLI runner."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git
import pytest
from services import (
    DEBIAN_SUITE,
    DockerEngine,
    PackageIndex,
    Registry,
    debian_rootfs,
    import_image,
    push_image,
    start_docker_engine,
    start_package_index,
    start_registry,
)

from builder.image.build import BaseImage

REPO = Path(__file__).resolve().parent.parent
TEST_CACHE = Path(os.environ.get("SGLANG_SM120_TEST_CACHE", REPO / ".cache" / "tests"))
MODEL_RUNNER = "sglang/srt/model_executor/model_runner.py"


@dataclass(frozen=True)
class Release:
    version: str
    sha256: str
    url: str


# The real sdists on PyPI (files.pythonhosted.org), the sha256 being the pin.
RELEASES = {
    "0.5.7": Release("0.5.7", "930e00658128016838d14dddb4527a0948d512cd1f265d465de98d32414b89ed",
                     "https://files.pythonhosted.org/packages/d7/bd/1943cac907b2aa575853bf9d2a95c315caf3473ec6edd826e96d7e3adf7d/sglang-0.5.7.tar.gz"),
    "0.5.9": Release("0.5.9", "11b1445bfb039c20217783850fda66a71b814391b2cf313f4e6cadc3b9fea41b",
                     "https://files.pythonhosted.org/packages/3b/a8/2e75eae9f5817510175c299016b9c2fc324d06a9fa56944322a2e731ef59/sglang-0.5.9.tar.gz"),
    "0.5.10.post1": Release(
        "0.5.10.post1", "01f7adfe7cde85b238fb0e1bae4b31d494e19d1471cf35ff3c5489a02f9d2263",
        "https://files.pythonhosted.org/packages/42/38/feb04f6478b90315606fcd62b798917e7fcee9f1d7d84b01cf477398045e/sglang-0.5.10.post1.tar.gz"),
}


# Later releases, for the compatibility matrix: 0.5.10rc0 is the last sdist before
# 0.5.10.post1; from 0.5.11 PyPI has only wheels (cp311 x86_64 pinned here).
FILES = "https://files.pythonhosted.org/packages"
MATRIX_RELEASES = {
    "0.5.10rc0": Release("0.5.10rc0",
                         "ae471aa262a5605329e557dc17e422876f27c1827dc8950cb8911a1c08c640d7",
                         f"{FILES}/cd/1f/aebf2398c1a81e1d1dd81d69f6e719e676b17bf9d263416e1768bef5c3ed/sglang-0.5.10rc0.tar.gz"),
    "0.5.11": Release("0.5.11",
                      "fe0748beaff218d3e16c9018a5e19f018db06fc3c7ac4f90d2f93da1cf074b6f",
                      f"{FILES}/22/38/69c189787023034a3c594d8bb9eefbac86cfa5cd4114c29836b97fce8a10/sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl"),
    "0.5.12.post1": Release(
        "0.5.12.post1", "94b3f3cc6b97f1364f247b8d9c1d106ec63cf22c55d6b65bc40ff29b0206ef5f",
        f"{FILES}/0a/72/705194e7ad564a578251307b51bf3a8275668ab2c534a17ca0dc45767204/sglang-0.5.12.post1-cp311-cp311-manylinux_2_34_x86_64.whl"),
    "0.5.13": Release("0.5.13",
                      "9d26266ab7e99165098f9e173f4a5a0ef6a0b64a6f30ef0b5ee859eead37e75a",
                      f"{FILES}/34/a3/b1e44dc83ba5230943fc54f369b7e3f686e81ede86a757cf9e4845890b97/sglang-0.5.13-cp311-cp311-manylinux_2_34_x86_64.whl"),
    "0.5.16": Release("0.5.16",
                      "d5f345a18953dd35df568ac56bdcb7f5ee910ab39efea4469b714556d1070713",
                      f"{FILES}/1f/ae/b7c8395c265a93bb73618a694594ad1e042ff9f43259d45e54a77a2a4bdf/sglang-0.5.16-cp311-cp311-manylinux_2_34_x86_64.whl"),
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _download(release: Release) -> Path:
    folder = TEST_CACHE / "sdists"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / release.url.rsplit("/", 1)[1]
    if path.is_file() and _sha256(path) == release.sha256:
        return path
    tmp = path.with_suffix(".part")
    with urllib.request.urlopen(release.url, timeout=120) as response, tmp.open("wb") as out:
        shutil.copyfileobj(response, out)
    assert _sha256(tmp) == release.sha256, f"PyPI served other bytes for {release.url}"
    tmp.replace(path)
    return path


@pytest.fixture(scope="session")
def sdists() -> dict[str, Path]:
    """version -> path of the verified real sdist."""
    return {version: _download(release) for version, release in RELEASES.items()}


@pytest.fixture(scope="session")
def matrix_files() -> dict[str, Path]:
    """version -> path of the verified real file (sdist or wheel) of a later release."""
    return {version: _download(release) for version, release in MATRIX_RELEASES.items()}


@pytest.fixture(scope="session")
def unpacked(sdists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Path]:
    """version -> an unpacked copy of the sdist (sdist layout), read-only by convention."""
    root = tmp_path_factory.mktemp("unpacked")
    trees = {}
    for version, archive in sdists.items():
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
        trees[version] = root / f"sglang-{version}"
    return trees


@dataclass(frozen=True)
class UpstreamRepo:
    path: Path
    commits: dict[str, str]  # version -> 40-hex commit


@pytest.fixture(scope="session")
def upstream_repo(unpacked: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                  ) -> UpstreamRepo:
    """A real git repository whose python/ folder holds each release in turn."""
    path = tmp_path_factory.mktemp("upstream") / "sglang"
    repo = git.Repo.init(path, initial_branch="main")
    commits = {}
    with repo.config_writer() as config:
        config.set_value("user", "name", "test").set_value("user", "email", "t@example.invalid")
    for version in ("0.5.7", "0.5.9", "0.5.10.post1"):
        shutil.rmtree(path / "python", ignore_errors=True)
        shutil.copytree(unpacked[version], path / "python",
                        ignore=shutil.ignore_patterns("*.egg-info", "PKG-INFO"))
        (path / "README.md").write_text(f"sglang {version}\n")
        repo.git.add("-A")
        env = {"GIT_COMMITTER_DATE": "2026-02-23T08:14:16Z",
               "GIT_AUTHOR_DATE": "2026-02-23T08:14:16Z"}
        repo.git.commit("-m", f"release {version}", env=env)
        repo.create_tag(f"v{version}")
        commits[version] = repo.head.commit.hexsha
    repo.close()
    return UpstreamRepo(path, commits)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """A fresh, empty builder cache for one test."""
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def shared_cache() -> Path:
    """A builder cache kept between runs (fetched sources are reused)."""
    path = TEST_CACHE / "builder-cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def hardlink_tree(source: Path, destination: Path) -> None:
    """``source`` at another path: hard links (no disk), copies across file systems. For
    a cache of a test's own that starts with the shared cache's big entries."""
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, destination, symlinks=True, copy_function=link)


@pytest.fixture(scope="session")
def nvcc() -> Path:
    """The CUDA 13.0 nvcc these machines have (a test that needs it fails without it)."""
    path = Path("/usr/local/cuda/bin/nvcc")
    if not path.is_file():
        pytest.fail(f"{path} is missing: these machines have CUDA 13.0 there")
    return path


@pytest.fixture(scope="session")
def tilelang_nvcc() -> Path:
    """nvcc as the kernel-fit check finds it (:func:`builder.behaviour.fit.find_nvcc`), for
    the tests that lower TileLang kernels; they run on the behaviour worker."""
    from builder.behaviour.fit import find_nvcc

    return find_nvcc()


@dataclass(frozen=True)
class UpstreamRelease:
    """A current target's upstream release, unpatched, with its behaviour environment: the
    failing runs of the behaviour and kernel-fit checks use its tree as the 'patched' one."""

    target: Any
    cache: Any
    source: Any
    env: Any


@pytest.fixture(scope="session")
def upstream_0_5_16(shared_cache: Path) -> UpstreamRelease:
    """sglang-0.5.16's pinned wheel for this interpreter, fetched and unpacked, and its
    behaviour environment (both cached in the shared cache)."""
    from builder.behaviour.env import behaviour_env
    from builder.behaviour.run import wheel_for_interpreter
    from builder.core.cache import Cache
    from builder.core.config import load_targets
    from builder.source.fetch import fetch_pin

    target = load_targets(REPO / "targets.toml").targets["sglang-0.5.16"]
    cache = Cache(shared_cache)
    source = fetch_pin(wheel_for_interpreter(target), target.upstream_version, cache=cache)
    assert source.archive is not None
    return UpstreamRelease(target, cache, source,
                           behaviour_env(source.archive, "0.5.16", cache=cache))


@pytest.fixture(scope="session")
def kernel_cache(shared_cache: Path) -> Path:
    """The cache the kernel tests share (the build venv and wheelhouses are reused). A test
    that reads or empties its kernel entries takes this fixture, so it runs on the services
    worker with every other kernel build (SLOW_FIXTURES), never beside one."""
    return shared_cache


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
    done = run_cli("release", "image", "--gate", "static", "--cache-dir", str(tmp_path / "cache"),
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


def target_toml(name: str, version: str, source: str, *, series: str = "patches/series.toml",
                label: str = "sm120.7") -> str:
    """One ``[[target]]`` table; ``source`` is its ``[[target.source]]`` table's body."""
    return f"""
[[target]]
name = "{name}"
upstream_version = "{version}"
local_label = "{label}"
series = "{series}"
cuda_lane = "12.9"
arch_list = ["12.0a"]

[[target.source]]
{source}
"""


def sdist_source(version: str, archive: Path | None = None, sha256: str | None = None) -> str:
    """A ``[[target.source]]`` body pinning the real sdist of ``version`` (local URL)."""
    sha = sha256 or {**RELEASES, **MATRIX_RELEASES}[version].sha256
    url = f'url = "{archive.as_uri()}"' if archive else ""
    return f'kind = "sdist"\nproject = "sglang"\nversion = "{version}"\nsha256 = "{sha}"\n{url}'


def git_source(url: Path | str, commit: str) -> str:
    """A ``[[target.source]]`` body pinning a git commit."""
    return f'kind = "git"\nurl = "{url}"\ncommit = "{commit}"'


def write_project(root: Path, *, sdist: Path | None = None, version: str = "0.5.9",
                  sha256: str | None = None, patches: dict[str, str] | None = None,
                  series: str | None = None, extra_target: str = "") -> Path:
    """Write a small project (targets.toml, patches/) that builds from a local sdist URL.

    Returns the folder; ``dist/`` inside it is where wheels would go.
    """
    root.mkdir(parents=True, exist_ok=True)
    (root / "patches").mkdir(exist_ok=True)
    for shipped in (REPO / "patches").glob("*.patch"):
        shutil.copy(shipped, root / "patches")
    for name, text in (patches or {}).items():
        (root / "patches" / name).write_text(text)
    if series is None:
        series = (REPO / "patches" / "series.toml").read_text()
    (root / "patches" / "series.toml").write_text(series)
    (root / "targets.toml").write_text('default = "t"\n' + target_toml(
        "t", version, sdist_source(version, sdist, sha256)) + extra_target)
    return root


def patch_sha(text: str) -> str:
    """sha256 of a patch text as written by :func:`write_project`."""
    return hashlib.sha256(text.encode()).hexdigest()


# --- A static folder served on 127.0.0.1 (a simple index for the upstream check) -------

PEP691_JSON = "application/vnd.pypi.simple.v1+json"


@contextmanager
def serve_directory(root: Path, *, json_pages: bool = False) -> Iterator[str]:
    """Serve ``root`` over HTTP on 127.0.0.1 (``http.server``); yield its base URL.

    With ``json_pages`` a folder's ``index.html`` is sent as PEP 691 JSON (its content
    must be JSON), as PyPI answers a client asking for JSON.
    """
    class Handler(http.server.SimpleHTTPRequestHandler):
        def guess_type(self, path: str | os.PathLike[str]) -> str:
            if json_pages and str(path).endswith("index.html"):
                return PEP691_JSON
            return super().guess_type(path)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- real services
# Session fixtures over tests/services.py: a Docker Engine, a registry, a package index
# and a Debian base image, started here on 127.0.0.1 and stopped at the end.


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerEngine]:
    """A private dockerd (overlay2 or vfs, no iptables, no bridge); ``.client`` / ``.api``
    / ``.host``."""
    engine = start_docker_engine(tmp_path_factory.mktemp("docker"))
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A docker-registry on 127.0.0.1 without authentication; ``.host`` is host:port."""
    started = start_registry(tmp_path_factory.mktemp("registry"))
    yield started
    started.stop()


@pytest.fixture(scope="session")
def package_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageIndex]:
    """A pypiserver (--disable-fallback) whose uploads need ``.credentials`` (``.env()``)."""
    started = start_package_index(tmp_path_factory.mktemp("index"),
                                  credentials=("sm120", "index-secret-1"))
    yield started
    started.stop()


@pytest.fixture(scope="session")
def debian_base_image(docker_engine: DockerEngine, registry: Registry) -> BaseImage:
    """A minimal Debian bookworm with python3 and pip (debootstrap, cached in
    .cache/tests/images), imported into ``docker_engine`` and pushed to ``registry``:
    a base referenced by digest, like upstream's."""
    tarball = debian_rootfs(TEST_CACHE / "images")
    image_id = import_image(docker_engine, tarball, "sm120-test/debian", DEBIAN_SUITE)
    name = f"{registry.host}/sm120-test/debian:{DEBIAN_SUITE}"
    return BaseImage(name, push_image(docker_engine, image_id, name))


@pytest.fixture(scope="session")
def runtime_project(sdists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                    ) -> Path:
    """A project that builds the real 0.5.9 sdist as ``0.5.9+sm120.7``, with the repo's
    ``images/`` copied in; run the CLI in it with ``--cache-dir <it>/cache`` so the
    wheel is built once per session."""
    root = write_project(tmp_path_factory.mktemp("runtime") / "project", sdist=sdists["0.5.9"])
    shutil.copytree(REPO / "images", root / "images")
    # Its target is "t" (0.5.9): the launch profile of the real 0.5.9 target.
    shutil.copy(root / "images/profiles/sglang-0.5.9.toml", root / "images/profiles/t.toml")
    return root


@dataclass(frozen=True)
class LocalImage:
    """An image imported into the test engine."""

    name: str
    image_id: str


@pytest.fixture(scope="session")
def kernel_base_image(docker_engine: DockerEngine) -> LocalImage:
    """Debian bookworm minbase with python3, python3-venv and g++ (debootstrap, cached in
    .cache/tests/images), imported into ``docker_engine``."""
    tarball = debian_rootfs(TEST_CACHE / "images", ("python3", "python3-venv", "g++"))
    image_id = import_image(docker_engine, tarball, "sm120-test/debian-gxx", DEBIAN_SUITE)
    return LocalImage(f"sm120-test/debian-gxx:{DEBIAN_SUITE}", image_id)


# ---------------------------------------------------------------- tiers
# Every test is in exactly one tier: `fast` (the default a newcomer runs: no Docker Engine,
# no registry or Redis, no nvcc, no big downloads beyond the pinned sdists and wheels) or
# `slow` (the rest; CI runs both). The tier follows from the fixtures a test uses (the
# closure, so a fixture built on `docker_engine` counts too), from SLOW_TESTS for tests
# that start what they need in their own body, or from an explicit `@pytest.mark.slow`.
# Under `--dist loadgroup` (nox -s tests) each test also gets an `xdist_group`: the tests
# on the session's services share one worker (one dockerd, registry, index, Redis), the
# kernel build tests another (one build environment), every other file is its own group.
# docs/testing.md says how to run each tier.

SERVICES = "services"
# The kernel build tests share the builder cache's kernel entries with the sccache test
# (on Redis, a service), which empties them: one worker runs them all, never two at once.
KERNEL_ENV = SERVICES
# The behaviour matrix and the kernel fit share the behaviour environments and the fit's
# cache entries (cold: minutes each): one worker, not the services one (its critical path).
BEHAVIOUR = "behaviour"


@dataclass(frozen=True)
class Slow:
    """Why a test is slow, and the xdist group it runs in (None: its file's)."""

    reason: str
    group: str | None


#: Fixture -> why a test that uses it (directly or through another fixture) is slow.
#: The first that matches, in this order, decides the group.
SLOW_FIXTURES = {
    "docker_engine": Slow("starts a Docker Engine", SERVICES),
    "registry": Slow("starts a docker-registry", SERVICES),
    "package_index": Slow("starts a pypiserver", SERVICES),
    "redis_server": Slow("starts redis-server", SERVICES),
    "kernel_cache": Slow("builds FlashInfer kernels in a build environment of several GB",
                         KERNEL_ENV),
    "tilelang_nvcc": Slow("lowers TileLang kernels and compiles them with nvcc", BEHAVIOUR),
    "nvcc": Slow("compiles CUDA code with nvcc", SERVICES),
    "token_registry": Slow("starts a docker-registry and a token server", None),
    "installed": Slow("a venv with the 0.5.9 wheel and FlashInfer installed", None),
}

_BUILD_ENV = Slow("builds a FlashInfer build environment (torch, CUDA wheels)", KERNEL_ENV)

#: Test node id, or the file and the test's name before any parameters, or the file ->
#: why it is slow, for tests whose cost is in their own body.
SLOW_TESTS = {
    "tests/test_behaviour.py::test_every_sm12x_behaviour_fails_upstream_and_holds_patched":
        Slow("installs each current release's environment, runs its matrix and kernel fit",
             BEHAVIOUR),
    "tests/test_kernels_current.py::test_default_set_holds_every_module_flashinfers_sm120_paths_load":
        _BUILD_ENV,
    "tests/test_kernels_current.py::test_flashinfer_0_6_14_import_needs_a_gpu_the_driver_does_not":
        _BUILD_ENV,
    "tests/test_kernels_current.py::test_0_5_23_norm_host_mode_found_through_the_provider_contract":
        _BUILD_ENV,
    "tests/test_kernels_fast.py::test_the_driver_puts_fast_build_into_the_cuda_flags_too":
        _BUILD_ENV,
    "tests/test_journeys.py::test_publish_wheels_without_docker":
        Slow("starts two pypiservers", None),
    "tests/test_pin_images.py::test_htpasswd_registry_uses_docker_login_credentials":
        Slow("starts a docker-registry", None),
    # The slowest of the rest (45-100 s each on a loaded 2-core machine; docs/testing.md)
    "tests/test_patch_fuzz.py": Slow("hypothesis: hundreds of random patches", None),
    "tests/test_repack.py::test_installs_and_equals_upstream_but_the_patch":
        Slow("installs two wheels into fresh venvs", None),
    "tests/test_wheel.py::test_installed_wheel_reports_provenance_and_patched_line":
        Slow("installs the wheel into a fresh venv", None),
    "tests/test_workflows.py::test_the_plan_job_gives_every_target_to_every_per_target_job":
        Slow("runs the plan job's nox session", None),
    "tests/test_wheel.py": Slow("builds the 0.5.9 wheel from scratch four times", None),
    "tests/test_journeys.py::test_a_changed_series_under_the_same_label_is_refused_until_the_label_is_raised":
        Slow("builds three wheels", None),
    "tests/test_journeys.py::test_the_provenance_carries_each_patch_description_and_message":
        Slow("builds a wheel from scratch", None),
    "tests/test_docs.py::test_site_builds_with_no_warning": Slow("builds the site", None),
    "tests/test_docs.py::test_broken_link_and_reference_fail_the_build":
        Slow("builds the site twice", None),
}


def slow_reason(item: pytest.Item) -> Slow | None:
    """Why ``item`` belongs to the slow tier, or None when it is fast.

    Args:
        item: a collected test.

    Returns:
        The first reason found: a fixture of SLOW_FIXTURES, an entry of SLOW_TESTS, an
        explicit ``slow`` mark.
    """
    used = set(getattr(item, "fixturenames", ()))
    for name, slow in SLOW_FIXTURES.items():
        if name in used:
            return Slow(f"{name}: {slow.reason}", slow.group)
    for key in _slow_keys(item):
        if key in SLOW_TESTS:
            return SLOW_TESTS[key]
    if item.get_closest_marker("slow") is not None:
        return Slow("marked slow", None)
    return None


def _slow_keys(item: pytest.Item) -> tuple[str, str, str]:
    """The keys SLOW_TESTS may hold for ``item``: node id, file::name, file."""
    file, _, rest = item.nodeid.partition("::")
    return item.nodeid, f"{file}::{rest.partition('[')[0]}", file


class GroupsTakeEffect:
    """Stops the run when ``--dist loadgroup`` would ignore the groups set below.

    pytest-xdist 3.8 tells the controller a test's group by appending ``@GROUP`` to the
    node id, which pytest 9.2 no longer lets a plugin change (pytest-xdist issue #1386):
    the tests would then be spread one by one, and two kernel builds empty each other's
    cache entries. Every test gets a group under loadgroup, so every id must carry one.
    """

    def pytest_xdist_node_collection_finished(self, node: object, ids: list[str]) -> None:
        """Exit (status 4, a usage error) when a worker's test ids lack their group."""
        lost = [nodeid for nodeid in ids if nodeid.rfind("@") <= nodeid.rfind("]")]
        if lost:
            pytest.exit(f"--dist loadgroup ignores the xdist groups on pytest "
                        f"{pytest.__version__} (pytest-xdist issue #1386; {len(lost)} of "
                        f"{len(ids)} tests, e.g. {lost[0]}): install the test extra's pytest "
                        "(pip install -e '.[test]')", returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_sessionstart(session: pytest.Session) -> None:
    """On the controller, with pytest's own basetemp: delete the folders of finished earlier
    runs before this one fills the disk.

    pytest deletes them only at a run's end (``tmp_path_retention_count``), so a run would
    otherwise start beside its predecessors' folders (over 20 GB each with the image and
    kernel tests). A finished run is a ``pytest-N`` sibling of this run's basetemp without
    the ``.lock`` pytest holds while a run lives; a running one, or one killed before it
    could remove its lock, is left to pytest's own rule.
    """
    config = session.config
    factory = getattr(config, "_tmp_path_factory", None)
    if hasattr(config, "workerinput") or config.option.basetemp or factory is None:
        return
    current = factory.getbasetemp()
    for folder in current.parent.glob("pytest-*"):
        if folder != current and folder.name[len("pytest-"):].isdigit() \
                and folder.is_dir() and not folder.is_symlink() \
                and not (folder / ".lock").exists():
            shutil.rmtree(folder, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    """On the controller of ``--dist loadgroup``: check the groups take effect."""
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") == "loadgroup":
        config.pluginmanager.register(GroupsTakeEffect(), "groups-take-effect")


# tryfirst: xdist's own hook reads the xdist_group marks when it runs (it appends the group
# to the node id); after it, a mark added here would be ignored.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Put every test in exactly one tier (marks ``fast`` or ``slow``), and in its xdist
    group under ``--dist loadgroup``.

    Raises:
        pytest.UsageError: a test marked ``fast`` by hand that uses what makes it slow, or
            an entry of SLOW_TESTS that names no collected test (when the whole suite is
            collected), so the table cannot go stale.
    """
    # On an xdist worker `dist` reads "no" and `loadgroup` says what the controller was given.
    grouped = bool(getattr(config.option, "loadgroup", False)) or \
        getattr(config.option, "dist", "no") == "loadgroup"
    wrong = []
    used: set[str] = set()
    for item in items:
        slow = slow_reason(item)
        used.update(key for key in _slow_keys(item) if key in SLOW_TESTS)
        if slow is None:
            item.add_marker(pytest.mark.fast)
        elif item.get_closest_marker("fast") is not None:
            wrong.append(f"{item.nodeid} is marked fast but is slow ({slow.reason})")
        else:
            item.add_marker(pytest.mark.slow)
        if grouped:
            group = (slow and slow.group) or item.nodeid.partition("::")[0]
            item.add_marker(pytest.mark.xdist_group(group))
    here = config.invocation_params.dir
    whole_suite = all((here / arg).resolve() == REPO / "tests" for arg in config.args)
    if whole_suite and not config.getoption("keyword") and not config.getoption("lf", False):
        wrong += [f"SLOW_TESTS names {key}, which is no collected test"
                  for key in SLOW_TESTS if key not in used]
    if wrong:
        raise pytest.UsageError("tiers (tests/conftest.py):\n  " + "\n  ".join(wrong))
