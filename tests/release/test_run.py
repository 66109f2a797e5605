"""Release on real services: build -> image -> smoke -> publish to a real registry and a
real index, end to end, and every fault the issue names, each through the CLI as a user
runs it (one clear message, a non-zero exit, a summary of what was and was not
published)."""

from __future__ import annotations

import json
import os
import subprocess
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

from builder import Options
from builder.core.errors import BuilderError
from builder.image.build import LABEL_NS, BaseImage
from builder.image.run import ImageOptions, run_image
from builder.release.publish import Index
from builder.release.run import GateResult, ReleaseSummary, run_release
from builder.smoke.static import static_smoke
from tests.helpers.cli import release_refused_before_any_work, run_cli
from tests.helpers.services import (
    DockerEngine,
    PackageIndex,
    Registry,
    dead_index,
    dead_registry,
    push_image,
    start_body_limit_proxy,
    start_docker_engine,
    start_package_index,
    start_registry,
)

VERSION = "0.5.9+sm120.7"
WHEEL = f"sglang-{VERSION}-py3-none-any.whl"
TAG = "0.5.9-sm120.7"
KERNEL = "flashinfer_jit_cache-0.6.3+sm120.7-py3-none-any.whl"


def kernel_wheel(folder: Path, groups: tuple[str, ...] | None = None,
                 name: str = KERNEL) -> Path:
    """A wheel of the kernel stage's shape: flashinfer_jit_cache with its manifest, of the
    target's own module set for 12.0a (``groups``: another set, a trial build)."""
    from builder.kernels.build import DEFAULT_HEAD_DIMS
    from builder.kernels.pins import default_groups

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    groups = groups or default_groups(("12.0a",))
    manifest = {"target": "t", "flashinfer_version": "0.6.3", "arch_list": ["12.0a"],
                "cuda_version": "12.9",
                "nvcc_version": "12.9.86", "flags_sha256": "0" * 64, "modules": [],
                "groups": list(groups),
                "head_dims": list(DEFAULT_HEAD_DIMS) if "attention" in groups else []}
    with WheelFile(path, "w") as whl:
        whl.writestr("flashinfer_jit_cache/__init__.py", "")
        whl.writestr("flashinfer_jit_cache/sm120-manifest.json", json.dumps(manifest))
        version = name.split("-")[1]
        info = f"flashinfer_jit_cache-{version}.dist-info"
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: flashinfer-jit-cache\n"
                                         f"Version: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                      "Root-Is-Purelib: true\nTag: py3-none-any\n")
    return path


def release(project: Path, engine: DockerEngine, registry: str, index: str,
            base: BaseImage, *extra: str, env: dict[str, str] | None = None,
            repository: str = "sglang-sm120") -> subprocess.CompletedProcess[str]:
    """``python -m builder release image --json`` in ``project``."""
    return run_cli("release", "image", "--json", "--gate", "static", "--cache-dir",
                   str(project / "cache"),
                   "--registry", registry, "--repository", repository,
                   "--base-image", base.reference, "--repository-url", index, *extra,
                   cwd=project, env={**engine.env, **(env or {})})


def outcome(done: subprocess.CompletedProcess[str]) -> dict:
    """The JSON the CLI printed (a summary, or an error with the summary as report)."""
    return json.loads(done.stdout)


def published(summary: dict) -> dict[str, str]:
    """name -> status of what a summary lists as published."""
    return {p["name"]: p["status"] for p in summary["published"]}


def not_published(summary: dict) -> list[str]:
    """names a summary lists as not published."""
    return [item["artifact"] for item in summary["not_published"]]


def index_files(index: PackageIndex) -> list[str]:
    """The files the index holds (its folder)."""
    return sorted(p.name for p in index.packages.iterdir())


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def second_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerEngine]:
    """Another engine on this machine: a user's, pulling what was published."""
    engine = start_docker_engine(tmp_path_factory.mktemp("docker2"))
    yield engine
    engine.stop()


