"""Image mode of the smoke test: run the probe inside a built image with the GPU attached.

The GPU is requested with docker-py's ``DeviceRequest(count=-1, capabilities=[["gpu"]])``
(what ``docker run --gpus all`` sends). An engine without the NVIDIA runtime refuses that
at container start; this is the runner's fault, not the image's, and is told apart by
:func:`classify_engine_error` so the CLI can exit 3 instead of 1.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from builder.core.errors import ConfigurationError

EngineFault = Literal["misconfigured-runner", "broken-image"]

# Engine answers that mean the runner cannot give a container a GPU.
MISCONFIGURED_RUNNER = (
    # No NVIDIA runtime registered with the engine. Observed on Docker Engine 20.10.24
    # (Debian docker.io, dockerd started by hand) for DeviceRequest(count=-1,
    # capabilities=[["gpu"]]), at container start, HTTP 500:
    # 'could not select device driver "" with capabilities: [[gpu]]'.
    'could not select device driver "" with capabilities',
    # The NVIDIA runtime is there but the host driver is not (NVIDIA/nvidia-docker#1393,
    # NVIDIA/nvidia-container-toolkit#260: "nvidia-container-cli: initialization error:
    # nvml error: driver not loaded").
    "nvidia-container-cli: initialization error",
)


def classify_engine_error(message: str) -> EngineFault:
    """Tell a runner that cannot attach a GPU from an image that cannot run.

    Args:
        message: the engine's error text (``APIError.explanation`` or ``str(error)``).

    Returns:
        ``misconfigured-runner`` for the engine's GPU errors above, else ``broken-image``.
    """
    return "misconfigured-runner" if any(text in message for text in MISCONFIGURED_RUNNER) \
        else "broken-image"


class EngineRefused(Exception):
    """The engine would not run the container (the message is the engine's).

    Attributes:
        fault: whose fault it is (:data:`EngineFault`).
    """

    def __init__(self, message: str, fault: EngineFault) -> None:
        super().__init__(message)
        self.fault = fault


@dataclass(frozen=True)
class ContainerRun:
    """A finished container.

    Attributes:
        image_id: the image's id (``sha256:...``).
        exit_code: the command's exit status (None when it was killed at the timeout).
        stdout: its standard output.
        stderr: its standard error.
    """

    image_id: str
    exit_code: int | None
    stdout: str
    stderr: str


def _tar(files: Mapping[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def docker_client(host: str | None = None) -> Any:
    """A docker-py client of the engine at ``host``, else from the environment
    (``DOCKER_HOST`` and friends).

    Raises:
        EngineRefused: no engine answers (a misconfigured runner).
    """
    import docker

    try:
        client = docker.DockerClient(base_url=host) if host else docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise EngineRefused(f"no Docker Engine answers: {exc}", "misconfigured-runner"
                            ) from None
    return client


def run_in_image(image: str, command: Sequence[str], *, files: Mapping[str, bytes],
                 environment: Mapping[str, str], timeout: float,
                 client: Any = None) -> ContainerRun:
    """Run ``command`` in a new container of ``image`` with every GPU attached.

    Args:
        image: a local image reference or id.
        command: the command (argv) to run.
        files: paths (relative to ``/``) and contents copied in before the start.
        environment: environment variables of the container.
        timeout: seconds before the container is killed.
        client: a docker-py client (default: :func:`docker_client`).

    Returns:
        The finished container's output; the container is always removed.

    Raises:
        BuilderError: ``image`` is not in the engine.
        EngineRefused: the engine would not start it, with the fault classified.
    """
    import docker
    import requests
    from docker.types import DeviceRequest

    client = client or docker_client()
    try:
        image_id = client.images.get(image).id
    except docker.errors.ImageNotFound:
        raise ConfigurationError(f"image {image} is not in the Docker Engine",
                                 "build or load it first (docker images lists what is there)"
                                 ) from None
    container = client.containers.create(
        image, list(command), environment=dict(environment), network_disabled=True,
        device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])], detach=True)
    try:
        container.put_archive("/", _tar(files))
        try:
            container.start()
        except docker.errors.APIError as exc:
            message = str(exc.explanation or exc)
            raise EngineRefused(message, classify_engine_error(message)) from None
        try:
            exit_code: int | None = int(container.wait(timeout=timeout)["StatusCode"])
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            # docker-py's read timeout (a ConnectionError through its unix-socket adapter)
            container.kill()
            exit_code = None
        stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
        stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    return ContainerRun(str(image_id), exit_code, stdout, stderr)
