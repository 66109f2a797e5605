"""Every current target has an upstream base in images/pins.toml: the unresolved digest is
one clear error naming ``pin-images`` (before any engine is asked), and ``image
--base-image`` with a local stand-in base builds 0.5.23's image from its real wheels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.core.basepins import load_base_pins
from builder.core.config import load_targets
from builder.image.build import OCI, BaseImage
from tests.helpers.cli import run_cli
from tests.helpers.files import hardlink_tree
from tests.helpers.paths import REPO
from tests.helpers.project import project_0_5_23 as _project_0_5_23
from tests.helpers.services import DockerEngine, Registry
from tests.helpers.targets import current_targets

CURRENT = current_targets()  # from targets.toml and the series


@pytest.mark.parametrize("name", CURRENT)
def test_every_current_target_has_upstreams_base(name: str) -> None:
    target = load_targets(REPO / "targets.toml").get(name)
    pin = load_base_pins(REPO / "images/pins.toml").pin_for(target.upstream_version,
                                                             target.cuda_lane)
    # Upstream's CUDA 13 runtime tag (see the comment in images/pins.toml).
    assert pin.name == f"docker.io/lmsysorg/sglang:v{target.upstream_version}-cu130-runtime"


def test_an_unresolved_digest_is_one_clear_error_before_the_engine(tmp_path: Path) -> None:
    done = run_cli("image", "--target", "sglang-0.5.23", "--cache-dir", str(tmp_path),
                   env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert done.returncode == 2, done.stderr
    text = " ".join(done.stderr.split())
    assert "docker.io/lmsysorg/sglang:v0.5.23-cu130-runtime" in text
    assert "its digest is unresolved" in text
    assert "python -m builder pin-images" in text and "--base-image" in text
    assert "Traceback" not in done.stderr
    assert not any(tmp_path.iterdir())  # nothing fetched or built


@pytest.mark.slow(reason="starts a Docker Engine")
def test_image_for_0_5_23_on_a_local_stand_in_base(
        docker_engine: DockerEngine, registry: Registry, debian_base_image: BaseImage,
        shared_cache: Path, tmp_path: Path) -> None:
    project = _project_0_5_23(tmp_path / "project")
    # A cache of its own (its source and patched trees made here), holding the shared
    # cache's behaviour environments as hard links: 0.5.23's (about 5 GB) is made once
    # across runs, not once a run.
    cache = tmp_path / "cache"
    for kind in ("behaviour-env", "behaviour-torch"):
        if (shared_cache / kind).is_dir():
            hardlink_tree(shared_cache / kind, cache / kind)
    done = run_cli("image", "--json", "--registry", registry.host, "--base-image",
                   debian_base_image.reference, cwd=project, cache=cache,
                   env=docker_engine.env)
    assert done.returncode == 0, done.stdout + done.stderr
    built = json.loads(done.stdout)
    assert built["tags"] == [f"{registry.host}/sglang-sm120:0.5.23-sm120.1"]
    assert [Path(w).name for w in built["wheels"]] == [
        "sglang-0.5.23+sm120.1-cp311-cp311-manylinux_2_34_x86_64.whl"]
    labels = docker_engine.api.inspect_image(built["image_id"])["Config"]["Labels"]
    assert labels[f"{OCI}.version"] == "0.5.23+sm120.1"
    assert labels[f"{OCI}.base.digest"] == debian_base_image.digest
    shown = docker_engine.client.containers.run(
        built["image_id"], entrypoint=["python3", "-c", "import importlib.metadata as m; "
                                       "print(m.version('sglang'))"],
        network_mode="none", remove=True)
    assert shown.decode().strip() == "0.5.23+sm120.1"
