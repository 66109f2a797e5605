"""Shared fixtures: real SGLang sdists from PyPI (pinned by sha256, cached between runs),
a local git repository built from those releases, the real services, and the tiers. What
tests import lives in tests/helpers/; no test imports this file."""

from __future__ import annotations

import shutil
import socket
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import git
import pytest
from helpers.paths import REPO, TEST_CACHE
from helpers.project import write_project
from helpers.releases import MATRIX_RELEASES, RELEASES, UpstreamRelease, UpstreamRepo, download
from helpers.services import (
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

from builder.image.build import BaseImage

# Fixtures defined beside their helpers: the add-target tests' index and project
# (helpers/index.py) and a registry serving hostile answers (helpers/registry.py).
pytest_plugins = ["helpers.index", "helpers.registry"]


@pytest.fixture(scope="session")
def sdists() -> dict[str, Path]:
    """version -> path of the verified real sdist."""
    return {version: download(release) for version, release in RELEASES.items()}


@pytest.fixture(scope="session")
def matrix_files() -> dict[str, Path]:
    """version -> path of the verified real file (sdist or wheel) of a later release."""
    return {version: download(release) for version, release in MATRIX_RELEASES.items()}


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
    shutil.copytree(REPO / "images", root / "images")
    # Its target is "t" (0.5.9): the launch profile of the real 0.5.9 target.
    shutil.copy(root / "images/profiles/sglang-0.5.9.toml", root / "images/profiles/t.toml")
    return root


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
