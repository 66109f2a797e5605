"""The Docker Engine, through docker-py: connecting, and reading its JSON streams.

The engine answers a build, push or pull with HTTP 200 and then streams JSON events; a
failure arrives as an event with ``error`` / ``errorDetail`` inside that stream, which
docker-py does not raise on (docker-py 7.x ``APIClient.push`` returns the stream as is).
Every stream the builder reads goes through :func:`read_stream`, which raises on the
first error event.

BuildKit builds (API ``/build?version=2``) report progress as events
``{"id": "moby.buildkit.trace", "aux": <base64 protobuf>}``, each a
``moby.buildkit.v1.StatusResponse`` (moby/buildkit ``api/services/control/control.proto``:
``vertexes = 1``, ``logs = 3``; ``Vertex``: ``digest = 1``, ``name = 3``, ``cached = 4``,
``started = 5``, ``completed = 6``, ``error = 7``; ``VertexLog``: ``vertex = 1``,
``msg = 4``). :class:`BuildkitTrace` decodes them with the protobuf runtime so the log
can be shown live.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors
import requests.exceptions
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from builder.core.address import parse_url
from builder.core.errors import MissingToolError

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
_STEP = re.compile(r"^\[[^\]]*\d+/\d+\] ")  # a Dockerfile step: "[2/2] RUN …", "[stage 1/3] …"


def docker_host(explicit: str | None = None) -> str:
    """Return the engine address: ``explicit``, else ``$DOCKER_HOST``, else the default
    socket (``unix:///var/run/docker.sock``).

    Raises:
        ConfigurationError: the address given is not one (:func:`check_docker_host`).
    """
    if explicit is not None:
        return check_docker_host(explicit, "--docker-host")
    if os.environ.get("DOCKER_HOST"):
        return check_docker_host(os.environ["DOCKER_HOST"], "DOCKER_HOST")
    return DEFAULT_DOCKER_HOST


def check_docker_host(address: str, where: str) -> str:
    """``address`` if it is an engine address docker-py connects to: ``unix:///PATH``,
    ``tcp://HOST:PORT`` (or ``http``/``https``), or ``ssh://[USER@]HOST[:PORT]``.

    Args:
        address: the address as the user gave it.
        where: the flag or variable it came from, for the message ("" for none).

    Returns:
        ``address`` unchanged.

    Raises:
        ConfigurationError: an empty address, another scheme, a unix socket that is not an
            absolute path, a host missing or with a port outside 1-65535, or credentials
            (a password; a user name but for ssh's login name).
    """
    hint = "write unix:///var/run/docker.sock, tcp://HOST:PORT or ssh://USER@HOST"
    # docker-py sends no credentials written in the address (it authenticates a TCP
    # engine by TLS client certificates, an ssh:// one by ssh's own keys): refused, and
    # never printed (builder.core.address.redact).
    return parse_url(address, ("unix", "tcp", "http", "https", "ssh"),
                     noun="a Docker Engine address", hint=hint,
                     what=f"{where} " if where else "", ssh_user=True,
                     credentials_hint="a Docker Engine takes no password in its address: "
                     "use TLS client certificates (DOCKER_CERT_PATH, DOCKER_TLS_VERIFY) for "
                     "tcp://, or ssh://USER@HOST with ssh's own keys").text


def connect(host: str | None = None, *, timeout: int = 600) -> docker.DockerClient:
    """Return a client of the engine at ``host`` (see :func:`docker_host`), checked alive.

    Args:
        host: ``unix:///path`` or ``tcp://host:port``; ``None`` for the default.
        timeout: seconds for one API call (builds and pushes stream within it).

    Raises:
        BuilderError: nothing answers there, or it is not a Docker Engine.
    """
    address = docker_host(host)
    try:
        client = docker.DockerClient(base_url=address, timeout=timeout)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise MissingToolError(f"no Docker Engine answers at {address}: {_short(exc)}",
                               "start dockerd, or pass --docker-host / set DOCKER_HOST") from None
    return client


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:300] if text else type(exc).__name__


def error_of(event: dict[str, Any]) -> str | None:
    """Return the error message an engine stream event carries, or ``None``."""
    detail = event.get("errorDetail")
    if isinstance(detail, dict) and detail.get("message"):
        return str(detail["message"])
    if event.get("error"):
        return str(event["error"])
    return None


class StreamError(Exception):
    """An error event inside an engine stream (the engine's own message)."""


def read_stream(events: Iterable[dict[str, Any]],
                on_event: Callable[[dict[str, Any]], None] | None = None
                ) -> list[dict[str, Any]]:
    """Consume a whole engine stream; return its events.

    Args:
        events: decoded JSON events (docker-py's ``decode=True`` streams).
        on_event: called with each event before it is checked (live progress).

    Raises:
        StreamError: at the first event carrying an error.
    """
    seen = []
    for event in events:
        if on_event is not None:
            on_event(event)
        message = error_of(event)
        if message is not None:
            raise StreamError(message)
        seen.append(event)
    return seen


def _status_class() -> Any:
    proto = descriptor_pb2.FileDescriptorProto(
        name="sm120/buildkit_status.proto", package="moby.buildkit.v1", syntax="proto3")
    f = descriptor_pb2.FieldDescriptorProto
    optional, repeated = f.LABEL_OPTIONAL, f.LABEL_REPEATED
    vertex = proto.message_type.add(name="Vertex")
    for name, number, kind in (("digest", 1, f.TYPE_STRING), ("name", 3, f.TYPE_STRING),
                               ("cached", 4, f.TYPE_BOOL), ("started", 5, f.TYPE_BYTES),
                               ("completed", 6, f.TYPE_BYTES), ("error", 7, f.TYPE_STRING)):
        # started/completed are google.protobuf.Timestamp messages; read as bytes (same
        # wire type) since only their presence matters here.
        vertex.field.add(name=name, number=number, type=kind, label=optional)
    log = proto.message_type.add(name="VertexLog")
    log.field.add(name="vertex", number=1, type=f.TYPE_STRING, label=optional)
    log.field.add(name="msg", number=4, type=f.TYPE_BYTES, label=optional)
    status = proto.message_type.add(name="StatusResponse")
    status.field.add(name="vertexes", number=1, type=f.TYPE_MESSAGE, label=repeated,
                     type_name=".moby.buildkit.v1.Vertex")
    status.field.add(name="logs", number=3, type=f.TYPE_MESSAGE, label=repeated,
                     type_name=".moby.buildkit.v1.VertexLog")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("moby.buildkit.v1.StatusResponse"))


_STATUS = _status_class()


@dataclass
class Vertex:
    """One BuildKit build step as the trace reported it so far."""

    number: int
    name: str
    started: bool = False
    completed: bool = False
    cached: bool = False
    error: str = ""


@dataclass
class BuildkitTrace:
    """Decodes ``moby.buildkit.trace`` events into numbered steps and log lines.

    Attributes:
        emit: called with each line to show (``#2 [1/2] FROM …``, ``#2 CACHED``, log
            output prefixed with its step number).
        vertices: the steps by digest, in the order first seen.
        log: every line emitted (the tail goes into error hints).
    """

    emit: Callable[[str], None]
    vertices: dict[str, Vertex] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def _say(self, line: str) -> None:
        self.log.append(line)
        self.emit(line)

    def feed(self, event: dict[str, Any]) -> None:
        """Take one engine event; trace events are decoded and shown, others ignored."""
        if event.get("id") != "moby.buildkit.trace" or not isinstance(event.get("aux"), str):
            if isinstance(event.get("stream"), str) and event["stream"].strip():
                self._say(event["stream"].rstrip())
            return
        status = _STATUS.FromString(base64.b64decode(event["aux"]))
        for update in status.vertexes:
            vertex = self.vertices.get(update.digest)
            if vertex is None:
                vertex = self.vertices[update.digest] = Vertex(len(self.vertices) + 1,
                                                              update.name)
            if update.started and not vertex.started:
                vertex.started = True
                self._say(f"#{vertex.number} {vertex.name}")
            if update.cached and not vertex.cached:
                vertex.cached = True
                self._say(f"#{vertex.number} CACHED")
            if update.error and not vertex.error:
                vertex.error = update.error
                self._say(f"#{vertex.number} ERROR: {update.error}")
            if update.completed and not vertex.completed:
                vertex.completed = True
        for entry in status.logs:
            number = self.vertices[entry.vertex].number if entry.vertex in self.vertices else 0
            for line in entry.msg.decode(errors="replace").splitlines():
                if line.strip():
                    self._say(f"#{number} {line.rstrip()}")

    def executed(self) -> list[str]:
        """Names of the Dockerfile steps (``[2/2] RUN …``) that ran, not from the cache
        (a ``FROM`` step only resolves the base, it runs nothing)."""
        return [v.name for v in self.vertices.values()
                if v.completed and not v.cached and _STEP.match(v.name)
                and not _STEP.sub("", v.name).startswith("FROM ")]

    def tail(self, lines: int = 12) -> str:
        """The last ``lines`` lines shown, joined."""
        return "\n".join(self.log[-lines:])