@pytest.mark.slow(reason="starts a Docker Engine")
def test_release_end_to_end(runtime_project: Path, docker_engine: DockerEngine,
                            registry: Registry, package_index: PackageIndex,
                            debian_base_image: BaseImage, second_engine: DockerEngine,
                            tmp_path: Path) -> None:
    kernel = kernel_wheel(tmp_path / "kernels")
    done = release(runtime_project, docker_engine, registry.host, package_index.url,
                   debian_base_image, "--kernel-wheel", str(kernel),
                   env=package_index.env())
    assert done.returncode == 0, done.stdout + done.stderr
    summary = outcome(done)
    reference = f"{registry.host}/sglang-sm120:{TAG}"
    assert published(summary) == {WHEEL: "published", KERNEL: "published",
                                  reference: "published"}
    assert summary["not_published"] == []
    assert summary["gate"]["name"] == "static" and summary["gate"]["passed"]
    assert index_files(package_index) == sorted([WHEEL, KERNEL])
    [image] = [p for p in summary["published"] if p["kind"] == "image"]
    labels = summary["image"]["labels"]
    assert labels[f"{LABEL_NS}.kernel.arch-list"] == "12.0a"
    assert package_index.credentials[1] not in done.stdout + done.stderr

    # A user's engine pulls the image back by digest; the static smoke passes in it.
    pulled = f"{registry.host}/sglang-sm120@{image['digest']}"
    for _ in second_engine.api.pull(pulled, stream=True, decode=True):
        pass
    pulled_info = second_engine.api.inspect_image(pulled)
    assert pulled_info["Id"] == summary["image"]["image_id"]
    assert pulled_info["Config"]["Labels"] == labels
    rebuilt = run_release_image(runtime_project, docker_engine, registry, debian_base_image,
                                kernel)
    report = static_smoke(second_engine.client, rebuilt, reference=pulled)
    assert report.passed, report.to_json()
    assert report.installed["flashinfer-jit-cache"]["version"] == "0.6.3+sm120.7"
    assert report.lines[0].found.strip() == '"flashinfer_cutlass",'

    # A user pins the wheel from the index into a fresh venv.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin/python"
    install = subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "--index-url",
         package_index.simple_url, f"sglang=={VERSION}"], capture_output=True, text=True,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull}, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    probe = subprocess.run(
        [python, "-c", "import importlib.metadata as m, json; d = m.distribution('sglang'); "
                       "print(d.version, json.loads(d.read_text('sm120-provenance.json'))"
                       "['patches'][0]['status'])"],
        capture_output=True, text=True, check=True)
    assert probe.stdout.split() == [VERSION, "applied"]

    # Re-running the release neither fails nor overwrites.
    again = release(runtime_project, docker_engine, registry.host, package_index.url,
                    debian_base_image, "--kernel-wheel", str(kernel),
                    env=package_index.env())
    assert again.returncode == 0, again.stdout + again.stderr
    summary = outcome(again)
    assert published(summary) == {WHEEL: "already-published", KERNEL: "already-published",
                                  reference: "already-published"}
    assert [p["digest"] for p in summary["published"] if p["kind"] == "image"] == \
        [image["digest"]]


def run_release_image(project: Path, engine: DockerEngine, registry: Registry,
                      base: BaseImage, kernel: Path):
    """The ImageResult of the released image (rebuilt from the build cache)."""
    return run_image(Options(targets_file=project / "targets.toml",
                             cache_dir=project / "cache", dist_dir=project / "dist"),
                     ImageOptions(registry=registry.host, base_image=base.reference,
                                  pins_file=project / "images/pins.toml",
                                  dockerfile=project / "images/Dockerfile",
                                  profiles_dir=project / "images/profiles",
                                  kernel_wheels=(kernel,)),
                     engine.client)


# ---------------------------------------------------------------- faults


