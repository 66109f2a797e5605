"""Image stage on a real engine: the runtime image built on a local Debian base with the
real 0.5.9 wheel, its labels, its one thin layer, the build cache, the static smoke test,
and the pins file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from packaging.version import Version

from builder import Options
from builder.core.config import load_targets
from builder.core.errors import BuilderError
from builder.image.build import LABEL_NS, OCI, BaseImage, image_tags, load_base_pins
from builder.image.run import ImageOptions, run_image
from builder.smoke.static import static_smoke
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.services import DockerEngine, Registry

PIN_SHA = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def built(runtime_project: Path, docker_engine: DockerEngine, registry: Registry,
          debian_base_image: BaseImage) -> dict:
    """The image built through the CLI (``--json``), as a user runs it."""
    done = run_cli("image", "--json", "--cache-dir", str(runtime_project / "cache"),
                   "--registry", registry.host, "--base-image", debian_base_image.reference,
                   cwd=runtime_project, env=docker_engine.env)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow(reason="starts a Docker Engine")
def test_image_labels_tag_and_one_layer(built: dict, docker_engine: DockerEngine,
                                        registry: Registry, debian_base_image: BaseImage,
                                        runtime_project: Path) -> None:
    info = docker_engine.api.inspect_image(built["image_id"])
    labels = info["Config"]["Labels"]
    assert labels == built["labels"]  # what the CLI reported is what the image carries
    assert labels[f"{OCI}.version"] == "0.5.9+sm120.7"
    assert labels[f"{OCI}.source"] == "https://pypi.org/project/sglang/0.5.9/"
    assert labels[f"{OCI}.revision"] == \
        "sha256:11b1445bfb039c20217783850fda66a71b814391b2cf313f4e6cadc3b9fea41b"
    # SOURCE_DATE_EPOCH unset: the upstream release time (the sdist's newest member).
    assert labels[f"{OCI}.created"] == "2026-02-23T08:13:59Z"
    assert labels[f"{OCI}.base.name"] == debian_base_image.name
    assert labels[f"{OCI}.base.digest"] == debian_base_image.digest
    assert len(labels[f"{LABEL_NS}.patch-series.sha256"]) == 64
    assert f"{LABEL_NS}.kernel.arch-list" not in labels  # no kernel wheel given
    profile = runtime_project / "images/profiles/t.toml"
    assert labels[f"{LABEL_NS}.launch-profile"] == "/etc/sglang-sm120/profile.toml"
    assert labels[f"{LABEL_NS}.launch-profile.sha256"] == \
        hashlib.sha256(profile.read_bytes()).hexdigest()
    assert labels[f"{LABEL_NS}.launcher"] == "/usr/local/bin/sglang-sm120-serve"
    wheel = runtime_project / "dist/sglang-0.5.9+sm120.7-py3-none-any.whl"
    assert json.loads(labels[f"{LABEL_NS}.wheels"]) == {
        wheel.name: hashlib.sha256(wheel.read_bytes()).hexdigest()}
    assert built["tags"] == [f"{registry.host}/sglang-sm120:0.5.9-sm120.7"]
    assert f"{registry.host}/sglang-sm120:0.5.9-sm120.7" in info["RepoTags"]
    base_layers = docker_engine.api.inspect_image(debian_base_image.reference)["RootFS"]
    assert info["RootFS"]["Layers"][:-1] == base_layers["Layers"]
    assert built["layers_added"] == 1


@pytest.mark.slow(reason="starts a Docker Engine")
def test_layer_is_thin_and_holds_no_wheel(built: dict, runtime_project: Path,
                                          docker_engine: DockerEngine, registry: Registry,
                                          debian_base_image: BaseImage) -> None:
    # Every file on the image's own file system (not /proc, /sys, /dev).
    walk = ("import os; print([os.path.join(d, f) for d, ds, fs in os.walk('/') "
            "if not d.startswith(('/proc', '/sys', '/dev')) for f in fs if f.endswith('.whl')])")
    found = docker_engine.client.containers.run(built["image_id"],
                                                entrypoint=["python3", "-c", walk],
                                                network_mode="none", remove=True)
    assert found.decode().strip() == "[]"
    image = _rebuild(runtime_project, docker_engine, registry, debian_base_image)
    report = static_smoke(docker_engine.client, image)
    # The layer carries what pip installed (every file in RECORD, bytecode included)
    # and next to nothing else; the benchmark reports the ratio.
    assert report.installed_size > 40_000_000
    assert built["layer_size"] <= 1.05 * report.installed_size


@pytest.mark.slow(reason="starts a Docker Engine")
def test_rebuild_is_cached_and_same_image(built: dict, runtime_project: Path,
                                          docker_engine: DockerEngine, registry: Registry,
                                          debian_base_image: BaseImage) -> None:
    again = _rebuild(runtime_project, docker_engine, registry, debian_base_image)
    assert again.cached
    assert again.image_id == built["image_id"]


def _rebuild(project: Path, engine: DockerEngine, registry: Registry, base: BaseImage):
    return run_image(
        Options(targets_file=project / "targets.toml", cache_dir=project / "cache",
                dist_dir=project / "dist"),
        ImageOptions(registry=registry.host, base_image=base.reference,
                     pins_file=project / "images/pins.toml",
                     dockerfile=project / "images/Dockerfile",
                     profiles_dir=project / "images/profiles"),
        engine.client)


@pytest.mark.slow(reason="starts a Docker Engine")
def test_static_smoke_reads_provenance_and_patched_line(
        built: dict, runtime_project: Path, docker_engine: DockerEngine, registry: Registry,
        debian_base_image: BaseImage) -> None:
    image = _rebuild(runtime_project, docker_engine, registry, debian_base_image)
    report = static_smoke(docker_engine.client, image)
    assert report.passed, report.to_json()
    assert report.installed["sglang"]["version"] == "0.5.9+sm120.7"
    assert report.installed_wheel == "sglang-0.5.9+sm120.7-py3-none-any.whl"
    [line] = report.lines
    assert (line.path, line.line) == ("sglang/srt/model_executor/model_runner.py", 1842)
    assert line.found == line.expected and line.found.strip() == '"flashinfer_cutlass",'
    checks = {c.name: c for c in report.checks}
    assert checks["launch profile"].ok
    # The launcher ran inside the image: the profile's arguments, then the smoke's.
    assert checks["launcher"].detail.endswith(
        "-m sglang.launch_server --moe-runner-backend flashinfer_cutlass "
        "--disable-cuda-graph --model-path /sm120-smoke/model")


@pytest.mark.slow(reason="starts a Docker Engine")
def test_static_smoke_fails_on_an_image_without_our_wheel(
        built: dict, runtime_project: Path, docker_engine: DockerEngine, registry: Registry,
        debian_base_image: BaseImage) -> None:
    image = _rebuild(runtime_project, docker_engine, registry, debian_base_image)
    report = static_smoke(docker_engine.client, image, reference=debian_base_image.reference)
    assert not report.passed
    failed = {c.name: c.detail for c in report.checks if not c.ok}
    assert failed["sglang version"] == "not installed (expected 0.5.9+sm120.7)"
    assert failed["provenance"] == "missing"
    assert failed["launch profile"] == "missing at /etc/sglang-sm120/profile.toml"
    assert failed["launcher"] == "/usr/local/bin/sglang-sm120-serve missing or not executable"


@pytest.mark.slow(reason="starts a Docker Engine")
def test_pin_images_then_image_builds_with_no_base_image(
        built: dict, runtime_project: Path, docker_engine: DockerEngine, registry: Registry,
        debian_base_image: BaseImage, tmp_path: Path) -> None:
    # A fresh clone's pins file names the base by tag only; pin-images resolves it through
    # the registry's API, then `image` builds from the pin with no --base-image.
    pins = runtime_project / "images/pins.toml"
    original = pins.read_text()
    config = tmp_path / "docker-config"
    config.mkdir()
    (config / "config.json").write_text("{}")
    try:
        pins.write_text(
            "# the test's pins\n[[base]]\nupstream_version = \"0.5.9\"\ncuda_lane = \"12.9\"\n"
            f'name = "{debian_base_image.name}"\ndigest = ""\n\n[[kernel_base]]\n'
            f'cuda_lane = "12.9"\nname = "{debian_base_image.name}"\ndigest = ""\n')
        refused = run_cli("image", "--cache-dir", str(runtime_project / "cache"),
                          cwd=runtime_project, env=docker_engine.env)
        assert refused.returncode == 2
        assert "python -m builder pin-images" in " ".join(refused.stderr.split())
        pinned = run_cli("pin-images", cwd=runtime_project,
                         env={"DOCKER_CONFIG": str(config)})
        assert pinned.returncode == 0, pinned.stdout + pinned.stderr
        assert load_base_pins(pins).pin_for(Version("0.5.9"), "12.9").digest == \
            debian_base_image.digest
        done = run_cli("image", "--json", "--cache-dir", str(runtime_project / "cache"),
                       "--registry", registry.host, cwd=runtime_project,
                       env=docker_engine.env)
        assert done.returncode == 0, done.stdout + done.stderr
        image = json.loads(done.stdout)
        assert image["base"] == debian_base_image.reference
        assert image["image_id"] == built["image_id"]  # the same base, the same image
    finally:
        pins.write_text(original)


@pytest.mark.slow(reason="starts a Docker Engine")
def test_missing_base_image_is_one_clear_error(runtime_project: Path,
                                               docker_engine: DockerEngine,
                                               registry: Registry) -> None:
    missing = f"{registry.host}/sm120-test/nothing:here@sha256:{'0' * 64}"
    done = run_cli("image", "--cache-dir", str(runtime_project / "cache"), "--base-image",
                   missing, cwd=runtime_project, env=docker_engine.env)
    assert done.returncode == 6
    assert f"build error: base image {missing} is missing" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr


def test_no_engine_is_one_clear_error(runtime_project: Path, tmp_path: Path) -> None:
    done = run_cli("image", "--docker-host", f"unix://{tmp_path}/none.sock",
                   "--base-image", f"x/y:z@sha256:{'0' * 64}", cwd=runtime_project)
    assert done.returncode == 3
    assert "no Docker Engine answers at unix://" in done.stderr


def test_pins_file_is_valid_and_refuses_an_unresolved_digest() -> None:
    pins = load_base_pins(REPO / "images/pins.toml")
    target = load_targets(REPO / "targets.toml").get("sglang-0.5.9")
    assert pins.lanes(target.upstream_version) == ["12.9"]
    with pytest.raises(BuilderError, match="not pinned by digest") as refused:
        BaseImage.from_pin(pins.pin_for(target.upstream_version, target.cuda_lane))
    assert "python -m builder pin-images" in refused.value.hint


def test_pins_file_entries_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "pins.toml"
    entry = ('[[base]]\nupstream_version = "0.5.9"\ncuda_lane = "{lane}"\n'
             'name = "docker.io/lmsysorg/sglang:v0.5.9-{tag}"\ndigest = "{digest}"\n')
    path.write_text(entry.format(lane="12.9", tag="cu129", digest=PIN_SHA)
                    + entry.format(lane="13.0", tag="cu130", digest=PIN_SHA))
    pins = load_base_pins(path)
    target = load_targets(REPO / "targets.toml").get("sglang-0.5.9")
    assert BaseImage.from_pin(pins.pin_for(target.upstream_version, "13.0")) == BaseImage(
        "docker.io/lmsysorg/sglang:v0.5.9-cu130", PIN_SHA)
    # Several lanes for one release: the tag names the lane.
    assert image_tags("127.0.0.1:5000", "sglang-sm120", target, pins.lanes(
        target.upstream_version)) == ("127.0.0.1:5000/sglang-sm120:0.5.9-sm120.1-cu129",)
    assert image_tags("r.example", "x/y", target, ["12.9"]) == ("r.example/x/y:0.5.9-sm120.1",)
    path.write_text(entry.format(lane="12.9", tag="cu129", digest="latest"))
    with pytest.raises(BuilderError, match="is not sha256"):
        load_base_pins(path)
    path.write_text(entry.format(lane="12.9", tag="x", digest=PIN_SHA) + 'extra = "1"\n')
    with pytest.raises(BuilderError, match="needs the string keys"):
        load_base_pins(path)


def test_a_base_must_be_pinned_by_digest() -> None:
    with pytest.raises(BuilderError, match="not pinned by digest"):
        BaseImage.parse("lmsysorg/sglang:v0.5.9-cu129-amd64-runtime")
    assert BaseImage.parse(f"a/b:c@{PIN_SHA}").reference == f"a/b:c@{PIN_SHA}"
