"""``pin-images`` against real registries on 127.0.0.1 (Debian's docker-registry):
without authentication, with htpasswd, with token authentication (a small token service
here), a multi-platform index pushed with the registry's API, a tag that moved, a tag
that does not exist, and a registry that is down. Images are pushed with the registry's
own API (tests/helpers/services.py), so no engine is needed."""

from __future__ import annotations

import base64
import datetime
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.core.basepins import load_base_pins
from builder.kernels.container import DEFAULT_BASES
from builder.targets.gaps import upstream_base_name
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.services import (
    Registry,
    TokenServer,
    dead_registry,
    push_manifest,
    push_synthetic_image,
    start_registry,
    start_token_server,
)
from tests.helpers.targets import current_targets, targets

HEADER = "# Pins for the test: this comment must survive pin-images.\n"
INDEX = "application/vnd.oci.image.index.v1+json"


def pins_text(base: str, kernel: str) -> str:
    return (HEADER + f'\n[[base]]\nupstream_version = "0.5.9"\ncuda_lane = "12.9"\n'
            f'name = "{base}"  # the runtime base\ndigest = ""\n\n'
            f'# the kernel build base\n[[kernel_base]]\ncuda_lane = "12.9"\n'
            f'name = "{kernel}"\ndigest = ""\n')


def pin(pins: Path, *args: str, env: dict[str, str] | None = None):
    return run_cli("pin-images", "--pins-file", str(pins), *args, env=env)


@pytest.fixture
def docker_config(tmp_path: Path) -> Iterator[Path]:
    """An empty Docker configuration folder (no ``docker login`` of the user leaks in)."""
    folder = tmp_path / "docker-config"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    yield folder