@pytest.fixture
def fresh_index(tmp_path: Path) -> Iterator[PackageIndex]:
    """An empty index of its own (uploads need ``.env()``'s credentials)."""
    index = start_package_index(tmp_path / "index", credentials=("uploader", "pass-4"))
    yield index
    index.stop()


@pytest.fixture
def fresh_registry(tmp_path: Path) -> Iterator[Registry]:
    """An empty registry of its own."""
    started = start_registry(tmp_path / "registry")
    yield started
    started.stop()


def assert_failed(done: subprocess.CompletedProcess[str], message: str) -> dict:
    """A typed refusal (its exit status is its kind's) with ``message`` in the one error line;
    return the summary it carries."""
    error = outcome(done)
    assert done.returncode == error["exit_status"] and error["kind"] != "error", \
        done.stdout + done.stderr  # a subclass's kind, not the base's
    assert message in error["error"], error
    assert "Traceback" not in done.stderr
    return error["report"]


@pytest.mark.slow(reason="starts a Docker Engine")
def test_registry_down(runtime_project: Path, docker_engine: DockerEngine,
                       fresh_index: PackageIndex, debian_base_image: BaseImage) -> None:
    down = dead_registry()
    summary = assert_failed(release(runtime_project, docker_engine, down.host, fresh_index.url,
                                    debian_base_image, env=fresh_index.env()),
                            f"the registry {down.host} is not reachable")
    assert summary["published"] == []
    assert not_published(summary) == [WHEEL, f"{down.host}/sglang-sm120:{TAG}"]
    assert index_files(fresh_index) == []  # checked before anything was published


@pytest.mark.slow(reason="starts a Docker Engine")
def test_registry_wrong_credentials(runtime_project: Path, docker_engine: DockerEngine,
                                    fresh_index: PackageIndex, debian_base_image: BaseImage,
                                    tmp_path: Path) -> None:
    guarded = start_registry(tmp_path / "guarded", credentials=("pusher", "right-pass-1"))
    try:
        done = release(runtime_project, docker_engine, guarded.host, fresh_index.url,
                       debian_base_image, env={"SGLANG_SM120_REGISTRY_USERNAME": "pusher",
                                               "SGLANG_SM120_REGISTRY_PASSWORD": "wrong-pass-2"})
    finally:
        guarded.stop()
    summary = assert_failed(done, f"the registry {guarded.host} refused the credentials")
    assert summary["published"] == [] and index_files(fresh_index) == []
    assert "wrong-pass-2" not in done.stdout + done.stderr


@pytest.mark.slow(reason="starts a Docker Engine")
def test_index_wrong_credentials(runtime_project: Path, docker_engine: DockerEngine,
                                 fresh_registry: Registry, debian_base_image: BaseImage,
                                 tmp_path: Path) -> None:
    guarded = start_package_index(tmp_path / "guarded", credentials=("sm120", "right-pass-3"))
    try:
        done = release(runtime_project, docker_engine, fresh_registry.host, guarded.url,
                       debian_base_image,
                       env={"TWINE_USERNAME": "sm120", "TWINE_PASSWORD": "not-the-password"})
        assert index_files(guarded) == []
    finally:
        guarded.stop()
    summary = assert_failed(done, f"the index {guarded.url} rejected {WHEEL}: ")
    assert "403" in outcome(done)["error"]
    assert "refused the credentials" in outcome(done)["hint"]
    assert "not-the-password" not in done.stdout + done.stderr
    assert summary["published"] == []
    assert not_published(summary) == [WHEEL, f"{fresh_registry.host}/sglang-sm120:{TAG}"]


@pytest.mark.slow(reason="starts a Docker Engine")
def test_push_rejected_mid_stream(runtime_project: Path, docker_engine: DockerEngine,
                                  fresh_index: PackageIndex, debian_base_image: BaseImage,
                                  tmp_path: Path) -> None:
    read_only = start_registry(tmp_path / "read-only", read_only=True)
    try:
        done = release(runtime_project, docker_engine, read_only.host, fresh_index.url,
                       debian_base_image, env=fresh_index.env())
    finally:
        read_only.stop()
    summary = assert_failed(done, "push failed: ")
    assert "405" in outcome(done)["error"]
    # The wheel went first and is listed as published; the image is not.
    assert published(summary) == {WHEEL: "published"}
    assert not_published(summary) == [f"{read_only.host}/sglang-sm120:{TAG}"]
    assert index_files(fresh_index) == [WHEEL]


