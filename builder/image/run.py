"""The image stage for a target: its wheel(s), then the runtime image on its pinned base."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import docker

from builder.core.basepins import PINS_FILE
from builder.core.engine import connect
from builder.core.errors import ConfigurationError
from builder.core.options import Options, select_target
from builder.image.build import (
    BaseImage,
    ImageResult,
    build_image,
    image_tags,
    load_base_pins,
    read_extra_wheel,
)
from builder.image.kernel_gate import gate_kernel_wheels
from builder.image.profile import PROFILES_DIR, check_profile, load_profile, profile_path
from builder.wheel.build import run_wheels


@dataclass(frozen=True)
class ImageOptions:
    """What the image stage needs beyond :class:`~builder.core.options.Options`.

    Attributes:
        registry: ``host[:port]`` the tag names.
        repository: repository path in that registry.
        base_image: ``NAME@sha256:…`` replacing the pinned upstream base (the tests'
            local Debian base goes here), or ``None``.
        pins_file: ``images/pins.toml``.
        dockerfile: ``images/Dockerfile``.
        kernel_wheels: extra wheels installed with ``--no-deps`` (FlashInfer kernels).
        profiles_dir: the launch profiles, one ``<target>.toml`` each.
        launch_profile: this profile instead of the target's in ``profiles_dir``.
        docker_host: the engine (``None``: ``$DOCKER_HOST`` or the default socket).
    """

    registry: str = "localhost:5000"
    repository: str = "sglang-sm120"
    base_image: str | None = None
    pins_file: Path = PINS_FILE
    dockerfile: Path = Path("images/Dockerfile")
    kernel_wheels: tuple[Path, ...] = ()
    docker_host: str | None = None
    profiles_dir: Path = PROFILES_DIR
    launch_profile: Path | None = None


def run_image(options: Options, image_options: ImageOptions,
              client: docker.DockerClient | None = None) -> ImageResult:
    """Wheel and image stages for the selected target.

    Raises:
        BuilderError: see :func:`builder.wheel.build.run_wheels`,
            :func:`builder.image.build.build_image`; the engine is unreachable; no base is
            pinned for the target's lane; its launch profile is missing or malformed, or
            passes an option the release refuses (:func:`builder.image.profile.check_profile`);
            a kernel wheel that is not the target's own for its FlashInfer, or a trial or
            fast build (the image is tagged as the release:
            :func:`builder.image.kernel_gate.gate_kernel_wheels`, exit 2).
    """
    target = select_target(options)
    pins = load_base_pins(image_options.pins_file)
    base = BaseImage.parse(image_options.base_image) if image_options.base_image else \
        BaseImage.from_pin(pins.pin_for(target.upstream_version, target.cuda_lane))
    extra = [read_extra_wheel(p) for p in image_options.kernel_wheels]
    # The image's tag is the release's: only the target's own kernels, for its FlashInfer,
    # of its own module set (never a trial or fast build under that tag).
    gate_kernel_wheels(options, target, extra, ConfigurationError)
    profile = load_profile(image_options.launch_profile or
                           profile_path(image_options.profiles_dir, target), target)
    if not image_options.dockerfile.is_file():
        raise ConfigurationError(f"{image_options.dockerfile} not found",
                                 "the image is built from images/Dockerfile beside the targets "
                                 "file: restore it from the builder's repository")
    # Before the engine and the wheel: an unresolved pin or a profile option the release
    # refuses is reported without an engine, not at serve time.
    check_profile(profile, target, cache=options.cache, index_url=options.index_url,
                  reporter=options.reporter)
    client = client or connect(image_options.docker_host)
    wheels = run_wheels(options)
    tags = image_tags(image_options.registry, image_options.repository, target,
                      pins.lanes(target.upstream_version))
    return build_image(client, dockerfile=image_options.dockerfile, target=target,
                       wheels=wheels, extra_wheels=extra, base=base, tags=tags,
                       profile=profile, reporter=options.reporter)
