"""Publishing: wheels to a package index (twine), images to a registry (docker-py).

Nothing is ever overwritten, and running a release again does not fail:

* Wheels. Since twine 6.2 ``--skip-existing`` works only for PyPI, so the index's simple
  page (PEP 503 / PEP 691, read with ``pypi-simple``) is read first: the same file name
  with the same sha256 is *already published* (skipped); the same name with other bytes
  is an error; otherwise twine uploads it and the simple page must then list it with our
  sha256. Credentials come from twine's own sources (``TWINE_USERNAME`` /
  ``TWINE_PASSWORD`` or keyring); they are never on a command line, printed or logged,
  and an index URL with credentials in it is refused.
* Images. The registry is asked for the tag's digest first (``inspect_distribution``):
  a tag that exists with a digest this image was not pushed as (the engine's
  ``RepoDigests``) is an error; the same digest is *already published*. A push is read to
  its end and raises on any error event (the engine answers 200 and puts a failed push
  inside the stream; docker-py does not raise), and the pushed digest is taken from the
  stream. Credentials: ``SGLANG_SM120_REGISTRY_USERNAME`` / ``..._PASSWORD``, else the
  engine client's Docker config.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import docker
import docker.errors
import requests
import requests.exceptions
from packaging.utils import parse_wheel_filename
from pypi_simple import NoSuchProjectError, PyPISimple

from builder.core.address import parse_url
from builder.core.engine import StreamError, read_stream
from builder.core.errors import BuilderError, PublishError
from builder.core.progress import Reporter

PublishStatus = Literal["published", "already-published"]


@dataclass(frozen=True)
class Published:
    """One artifact on its index or registry.

    Attributes:
        kind: ``wheel`` or ``image``.
        name: the wheel's file name, or the image's ``registry/repository:tag``.
        where: the index's simple URL, or the registry.
        digest: ``sha256:<hex>`` of the wheel file, or the image's manifest digest.
        status: ``published`` by this run, or ``already-published`` (same bytes found).
    """

    kind: Literal["wheel", "image"]
    name: str
    where: str
    digest: str
    status: PublishStatus

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"kind": self.kind, "name": self.name, "where": self.where,
                "digest": self.digest, "status": self.status}

    def line(self) -> str:
        """One human line: what, where, digest and whether this run published it."""
        if self.kind == "image":
            repository, _ = split_reference(self.name)
            return f"{self.status}: {repository}@{self.digest} (tag {self.name})"
        return f"{self.status}: {self.name} ({self.digest}) on {self.where}"


# ---------------------------------------------------------------- package index


@dataclass(frozen=True)
class Index:
    """A package index: where twine uploads and where its simple pages are read.

    Attributes:
        upload_url: the upload endpoint (pypiserver: its root; PyPI:
            ``https://upload.pypi.org/legacy/``).
        simple_url: the simple index (default: ``<upload_url>/simple/``, pypiserver's).
    """

    upload_url: str
    simple_url: str

    @staticmethod
    def from_urls(repository_url: str, index_url: str | None = None) -> Index:
        """Build from the upload URL and the optional simple URL.

        Raises:
            ConfigurationError: a URL is not http(s), has no host or a port out of range,
                or carries credentials (the user's flags, checked before any work).
        """
        simple = index_url or repository_url.rstrip("/") + "/simple/"
        for url in (repository_url, simple):
            parse_url(url, ("http", "https"), noun="an http(s) URL",
                      hint="pass the index as http(s)://host[:port]/path")
        return Index(repository_url, simple if simple.endswith("/") else simple + "/")


def _read_auth() -> tuple[str, str] | None:
    user, password = os.environ.get("TWINE_USERNAME"), os.environ.get("TWINE_PASSWORD")
    return (user, password) if user and password else None


def index_files(index: Index, project: str) -> dict[str, str | None]:
    """Return the files the index lists for ``project``: file name -> sha256 (``None``
    when the page gives no sha256), lower-cased (hex is case-insensitive, as the source
    side reads it in :mod:`builder.source.index`).

    Raises:
        BuilderError: the index cannot be reached, answers with an error, or sends a page
            that is not PEP 503 / PEP 691.
    """
    session = requests.Session()
    session.auth = _read_auth()
    try:
        with PyPISimple(endpoint=index.simple_url, session=session) as client:
            page = client.get_project_page(project, timeout=60)
    except NoSuchProjectError:
        return {}
    except requests.exceptions.ConnectionError:
        raise PublishError(f"the package index {index.simple_url} is not reachable",
                           "check --index-url / --repository-url and that the index "
                           "runs") from None
    except requests.exceptions.RequestException as exc:
        raise PublishError(f"the package index {index.simple_url} answered "
                           f"{_status(exc)} for project {project}",
                           "check the URL and the credentials (TWINE_USERNAME / "
                           "TWINE_PASSWORD)") from None
    except ValueError as exc:  # pypi-simple's parse errors (JSON, pydantic) are ValueErrors
        raise PublishError(f"the package index {index.simple_url} sent a malformed page "
                           f"for project {project}: {str(exc).splitlines()[0]}",
                           "check --repository-url names the index's root") from None
    return {p.filename: (p.digests["sha256"].lower() if p.digests.get("sha256") else None)
            for p in page.packages}


def _status(exc: requests.exceptions.RequestException) -> str:
    response = getattr(exc, "response", None)
    return f"HTTP {response.status_code}" if response is not None else type(exc).__name__


def wheel_state(index: Index, path: Path, sha256: str) -> PublishStatus | None:
    """Whether the index already has this exact wheel.

    Returns:
        ``"already-published"`` when it lists the file with this sha256, ``None`` when
        it does not list the file name.

    Raises:
        BuilderError: it lists the same file name with other bytes (or without a sha256
            to compare), or cannot be read.
    """
    project = str(parse_wheel_filename(path.name)[0])
    listed = index_files(index, project)
    if path.name not in listed:
        return None
    theirs = listed[path.name]
    if theirs == sha256:
        return "already-published"
    raise PublishError(
        f"the index already has {path.name} with other bytes (sha256 {theirs or 'not given'}"
        f", ours {sha256}): a published file is never replaced",
        "raise the target's local_label build number (targets.toml) and release again")


def _redact(text: str) -> str:
    secret = os.environ.get("TWINE_PASSWORD")
    return text.replace(secret, "****") if secret else text


def upload_wheel(index: Index, path: Path, sha256: str, reporter: Reporter) -> Published:
    """Upload one wheel with twine, then check the index lists it with our sha256.

    Raises:
        BuilderError: twine failed (the index rejected it, refused the credentials or is
            down: its last line says which), or the index does not list it afterwards.
    """
    reporter.info(f"uploading {path.name} to {index.upload_url}")
    done = subprocess.run(
        [sys.executable, "-m", "twine", "--no-color", "upload", "--non-interactive",
         "--disable-progress-bar", "--repository-url", index.upload_url, str(path)],
        capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}, timeout=1800)
    output = _redact(done.stdout + done.stderr)
    if done.returncode != 0:
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        errors = [line for line in lines if "ERROR" in line or "Error" in line]
        reason = " ".join((errors or lines or ["no output"])[-1:])
        if "Credential not found" in reason:
            raise PublishError(f"no credentials for the index {index.upload_url} (twine: "
                               f"{reason})", "set TWINE_USERNAME and TWINE_PASSWORD, or "
                               "store them in the keyring")
        if "403" in reason or "401" in reason:
            hint = "the index refused the credentials: check TWINE_USERNAME / TWINE_PASSWORD"
        else:
            hint = "the index refused the file; nothing of it was published"
        raise PublishError(f"the index {index.upload_url} rejected {path.name}: {reason}",
                           hint)
    theirs = index_files(index, str(parse_wheel_filename(path.name)[0])).get(path.name, "")
    if theirs != sha256:
        raise PublishError(f"after the upload the index lists {path.name} with sha256 "
                           f"{theirs or 'none'}, not {sha256}",
                           f"check the index at {index.simple_url}")
    return Published("wheel", path.name, index.simple_url, f"sha256:{sha256}", "published")


# ---------------------------------------------------------------- image registry


def registry_auth() -> dict[str, str] | None:
    """Registry credentials from ``SGLANG_SM120_REGISTRY_USERNAME`` / ``..._PASSWORD``;
    ``None``: the engine client's Docker config (``~/.docker/config.json``) decides."""
    user = os.environ.get("SGLANG_SM120_REGISTRY_USERNAME")
    password = os.environ.get("SGLANG_SM120_REGISTRY_PASSWORD")
    return {"username": user, "password": password} if user and password else None


def split_reference(reference: str) -> tuple[str, str]:
    """``registry/repo:tag`` -> (``registry/repo``, ``tag``)."""
    repository, _, tag = reference.rpartition(":")
    if not repository or "/" in tag:
        raise PublishError(f"image reference {reference!r} has no tag",
                           "write it as registry/repository:tag")
    return repository, tag


def _registry_error(reference: str, message: str) -> BuilderError:
    low = message.lower()
    registry = reference.split("/", 1)[0]
    if "unauthorized" in low or "authentication required" in low or "denied" in low:
        return PublishError(f"the registry {registry} refused the credentials for {reference}",
                            "check SGLANG_SM120_REGISTRY_USERNAME / _PASSWORD (or docker "
                            "login)")
    if "connection refused" in low or "no such host" in low or "timeout" in low or \
            "connect:" in low:
        return PublishError(f"the registry {registry} is not reachable",
                            "check --registry and that the registry runs")
    return PublishError(f"the registry {registry} failed for {reference}: {message}",
                        "see the registry's answer")


def tag_digest(client: docker.DockerClient, reference: str,
               auth: dict[str, str] | None) -> str | None:
    """The manifest digest the registry holds for ``reference``; ``None`` if no such tag.

    Raises:
        BuilderError: the registry is down or refuses the credentials.
    """
    try:
        found = client.api.inspect_distribution(reference, auth_config=auth)
    except docker.errors.APIError as exc:
        message = str(exc.explanation or exc)
        if "manifest unknown" in message.lower() or "not found" in message.lower():
            return None
        raise _registry_error(reference, message) from None
    except requests.exceptions.RequestException as exc:
        raise PublishError(f"the engine did not answer about {reference}: {exc}",
                           "check the engine") from None
    return str(found["Descriptor"]["digest"])


def image_state(client: docker.DockerClient, image_id: str, reference: str,
                auth: dict[str, str] | None) -> tuple[PublishStatus | None, str | None]:
    """Whether ``reference`` already holds this image.

    Returns:
        (``"already-published"``, digest) when the tag's digest is one this engine pushed
        or pulled this image as; (``None``, ``None``) when the tag does not exist.

    Raises:
        BuilderError: the tag exists with another digest (never overwritten), or the
            registry is down or refuses the credentials.
    """
    digest = tag_digest(client, reference, auth)
    if digest is None:
        return None, None
    repository, _ = split_reference(reference)
    ours = client.api.inspect_image(image_id).get("RepoDigests") or []
    if f"{repository}@{digest}" in ours:
        return "already-published", digest
    raise PublishError(f"the tag {reference} already exists with digest {digest}, which is "
                       f"not this image ({image_id}): a published tag is never overwritten",
                       "raise the target's local_label build number (targets.toml) and "
                       "release again")


def push_image(client: docker.DockerClient, image_id: str, reference: str,
               auth: dict[str, str] | None, reporter: Reporter) -> str:
    """Push ``image_id`` as ``reference``; read the whole stream; return the pushed digest.

    Raises:
        BuilderError: any error event in the stream (the engine's message), the registry
            refused the credentials or is down, or no digest came back.
    """
    repository, tag = split_reference(reference)
    api = client.api
    api.tag(image_id, repository, tag)
    digest = None
    shown: set[tuple[str, str]] = set()

    def progress(event: dict[str, Any]) -> None:
        status, layer = str(event.get("status") or ""), str(event.get("id") or "")
        if status and (layer, status) not in shown and not event.get("progressDetail"):
            shown.add((layer, status))
            reporter.info(f"{layer}: {status}" if layer else status)

    reporter.info(f"pushing {reference}")
    try:
        events = read_stream(api.push(repository, tag, stream=True, decode=True,
                                      auth_config=auth), progress)
    except StreamError as exc:
        raise _registry_error(reference, f"push failed: {exc}") from None
    except docker.errors.APIError as exc:
        raise _registry_error(reference, str(exc.explanation or exc)) from None
    except requests.exceptions.RequestException as exc:
        raise PublishError(f"the push of {reference} broke off: {exc}",
                           "retry the release; nothing is overwritten") from None
    for event in events:
        aux = event.get("aux")
        if isinstance(aux, dict) and aux.get("Tag") == tag and aux.get("Digest"):
            digest = str(aux["Digest"])
    if digest is None:
        raise PublishError(f"the push of {reference} ended without a digest",
                           "the engine's stream was cut; retry the release")
    return digest


def pull_by_digest(client: docker.DockerClient, repository: str, digest: str,
                   auth: dict[str, str] | None) -> str:
    """Pull ``repository@digest`` and return the image ID it resolves to.

    Raises:
        BuilderError: the pull failed (any error event).
    """
    reference = f"{repository}@{digest}"
    try:
        read_stream(client.api.pull(reference, stream=True, decode=True, auth_config=auth))
        return str(client.api.inspect_image(reference)["Id"])
    except StreamError as exc:
        raise _registry_error(reference, f"pull failed: {exc}") from None
    except docker.errors.APIError as exc:
        raise _registry_error(reference, str(exc.explanation or exc)) from None