@pytest.mark.slow(reason="starts a Docker Engine")
def test_tag_exists_with_another_digest(runtime_project: Path, docker_engine: DockerEngine,
                                        fresh_registry: Registry, fresh_index: PackageIndex,
                                        debian_base_image: BaseImage) -> None:
    taken = f"{fresh_registry.host}/sglang-sm120:{TAG}"
    other = push_image(docker_engine, debian_base_image.reference, taken)
    summary = assert_failed(release(runtime_project, docker_engine, fresh_registry.host,
                                    fresh_index.url, debian_base_image, env=fresh_index.env()),
                            f"the tag {taken} already exists with digest {other}")
    assert summary["published"] == [] and index_files(fresh_index) == []
    assert docker_engine.api.inspect_distribution(taken)["Descriptor"]["digest"] == other


@pytest.mark.slow(reason="starts a Docker Engine")
def test_index_down(runtime_project: Path, docker_engine: DockerEngine,
                    fresh_registry: Registry, debian_base_image: BaseImage) -> None:
    down = dead_index()
    summary = assert_failed(release(runtime_project, docker_engine, fresh_registry.host,
                                    down.url, debian_base_image),
                            f"the package index {down.simple_url} is not reachable")
    assert summary["published"] == []


@pytest.mark.slow(reason="starts a Docker Engine")
def test_index_rejects_the_upload(runtime_project: Path, docker_engine: DockerEngine,
                                  fresh_registry: Registry, fresh_index: PackageIndex,
                                  debian_base_image: BaseImage) -> None:
    proxy = start_body_limit_proxy(fresh_index.url, limit=1_000_000)
    try:
        done = release(runtime_project, docker_engine, fresh_registry.host, proxy.url,
                       debian_base_image, env=fresh_index.env())
    finally:
        proxy.stop()
    summary = assert_failed(done, f"the index {proxy.url} rejected {WHEEL}: ")
    assert "413" in outcome(done)["error"]
    assert proxy.refused == ["/"]
    assert summary["published"] == [] and index_files(fresh_index) == []
    assert f"{fresh_registry.host}/sglang-sm120:{TAG}" in not_published(summary)


@pytest.mark.slow(reason="starts a Docker Engine")
def test_same_name_other_bytes(runtime_project: Path, docker_engine: DockerEngine,
                               fresh_registry: Registry, fresh_index: PackageIndex,
                               debian_base_image: BaseImage) -> None:
    ours = (runtime_project / "dist" / WHEEL)
    if not ours.exists():  # built by the other tests of this module when run together
        pytest.fail("run the module whole: the wheel is built by the first release")
    (fresh_index.packages / WHEEL).write_bytes(ours.read_bytes() + b"\0")
    summary = assert_failed(release(runtime_project, docker_engine, fresh_registry.host,
                                    fresh_index.url, debian_base_image, env=fresh_index.env()),
                            f"the index already has {WHEEL} with other bytes")
    assert summary["published"] == []
    assert (fresh_index.packages / WHEEL).read_bytes() == ours.read_bytes() + b"\0"


@pytest.mark.slow(reason="starts a Docker Engine")
def test_missing_base_image(runtime_project: Path, docker_engine: DockerEngine,
                            fresh_registry: Registry, fresh_index: PackageIndex) -> None:
    missing = BaseImage(f"{fresh_registry.host}/sm120-test/gone:bookworm", "sha256:" + "1" * 64)
    summary = assert_failed(release(runtime_project, docker_engine, fresh_registry.host,
                                    fresh_index.url, missing, env=fresh_index.env()),
                            f"base image {missing.reference} is missing")
    assert summary["published"] == []
    assert summary["not_published"]