def login(folder: Path, registry: str, user: str, password: str) -> None:
    """Write what ``docker login`` writes (``auths`` with base64 ``user:password``)."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {registry: {"auth": auth}}}))


@pytest.mark.slow(reason="starts a docker-registry")
def test_plain_registry_pins_both_kinds_and_keeps_comments(
        registry: Registry, tmp_path: Path, docker_config: Path) -> None:
    base, _ = push_synthetic_image(registry.host, "pin/plain", "v1", content="base")
    kernel, _ = push_synthetic_image(registry.host, "pin/kernel", "12.9", content="kernel")
    pins = tmp_path / "pins.toml"
    pins.write_text(pins_text(f"{registry.host}/pin/plain:v1", f"{registry.host}/pin/kernel:12.9"))
    done = pin(pins, "--json", env={"DOCKER_CONFIG": str(docker_config)})
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["written"] and [p["status"] for p in report["pins"]] == ["resolved"] * 2
    data = tomllib.loads(pins.read_text())
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    assert data["base"][0] | {"digest": base} == {
        "upstream_version": "0.5.9", "cuda_lane": "12.9", "name": f"{registry.host}/pin/plain:v1",
        "digest": base, "index_digest": "", "platform": "linux/amd64", "resolved": today}
    assert data["base"][0]["digest"] == base
    assert data["kernel_base"][0]["digest"] == kernel
    text = pins.read_text()
    assert text.startswith(HEADER) and "# the runtime base" in text \
        and "# the kernel build base" in text
    loaded = load_base_pins(pins)
    assert loaded.kernel_base("12.9").reference == f"{registry.host}/pin/kernel:12.9@{kernel}"
    # Nothing moved: --check passes and the file stays byte for byte.
    before = pins.read_bytes()
    check = pin(pins, "--verify", env={"DOCKER_CONFIG": str(docker_config)})
    assert check.returncode == 0, check.stdout + check.stderr
    assert "unchanged" in check.stdout and pins.read_bytes() == before


@pytest.mark.slow(reason="starts a docker-registry")
def test_multi_platform_index_records_index_and_amd64_manifest(
        registry: Registry, tmp_path: Path, docker_config: Path) -> None:
    amd64 = push_synthetic_image(registry.host, "pin/multi", "amd64-only", content="x86")
    arm64 = push_synthetic_image(registry.host, "pin/multi", "arm64-only",
                                 architecture="arm64", content="arm")
    index, _ = push_manifest(registry.host, "pin/multi", "v2", {
        "schemaVersion": 2, "mediaType": INDEX, "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": arm64[0],
             "size": arm64[1], "platform": {"os": "linux", "architecture": "arm64"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": amd64[0],
             "size": amd64[1], "platform": {"os": "linux", "architecture": "amd64"}}]})
    pins = tmp_path / "pins.toml"
    pins.write_text(pins_text(f"{registry.host}/pin/multi:v2",
                              f"{registry.host}/pin/multi:amd64-only"))
    done = pin(pins, env={"DOCKER_CONFIG": str(docker_config)})
    assert done.returncode == 0, done.stdout + done.stderr
    entry = tomllib.loads(pins.read_text())["base"][0]
    assert (entry["digest"], entry["index_digest"], entry["platform"]) == \
        (amd64[0], index, "linux/amd64")
    # An index without the platform asked for is refused, nothing written.
    before = pins.read_bytes()
    done = pin(pins, "--platform", "linux/s390x", env={"DOCKER_CONFIG": str(docker_config)})
    assert done.returncode == 4
    assert "multi-platform image without linux/s390x (it has linux/amd64, linux/arm64)" in \
        " ".join(done.stderr.split())
    assert pins.read_bytes() == before


@pytest.mark.slow(reason="starts a docker-registry")
def test_moved_tag_is_reported_by_check_then_repinned(
        registry: Registry, tmp_path: Path, docker_config: Path) -> None:
    env = {"DOCKER_CONFIG": str(docker_config)}
    first, _ = push_synthetic_image(registry.host, "pin/moving", "v1", content="one")
    push_synthetic_image(registry.host, "pin/moving", "kernel", content="k")
    pins = tmp_path / "pins.toml"
    pins.write_text(pins_text(f"{registry.host}/pin/moving:v1",
                              f"{registry.host}/pin/moving:kernel"))
    assert pin(pins, env=env).returncode == 0
    second, _ = push_synthetic_image(registry.host, "pin/moving", "v1", content="two")
    assert second != first
    before = pins.read_bytes()
    check = pin(pins, "--verify", "--json", env=env)
    assert check.returncode == 1
    error = json.loads(check.stdout)
    assert error["error"] == ("1 base image pin(s) no longer match their tag: "
                              f"{registry.host}/pin/moving:v1 (moved)")
    moved = [p for p in error["report"]["pins"] if p["status"] == "moved"]
    assert [(p["pinned_digest"], p["digest"]) for p in moved] == [(first, second)]
    assert pins.read_bytes() == before  # --check writes nothing
    done = pin(pins, env=env)
    assert done.returncode == 0 and "moved" in done.stdout
    assert tomllib.loads(pins.read_text())["base"][0]["digest"] == second


@pytest.mark.slow(reason="starts a docker-registry")
def test_missing_tag_is_one_clear_error_and_the_others_written(
        registry: Registry, tmp_path: Path, docker_config: Path) -> None:
    push_synthetic_image(registry.host, "pin/exists", "v1", content="e")
    pins = tmp_path / "pins.toml"
    # The first entry resolves; the second does not: the first is written, the second
    # keeps its (empty) pin and is named.
    pins.write_text(pins_text(f"{registry.host}/pin/exists:v1",
                              f"{registry.host}/pin/exists:no-such-tag"))
    done = pin(pins, env={"DOCKER_CONFIG": str(docker_config)})
    assert done.returncode == 4
    message = " ".join(done.stderr.split())
    assert (f"source error: the kernel build base for CUDA 12.9: {registry.host}/pin/exists:"
            "no-such-tag does not exist in its registry (HTTP 404)") in message
    assert f"the 1 other entry resolved and was written to {pins}" in message
    assert "Traceback" not in done.stderr
    data = tomllib.loads(pins.read_text())
    assert data["base"][0]["digest"].startswith("sha256:")
    assert data["kernel_base"][0]["digest"] == ""


def test_registry_down_is_one_clear_error(tmp_path: Path, docker_config: Path) -> None:
    down = dead_registry()
    pins = tmp_path / "pins.toml"
    pins.write_text(pins_text(f"{down.host}/pin/x:v1", f"{down.host}/pin/y:v1"))
    before = pins.read_bytes()
    done = pin(pins, env={"DOCKER_CONFIG": str(docker_config)})
    assert done.returncode == 4
    assert f"registry {down.host} is not reachable" in " ".join(done.stderr.split())
    assert pins.read_bytes() == before and "Traceback" not in done.stderr


@pytest.mark.slow(reason="starts a docker-registry")
def test_htpasswd_registry_uses_docker_login_credentials(
        tmp_path: Path, docker_config: Path) -> None:
    secured = start_registry(tmp_path / "registry", credentials=("puller", "pull-secret-2"))
    try:
        basic = {"Authorization": "Basic " + base64.b64encode(b"puller:pull-secret-2").decode()}
        digest, _ = push_synthetic_image(secured.host, "pin/auth", "v1", headers=basic)
        pins = tmp_path / "pins.toml"
        pins.write_text(pins_text(f"{secured.host}/pin/auth:v1", f"{secured.host}/pin/auth:v1"))
        before = pins.read_bytes()
        env = {"DOCKER_CONFIG": str(docker_config)}
        anonymous = pin(pins, env=env)
        assert anonymous.returncode == 4
        assert f"registry {secured.host} needs a login" in " ".join(anonymous.stderr.split())
        assert f"docker login {secured.host}" in anonymous.stderr
        login(docker_config, secured.host, "puller", "wrong")
        wrong = pin(pins, env=env)
        assert wrong.returncode == 4
        assert f"registry {secured.host} refused user 'puller' access to {secured.host}/" \
            "pin/auth:v1 (HTTP 401)" in " ".join(wrong.stderr.split())
        assert pins.read_bytes() == before
        login(docker_config, secured.host, "puller", "pull-secret-2")
        done = pin(pins, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert tomllib.loads(pins.read_text())["base"][0]["digest"] == digest
    finally:
        secured.stop()


@pytest.fixture
def token_registry(tmp_path: Path) -> Iterator[tuple[Registry, TokenServer]]:
    tokens = start_token_server(tmp_path / "tokens", ("tokenuser", "token-secret-3"))
    secured = start_registry(tmp_path / "registry", token=tokens)
    yield secured, tokens
    secured.stop()
    tokens.stop()


@pytest.mark.slow(reason="starts a docker-registry and a token server")
def test_token_registry_bearer_flow(token_registry: tuple[Registry, TokenServer],
                                    tmp_path: Path, docker_config: Path) -> None:
    secured, tokens = token_registry
    bearer = {"Authorization": "Bearer " + tokens.token("repository:pin/token:push,pull")}
    digest, _ = push_synthetic_image(secured.host, "pin/token", "v1", headers=bearer)
    pins = tmp_path / "pins.toml"
    pins.write_text(pins_text(f"{secured.host}/pin/token:v1", f"{secured.host}/pin/token:v1"))
    before = pins.read_bytes()
    env = {"DOCKER_CONFIG": str(docker_config)}
    anonymous = pin(pins, env=env)
    assert anonymous.returncode == 4
    assert f"the token service of {secured.host} refused anonymous pull (HTTP 401)" in \
        " ".join(anonymous.stderr.split())
    assert pins.read_bytes() == before
    login(docker_config, secured.host, "tokenuser", "token-secret-3")
    done = pin(pins, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert tomllib.loads(pins.read_text())["base"][0]["digest"] == digest
    # The registry's challenge named the scope; the client asked for exactly it.
    assert ("tokenuser", "repository:pin/token:pull") in tokens.requests


def test_repository_pins_name_every_default_kernel_base() -> None:
    pins = load_base_pins(REPO / "images/pins.toml")
    assert {lane: pins.kernel_base(lane).name for lane in DEFAULT_BASES} == DEFAULT_BASES
    # the current targets' bases (from targets.toml), as add-target writes them
    current = [targets().get(n) for n in current_targets()]
    names = [p.name for p in pins.runtime()]  # add-target appends: file order
    assert names[0] == "docker.io/lmsysorg/sglang:v0.5.9-cu129-amd64-runtime"
    assert sorted(names[1:]) == sorted(upstream_base_name(str(t.upstream_version),
                                                          t.cuda_lane) for t in current)


def test_kernel_stage_refuses_an_unpinned_default_base_naming_pin_images(
        tmp_path: Path) -> None:
    from builder.core.errors import BuilderError
    from builder.kernels.container import default_base

    with pytest.raises(BuilderError) as refused:
        default_base("12.9", REPO / "images/pins.toml")
    assert refused.value.cause == ("the kernel build base for CUDA 12.9 (docker.io/nvidia/"
                                   "cuda:12.9.1-devel-ubuntu24.04) is not pinned by digest: "
                                   'its digest is unresolved (digest = "" in the pins file)')
    assert "python -m builder pin-images" in refused.value.hint
    pins = tmp_path / "pins.toml"
    pins.write_text(f'[[kernel_base]]\ncuda_lane = "12.9"\nname = "r/cuda:x"\n'
                    f'digest = "sha256:{"c" * 64}"\n')
    assert default_base("12.9", pins) == f"r/cuda:x@sha256:{'c' * 64}"
    with pytest.raises(BuilderError, match=r"pins no kernel build base for CUDA 13\.0"):
        default_base("13.0", pins)


@pytest.mark.slow(reason="starts a Docker Engine")
def test_kernel_build_container_is_built_from_the_pinned_digest(
        docker_engine, registry: Registry, kernel_base_image, shared_cache: Path,
        tmp_path: Path, docker_config: Path) -> None:
    """The kernel stage's default base, pinned by pin-images, is what the build container's
    image is built FROM (images/kernels-build.Dockerfile has no default base any more)."""
    from builder.core.cache import Cache
    from builder.core.progress import Reporter
    from builder.kernels.container import build_image, default_base
    from tests.helpers.services import push_image

    name = f"{registry.host}/sm120-test/debian-gxx:bookworm"
    digest = push_image(docker_engine, kernel_base_image.image_id, name)
    pins = tmp_path / "pins.toml"
    pins.write_text(f'[[kernel_base]]\ncuda_lane = "12.9"\nname = "{name}"\ndigest = ""\n')
    done = pin(pins, env={"DOCKER_CONFIG": str(docker_config)})
    assert done.returncode == 0, done.stdout + done.stderr
    base = default_base("12.9", pins)
    assert base == f"{name}@{digest}"
    image, _, toolkit = build_image(docker_engine.client, base, "pypi", Cache(shared_cache),
                                    Reporter(quiet=True))
    assert toolkit == "pypi"
    base_layers = docker_engine.api.inspect_image(base)["RootFS"]["Layers"]
    layers = docker_engine.api.inspect_image(image)["RootFS"]["Layers"]
    assert layers[:len(base_layers)] == base_layers and len(layers) > len(base_layers)
