"""Image stage: the runtime OCI image, upstream's runtime image plus one thin layer.

``images/Dockerfile`` installs our patched sglang wheel (and any kernel wheels) with
``pip install --no-deps`` in one ``RUN`` step whose wheels are bind-mounted from the
build context (BuildKit ``RUN --mount``), so the one layer added holds what pip installed
and nothing else (a ``COPY`` of the wheel followed by ``rm`` ships the wheel in its own
layer: measured, see shared/design.md). The base is upstream's image of the target's
CUDA lane, referenced by digest from ``images/pins.toml``.

The build goes through docker-py's low-level API (``/build?version=2``: docker-py 7.x's
``APIClient.build`` has no parameter for BuildKit, so the request is made with the
client's own session); the log is shown live and the first error event raises.

Labels (OCI image-spec ``annotations.md``): ``org.opencontainers.image.source`` /
``.revision`` (upstream's repository and pin), ``.version`` (our version), ``.created``
(from ``SOURCE_DATE_EPOCH``, else the upstream release time in the provenance),
``.base.name`` / ``.base.digest``; ours under :data:`LABEL_NS`: the patch series hash,
the kernel arch list, the target and the wheels' sha256.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from builder.core.basepins import DIGEST as _DIGEST
from builder.core.basepins import BasePin
from builder.core.basepins import BasePins as BasePins  # re-exported
from builder.core.basepins import load_base_pins as load_base_pins  # re-exported
from builder.core.cache import sha256_file, sha256_json
from builder.core.config import GitPin, Target
from builder.core.engine import BuildkitTrace, StreamError, read_stream
from builder.core.errors import BuildError, ConfigurationError
from builder.core.progress import Reporter
from builder.core.userfiles import parse_json
from builder.image.profile import (
    BESIDE_SOURCES,
    LAUNCHER_PATH,
    LAUNCHER_SOURCE,
    PROFILE_PATH,
    SELECT_FOLDER,
    LaunchProfile,
)
from builder.kernels.derive import SCRIPT as SELECT_SCRIPT
from builder.wheel.build import WheelResult

LABEL_NS = "dev.sm120-builder"
OCI = "org.opencontainers.image"
KERNEL_MANIFEST = "flashinfer_jit_cache/sm120-manifest.json"


@dataclass(frozen=True)
class BaseImage:
    """An image to build on, pinned by digest.

    Attributes:
        name: the fully qualified name with its tag, for people and the
            ``.base.name`` label (``docker.io/lmsysorg/sglang:v0.5.9-cu129-amd64-runtime``).
        digest: the manifest digest (``sha256:…``) the build pulls.
    """

    name: str
    digest: str

    @property
    def reference(self) -> str:
        """``name@digest``: what ``FROM`` uses (the digest decides, the tag is a note)."""
        return f"{self.name}@{self.digest}"

    @staticmethod
    def from_pin(pin: BasePin) -> BaseImage:
        """The base a pin names.

        Raises:
            BuilderError: its digest is not resolved (the hint names ``pin-images``).
        """
        return BaseImage.parse(pin.reference)

    @staticmethod
    def parse(text: str) -> BaseImage:
        """Read ``NAME[:TAG]@sha256:HEX``.

        Raises:
            BuilderError: no digest, or a malformed one (a tag alone can move).
        """
        name, at, digest = text.partition("@")
        if not at or not name or not _DIGEST.match(digest):
            raise ConfigurationError(f"base image {text!r} is not pinned by digest",
                                     "write it as NAME:TAG@sha256:<64 hex> (`python -m builder "
                                     "pin-images` resolves pins; docker inspect --format "
                                     "'{{index .RepoDigests 0}}' NAME gives one)")
        return BaseImage(name, digest)


@dataclass(frozen=True)
class ExtraWheel:
    """A wheel installed next to sglang (a FlashInfer kernel wheel, for instance).

    Attributes:
        path: the wheel file.
        name: its distribution name (normalised).
        version: its version.
        sha256: hex sha256 of the file.
        manifest: the kernel manifest inside it (``flashinfer_jit_cache/sm120-manifest.json``:
            ``flashinfer_version``, ``arch_list``, ``cuda_version``, ``modules`` …), if any.
    """

    path: Path
    name: str
    version: str
    sha256: str
    manifest: dict[str, Any] | None

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"path": str(self.path), "name": self.name, "version": self.version,
                "sha256": self.sha256,
                "arch_list": (self.manifest or {}).get("arch_list")}


def read_extra_wheel(path: Path) -> ExtraWheel:
    """Describe an extra wheel, reading its kernel manifest when it has one.

    Raises:
        ConfigurationError: the file (the user's ``--kernel-wheel``) is missing, not a
            wheel, or its manifest is not JSON with an ``arch_list``.
    """
    if not path.is_file():
        raise ConfigurationError(f"--kernel-wheel {path}: no such file",
                                 "pass the .whl files `python -m builder kernels` wrote")
    try:
        name, version, _, _ = parse_wheel_filename(path.name)
    except InvalidWheelFilename:
        raise ConfigurationError(f"{path.name} is not a wheel file name",
                                 "pass .whl files to --kernel-wheel") from None
    try:
        with zipfile.ZipFile(path) as archive:
            # Beside flashinfer_jit_cache/__init__.py (FlashInfer <= 0.6), or in a provider's
            # package (flashinfer_jit_cache/providers/sm120f/, FlashInfer >= 0.7; its shim
            # wheel has none).
            found = [n for n in archive.namelist() if n == KERNEL_MANIFEST or (
                n.startswith("flashinfer_jit_cache/providers/")
                and n.endswith("/sm120-manifest.json"))]
            raw = archive.read(found[0]) if found else None
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigurationError(f"cannot read wheel {path}: {exc}",
                                 "pass the .whl files `python -m builder kernels` wrote"
                                 ) from None
    manifest = None
    if raw is not None:
        try:
            manifest = parse_json(raw)
        except ValueError:
            manifest = None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("arch_list"), list):
            raise ConfigurationError(f"{path.name}: {KERNEL_MANIFEST} is not a manifest with "
                                     "an arch_list", "rebuild the kernel wheel")
    return ExtraWheel(path, str(name), str(version), sha256_file(path), manifest)


def image_tags(registry: str, repository: str, target: Target, lanes: Sequence[str]
               ) -> tuple[str, ...]:
    """Return the image's tag: ``<registry>/<repository>:<upstream>-<local label>``, with
    ``-cu<lane>`` appended when the pins file has several lanes for the release.

    Args:
        registry: ``host[:port]`` (``127.0.0.1:5000``, ``ghcr.io``).
        repository: the repository path (``sglang-sm120``).
        target: the target (its upstream version, local label and CUDA lane).
        lanes: the CUDA lanes pinned for its upstream version.
    """
    tag = target.version.replace("+", "-")  # a tag has no '+'; 0.5.9+sm120.1 -> 0.5.9-sm120.1
    if len(set(lanes)) > 1:
        tag += "-cu" + target.cuda_lane.replace(".", "")
    return (f"{registry.rstrip('/')}/{repository.strip('/')}:{tag}",)


def _upstream_source(target: Target) -> tuple[str, str]:
    git_pin = next((p for p in target.sources if isinstance(p, GitPin)), None)
    if git_pin is not None:
        return git_pin.url, git_pin.commit
    pin = target.pin()
    assert not isinstance(pin, GitPin)
    return f"https://pypi.org/project/{pin.project}/{pin.version}/", f"sha256:{pin.sha256}"


def series_hash(provenance: dict[str, Any]) -> str:
    """The patch series hash: sha256 over every patch's name and sha256, in order."""
    return sha256_json([[p["name"], p["sha256"]] for p in provenance["patches"]])


def source_date_epoch(provenance: dict[str, Any]) -> int:
    """``$SOURCE_DATE_EPOCH`` when set, else the upstream release time in the provenance."""
    return int(os.environ.get("SOURCE_DATE_EPOCH") or provenance["source_date_epoch"])


def image_labels(target: Target, wheels: Sequence[WheelResult],
                 extra: Sequence[ExtraWheel], base: BaseImage,
                 profile: LaunchProfile | None = None) -> dict[str, str]:
    """Return the image's labels (see the module docstring); with a launch profile, where
    it and the launcher are in the image and the profile's sha256.

    ``.created`` is ``$SOURCE_DATE_EPOCH`` when set, else the upstream release time the
    wheel's provenance records, so an unchanged input set gives unchanged labels.
    """
    provenance = wheels[0].provenance
    created = datetime.datetime.fromtimestamp(source_date_epoch(provenance), datetime.UTC)
    source, revision = _upstream_source(target)
    arch = sorted({a for w in extra if w.manifest for a in w.manifest["arch_list"]})
    labels = {
        f"{OCI}.source": source,
        f"{OCI}.revision": revision,
        f"{OCI}.version": wheels[0].version,
        f"{OCI}.created": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        f"{OCI}.base.name": base.name,
        f"{OCI}.base.digest": base.digest,
        f"{LABEL_NS}.target": target.name,
        f"{LABEL_NS}.patch-series.sha256": series_hash(provenance),
        f"{LABEL_NS}.wheels": json.dumps(
            {**{w.path.name: w.sha256 for w in wheels},
             **{w.path.name: w.sha256 for w in extra}}, sort_keys=True),
    }
    if arch:
        labels[f"{LABEL_NS}.kernel.arch-list"] = ",".join(arch)
    if profile is not None:
        labels[f"{LABEL_NS}.launch-profile"] = PROFILE_PATH
        labels[f"{LABEL_NS}.launch-profile.sha256"] = profile.sha256
        labels[f"{LABEL_NS}.launcher"] = LAUNCHER_PATH
    if provenance.get("wheel") == "upstream":
        # no patch changes this release: the sglang wheel is upstream's own, unrenamed
        labels[f"{LABEL_NS}.sglang-wheel"] = "upstream"
    return labels


@dataclass(frozen=True)
class ImageResult:
    """A built runtime image.

    Attributes:
        image_id: the image ID (``sha256:…``, its config digest).
        tags: the tags it was given.
        base: the base it was built on.
        labels: its labels.
        requirements: what pip installed (``sglang==…`` and the extra wheels).
        wheels: the sglang wheels offered to pip (it takes the one matching the base's
            Python).
        extra_wheels: the extra (kernel) wheels installed.
        layer_size: bytes in the layer the build added (the engine's accounting).
        layers_added: how many layers the build added on top of the base (1).
        cached: True when no build step ran (everything came from the build cache).
        profile: the SM120 launch profile installed with the launcher.
    """

    image_id: str
    tags: tuple[str, ...]
    base: BaseImage
    labels: dict[str, str]
    requirements: tuple[str, ...]
    wheels: tuple[WheelResult, ...]
    extra_wheels: tuple[ExtraWheel, ...] = ()
    layer_size: int = 0
    layers_added: int = 0
    cached: bool = False
    executed: tuple[str, ...] = field(default=())
    profile: LaunchProfile | None = None

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"image_id": self.image_id, "tags": list(self.tags),
                "base": self.base.reference, "labels": self.labels,
                "requirements": list(self.requirements),
                "wheels": [str(w.path) for w in self.wheels],
                "extra_wheels": [w.describe() for w in self.extra_wheels],
                "layer_size": self.layer_size, "layers_added": self.layers_added,
                "cached": self.cached,
                "launch_profile": None if self.profile is None else {
                    "source": str(self.profile.path), "path": PROFILE_PATH,
                    "sha256": self.profile.sha256, "args": self.profile.args,
                    "launcher": LAUNCHER_PATH}}