@pytest.mark.slow(reason="starts a Docker Engine")
def test_a_failing_smoke_gate_publishes_nothing(runtime_project: Path,
                                                docker_engine: DockerEngine,
                                                fresh_registry: Registry,
                                                fresh_index: PackageIndex,
                                                debian_base_image: BaseImage) -> None:
    def gate_on_base(client, image) -> GateResult:
        # The real static smoke, run on the base image, which lacks our wheel.
        report = static_smoke(client, image, reference=debian_base_image.reference)
        return GateResult("static", report.passed, (), report.to_json())

    with pytest.raises(BuilderError, match="the static smoke gate failed: sglang version: "
                                           "not installed") as caught:
        run_release(Options(targets_file=runtime_project / "targets.toml",
                            cache_dir=runtime_project / "cache",
                            dist_dir=runtime_project / "dist"),
                    ImageOptions(registry=fresh_registry.host,
                                 base_image=debian_base_image.reference,
                                 pins_file=runtime_project / "images/pins.toml",
                                 dockerfile=runtime_project / "images/Dockerfile",
                                 profiles_dir=runtime_project / "images/profiles"),
                    Index.from_urls(fresh_index.url), gate=gate_on_base,
                    client=docker_engine.client)
    summary = caught.value.report
    assert isinstance(summary, ReleaseSummary)
    assert summary.published == []
    assert [a for a, _ in summary.not_published] == [WHEEL,
                                                     f"{fresh_registry.host}/sglang-sm120:{TAG}"]
    assert index_files(fresh_index) == []
    with pytest.raises(Exception, match="manifest unknown"):
        docker_engine.api.inspect_distribution(f"{fresh_registry.host}/sglang-sm120:{TAG}")


@pytest.mark.slow(reason="starts a Docker Engine")
def test_release_on_a_runner_without_gpu_publishes_nothing(runtime_project: Path,
                                                           docker_engine: DockerEngine,
                                                           fresh_registry: Registry,
                                                           fresh_index: PackageIndex,
                                                           debian_base_image: BaseImage
                                                           ) -> None:
    """The default gate is the smoke test on the runner's GPU: this engine has no NVIDIA
    runtime, so the smoke test fails (a misconfigured runner) and nothing is published."""
    done = run_cli("release", "image", "--json", "--cache-dir", str(runtime_project / "cache"),
                   "--registry", fresh_registry.host, "--base-image",
                   debian_base_image.reference, "--repository-url", fresh_index.url,
                   cwd=runtime_project, env={**docker_engine.env, **fresh_index.env()})
    assert done.returncode == 7, done.stdout + done.stderr  # the gate stays shut
    error = outcome(done)
    assert error["error"].startswith("the gpu smoke gate failed: runner: misconfigured runner")
    summary = error["report"]
    assert summary["published"] == [] and summary["gate"]["name"] == "gpu"
    assert summary["gate"]["report"]["misconfigured_runner"] is True
    assert index_files(fresh_index) == []
    with pytest.raises(Exception, match="manifest unknown"):
        docker_engine.api.inspect_distribution(f"{fresh_registry.host}/sglang-sm120:{TAG}")


def test_an_image_release_with_a_trial_kernel_wheel_is_refused_before_any_work(
        tmp_path: Path) -> None:
    """A ``kernels --modules norm`` wheel carries the target's version but not its kernels:
    the image release refuses it before any engine, registry or index is reached (none
    listens on these ports) and before anything is built or written."""
    wheel = kernel_wheel(tmp_path / "kernels", groups=("norm",),
                         name="flashinfer_jit_cache-0.6.3+sm120.1-py3-none-any.whl")
    done = release_refused_before_any_work(tmp_path, wheel)
    assert f"{wheel.name} is a trial build of sglang-0.5.9" in done.stderr
    assert "module groups norm" in done.stderr
