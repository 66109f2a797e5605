"""The image stage for a target: its wheel(s), then the runtime image on its pinned base."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import docker

from builder.core.cache import sha256_file, sha256_json
from builder.core.engine import connect
from builder.core.errors import BuilderError
from builder.core.lock import VersionLock, lock_path
from builder.core.options import Options, select_target
from builder.image.build import (
    BaseImage,
    ImageResult,
    build_image,
    image_tags,
    load_base_pins,
    read_extra_wheel,
)
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
        docker_host: the engine (``None``: ``$DOCKER_HOST`` or the default socket).
    """

    registry: str = "localhost:5000"
    repository: str = "sglang-sm120"
    base_image: str | None = None
    pins_file: Path = Path("images/pins.toml")
    dockerfile: Path = Path("images/Dockerfile")
    kernel_wheels: tuple[Path, ...] = ()
    docker_host: str | None = None


def run_image(options: Options, image_options: ImageOptions,
              client: docker.DockerClient | None = None) -> ImageResult:
    """Wheel and image stages for the selected target.

    Raises:
        BuilderError: see :func:`builder.wheel.build.run_wheels`,
            :func:`builder.image.build.build_image`; the engine is unreachable; no base is
            pinned for the target's lane; the version lock records other content for
            this image tag.
    """
    client = client or connect(image_options.docker_host)
    target = select_target(options)
    pins = load_base_pins(image_options.pins_file)
    base = BaseImage.parse(image_options.base_image) if image_options.base_image else \
        pins.base_for(target.upstream_version, target.cuda_lane)
    extra = [read_extra_wheel(p) for p in image_options.kernel_wheels]
    if not image_options.dockerfile.is_file():
        raise BuilderError(f"{image_options.dockerfile} not found",
                           "run from the project root (images/Dockerfile)")
    wheels = run_wheels(options)
    tags = image_tags(image_options.registry, image_options.repository, target,
                      pins.lanes(target.upstream_version))
    lock = None
    if options.source_dir is None and options.patch is None:
        # One tag, one content: the wheels, the kernel wheels, the base and the
        # Dockerfile decide the image.
        lock = VersionLock(lock_path(options.targets_file))
        digest = sha256_json({
            "wheels": sorted((w.path.name, w.sha256) for w in wheels),
            "extra_wheels": sorted((w.path.name, w.sha256) for w in extra),
            "base": base.reference, "dockerfile": sha256_file(image_options.dockerfile)})
        tag_version = tags[0].rsplit(":", 1)[1]
        lock.require("image", target.name, tag_version, digest)
    result = build_image(client, dockerfile=image_options.dockerfile, target=target,
                         wheels=wheels, extra_wheels=extra, base=base, tags=tags,
                         reporter=options.reporter)
    if lock is not None:
        lock.record("image", target.name, tag_version, digest)
    return result
