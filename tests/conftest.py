"""Shared fixtures: real SGLang sdists from PyPI (pinned by sha256, cached between runs),
a local git repository built from those releases, the real services, and the tiers. What
tests import lives in tests/helpers/; no test imports this file."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import git
import pytest

from builder.image.build import BaseImage
from tests.helpers.paths import REPO, TEST_CACHE
from tests.helpers.project import with_images, write_project
from tests.helpers.releases import (
    MATRIX_RELEASES,
    RELEASES,
    UpstreamRelease,
    UpstreamRepo,
    download,
)
from tests.helpers.services import (
    DEBIAN_SUITE,
    DockerEngine,
    LocalImage,
    PackageIndex,
    Process,
    Registry,
    debian_rootfs,
    import_image,
    need,
    push_image,
    start_docker_engine,
    start_package_index,
    start_registry,
)

# The tiers' plugin (tests/helpers/tiers.py), and fixtures defined beside their helpers:
# the add-target tests' index and project (helpers/index.py) and a registry serving hostile
# answers (helpers/registry.py).
pytest_plugins = ["tests.helpers.index", "tests.helpers.registry", "tests.helpers.tiers"]


@pytest.fixture(scope="session")
def sdists() -> dict[str, Path]:
    """version -> path of the verified real sdist."""
    return {version: download(release) for version, release in RELEASES.items()}


@pytest.fixture(scope="session")
def matrix_files() -> dict[str, Path]:
    """version -> path of the verified real file (sdist or wheel) of a later release."""
    return {version: download(release) for version, release in MATRIX_RELEASES.items()}


def built_once(factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], None]) -> Path:
    """``name``, a folder of the run's temporary folder that ``build`` fills once per run.

    Under xdist the workers share it (pytest-xdist's recipe "Making session-scoped
    fixtures execute only once"): the first to ask builds it under a lock, the others wait
    and use it. Each worker built its own before: the unpacked sdists and the git
    repository cost about 8 s each, twice a run.

    Args:
        factory: pytest's ``tmp_path_factory``.
        name: the folder's name.
        build: fills the (empty) folder it is given.

    Returns:
        The built folder.
    """
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's basetemp; each worker's is a folder in it
    folder = root / name
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".built").is_file():  # a build cut short is made again
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


@pytest.fixture(scope="session")
def unpacked(sdists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Path]:
    """version -> an unpacked copy of the sdist (sdist layout), read-only: the workers of
    a run share it."""
    def build(root: Path) -> None:
        for archive in sdists.values():
            with tarfile.open(archive) as tar:
                tar.extractall(root, filter="data")

    root = built_once(tmp_path_factory, "unpacked", build)
    return {version: root / f"sglang-{version}" for version in sdists}


@pytest.fixture(scope="session")
def upstream_repo(unpacked: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                  ) -> UpstreamRepo:
    """A real git repository whose python/ folder holds each release in turn; read-only
    (the workers of a run share it): a test that commits works on a clone."""
    def build(root: Path) -> None:
        path = root / "sglang"
        repo = git.Repo.init(path, initial_branch="main")
        commits = {}
        with repo.config_writer() as config:
            config.set_value("user", "name", "test").set_value("user", "email",
                                                               "t@example.invalid")
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
        (root / "commits.json").write_text(json.dumps(commits))

    root = built_once(tmp_path_factory, "upstream", build)
    return UpstreamRepo(root / "sglang", json.loads((root / "commits.json").read_text()))


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
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Redis (Debian's redis-server) on 127.0.0.1, no persistence."""
    binary = need("redis-server", "redis-server")
    root = tmp_path_factory.mktemp("redis")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = Process.start("redis", [binary, "--bind", "127.0.0.1", "--port", str(port),
                                      "--save", "", "--appendonly", "no", "--dir", str(root)],
                            root / "redis.log")

    def ready() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")

    process.wait_until(ready, timeout=30)
    yield f"redis://127.0.0.1:{port}"
    process.stop()


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
    with_images(root)
    return root


@pytest.fixture(scope="session")
def kernel_base_image(docker_engine: DockerEngine) -> LocalImage:
    """Debian bookworm minbase with python3, python3-venv and g++ (debootstrap, cached in
    .cache/tests/images), imported into ``docker_engine``."""
    tarball = debian_rootfs(TEST_CACHE / "images", ("python3", "python3-venv", "g++"))
    image_id = import_image(docker_engine, tarball, "sm120-test/debian-gxx", DEBIAN_SUITE)
    return LocalImage(f"sm120-test/debian-gxx:{DEBIAN_SUITE}", image_id)


# ---------------------------------------------------------------- basetemps


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