def ensure_base(client: docker.DockerClient, base: BaseImage, reporter: Reporter) -> str:
    """Make sure the engine has the base image; pull it by digest if not.

    Returns:
        the base's image ID.

    Raises:
        BuilderError: it is neither in the engine nor pullable (the registry's answer
            is in the message).
    """
    api = client.api
    try:
        return str(api.inspect_image(base.reference)["Id"])
    except docker.errors.ImageNotFound:
        pass
    reporter.info(f"pulling base image {base.reference}")
    try:
        read_stream(api.pull(base.reference, stream=True, decode=True))
        return str(api.inspect_image(base.reference)["Id"])
    except (StreamError, docker.errors.APIError, requests.exceptions.RequestException) as exc:
        message = getattr(exc, "explanation", None) or str(exc)
        raise BuildError(f"base image {base.reference} is missing: it is not in the engine "
                         f"and pulling it failed: {message}",
                         "check the digest in images/pins.toml or --base-image, and that "
                         "its registry is reachable") from None


def _context(dockerfile: Path, wheels: Sequence[Path], mtime: int, out: Path,
             profile: LaunchProfile) -> None:
    """Write the build context: the Dockerfile, ``wheels/`` and ``sm120/`` (the launch
    profile, the launcher and its profile reader), fixed metadata (GNU tar: the engine
    takes a PAX archive's first header for a Dockerfile, measured here)."""
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
        def add(path: Path, name: str, mode: int) -> None:
            info = tar.gettarinfo(str(path), arcname=name)
            info.mtime, info.mode, info.uid, info.gid = mtime, mode, 0, 0
            info.uname = info.gname = ""
            if info.isdir():
                tar.addfile(info)
            else:
                with path.open("rb") as handle:
                    tar.addfile(info, handle)

        def add_bytes(data: bytes, name: str, mode: int) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), mtime, mode
            tar.addfile(info, io.BytesIO(data))
        add(dockerfile, "Dockerfile", 0o644)
        add(dockerfile.parent, "wheels", 0o755)
        for wheel in sorted(wheels, key=lambda p: p.name):
            add(wheel, f"wheels/{wheel.name}", 0o644)
        add(dockerfile.parent, "sm120", 0o755)
        add_bytes(profile.text.encode(), "sm120/profile.toml", 0o644)
        add_bytes(LAUNCHER_SOURCE.read_bytes(), "sm120/sglang-sm120-serve", 0o755)
        # The launcher's profile reader and coverage rules, beside it in the image as here
        # (one source each), and the release's backend selection it runs (issue 36).
        for source in BESIDE_SOURCES:
            add_bytes(source.read_bytes(), f"sm120/{source.name}", 0o644)
        add(dockerfile.parent, f"sm120/{SELECT_FOLDER}", 0o755)
        for script in sorted(SELECT_SCRIPT.parent.glob("*.py")):
            add_bytes(script.read_bytes(), f"sm120/{SELECT_FOLDER}/{script.name}", 0o644)


def build_image(client: docker.DockerClient, *, dockerfile: Path, target: Target,
                wheels: Sequence[WheelResult], extra_wheels: Sequence[ExtraWheel] = (),
                base: BaseImage, tags: Sequence[str], profile: LaunchProfile,
                reporter: Reporter) -> ImageResult:
    """Build the runtime image with BuildKit; stream its log; return what was built.

    Args:
        client: the engine.
        dockerfile: ``images/Dockerfile``.
        target: the target the wheels were built for.
        wheels: its sglang wheels (one per platform / Python tag for released-wheel
            targets; pip installs the one matching the base's Python).
        extra_wheels: kernel wheels installed with them (``--no-deps``), possibly none.
        base: the base image by digest.
        tags: full image references to tag the result with.
        profile: the target's SM120 launch profile (installed with the launcher).
        reporter: progress (the build log, live).

    Returns:
        the :class:`ImageResult`; ``cached`` tells whether any step ran.

    Raises:
        BuilderError: the base is missing, the engine refused the build, or any error
            event in its stream (the message carries the engine's words and the hint
            the log's tail); or the build added more or fewer than one layer.
    """
    if not wheels:
        raise BuildError("no sglang wheel to put in the image", "build the wheel first")
    base_id = ensure_base(client, base, reporter)
    api = client.api
    base_layers = api.inspect_image(base_id)["RootFS"].get("Layers", [])
    labels = image_labels(target, wheels, extra_wheels, base, profile)
    requirements = (f"sglang=={wheels[0].version}",
                    *(f"{w.name}=={w.version}" for w in extra_wheels))
    names = [canonicalize_name(r.split("==")[0]) for r in requirements]
    if len(set(names)) != len(names):
        raise BuildError(f"two wheels of one distribution: {', '.join(requirements)}",
                         "pass each kernel wheel once")
    epoch = source_date_epoch(wheels[0].provenance)
    trace = BuildkitTrace(reporter.info)
    params = {"t": list(tags), "version": "2", "networkmode": "none", "rm": True,
              "forcerm": True, "labels": json.dumps(labels),
              "buildargs": json.dumps({"BASE_IMAGE": base.reference,
                                       "REQUIREMENTS": " ".join(requirements)})}
    reporter.info(f"building image on {base.reference}: {' '.join(requirements)}")
    with tempfile.TemporaryDirectory(prefix="sm120-context-") as tmp:
        context = Path(tmp) / "context.tar"
        _context(dockerfile, [w.path for w in wheels] + [w.path for w in extra_wheels],
                 epoch, context, profile)
        image_id = None
        try:
            with context.open("rb") as body:
                # docker-py 7.x: APIClient.build cannot ask for BuildKit (version=2),
                # so the request goes through the client's own helpers.
                response = api._post(api._url("/build"), params=params, data=body,
                                     headers={"Content-Type": "application/x-tar"},
                                     stream=True)
                api._raise_for_status(response)
                for event in read_stream(api._stream_helper(response, decode=True),
                                         trace.feed):
                    aux = event.get("aux")
                    if event.get("id") == "moby.image.id" and isinstance(aux, dict):
                        image_id = aux.get("ID")
        except StreamError as exc:
            raise BuildError(f"image build failed: {exc}",
                             "the build log's last lines:\n" + trace.tail()) from None
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            message = getattr(exc, "explanation", None) or str(exc)
            raise BuildError(f"the engine refused the image build: {message}",
                             "an engine with BuildKit (Docker >= 18.09) is needed") from None
    if not image_id:
        raise BuildError("the image build ended without an image ID",
                         "the build log's last lines:\n" + trace.tail())
    info = api.inspect_image(image_id)
    layers = info["RootFS"].get("Layers", [])
    added = len(layers) - len(base_layers)
    if layers[:len(base_layers)] != base_layers or added != 1:
        raise BuildError(f"the image build added {added} layers on the base, not 1",
                         "images/Dockerfile must install the wheels in one RUN step")
    history = api.history(image_id)
    executed = tuple(trace.executed())
    reporter.info(f"image {image_id} ({'cached' if not executed else 'built'}), layer "
                  f"{history[0]['Size'] / 1e6:.1f} MB")
    return ImageResult(image_id=image_id, tags=tuple(tags), base=base, labels=labels,
                       requirements=requirements, wheels=tuple(wheels),
                       extra_wheels=tuple(extra_wheels), layer_size=int(history[0]["Size"]),
                       layers_added=added, cached=not executed, executed=executed,
                       profile=profile)
