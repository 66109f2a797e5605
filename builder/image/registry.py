"""Resolve an image tag to its digest through the registry's HTTP API, without pulling.

The OCI distribution spec (``spec.md``, "Pulling manifests"): ``GET
/v2/<name>/manifests/<reference>`` with the manifest media types the client takes in
``Accept``; the registry answers the manifest (or, for a multi-platform image, the image
index / Docker manifest list) and its digest in ``Docker-Content-Digest``, which is the
sha256 of the body (checked here). Authentication as Docker's registry token spec
(``docs/spec/auth/token.md`` of distribution): a ``401`` with ``WWW-Authenticate: Bearer
realm=…,service=…,scope=…`` sends the client to the realm for a token (with ``docker
login``'s credentials when there are some); ``Basic`` challenges take the credentials
directly. Credentials come from Docker's own configuration (``$DOCKER_CONFIG/config.json``
with its credential helpers), read by docker-py's :mod:`docker.auth`.

Registries on 127.0.0.0/8 and ``localhost`` are reached over plain HTTP, as the Docker
Engine does (they are insecure registries by default); every other one over HTTPS.

Every answer is checked before anything is taken from it: its size (at most
:data:`MAX_MANIFEST_BYTES`, containerd's limit for a manifest, ``remotes/docker`` in
containerd 1.7), its identity (a body's sha256 is its digest; a ``HEAD`` names the
digest asked for), and its shape (an index's ``manifests`` is a list of descriptors
with a ``sha256:<64 hex>`` digest, an integer size and a platform object, the OCI image
spec's ``descriptor.md`` and ``image-index.md``). A malformed answer is one
:class:`VerificationError` (exit 1), never a traceback, and never a pin; a registry that
cannot be reached, refuses or lacks the tag is a :class:`SourceError` (exit 4).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from typing import Any

import docker.auth
import docker.errors
import requests

from builder.core.address import parse_host_port
from builder.core.errors import ConfigurationError, SourceError, VerificationError
from builder.core.userfiles import parse_json

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
ACCEPT = ", ".join(INDEX_TYPES + MANIFEST_TYPES)
DOCKER_HUB_API = "registry-1.docker.io"
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
# A pin is a sha256 digest (the OCI image spec's registered algorithm, lower-case hex).
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# containerd refuses a manifest over 4 MiB (``MaxManifestSize``, remotes/docker, 1.7).
MAX_MANIFEST_BYTES = 4 << 20


# The reference grammar of the distribution project (reference/regexp.go, distribution
# 2.8): path components of lowercase alphanumerics joined by one '.', one or two '_', or
# dashes, and a tag of at most 128 word characters, dots and dashes, not starting with
# either. Its domain (HOST[:PORT]) is builder.core.address.parse_host_port's.
_PATH = re.compile(r"^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
                   r"(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_NAME_HINT = ("write it as [HOST[:PORT]/]PATH:TAG, PATH in lowercase letters, digits and "
              "separators . _ - (the OCI distribution reference grammar)")


def check_registry(host: str) -> str:
    """``host`` if it is a registry address: a domain or ``[IPv6]``, with a port from 1 to
    65535 if one is given (distribution's reference grammar).

    Raises:
        ConfigurationError: it is not.
    """
    return parse_host_port(host, noun="a registry address",
                           hint="write HOST or HOST:PORT (a port from 1 to 65535), e.g. "
                                "localhost:5000 or ghcr.io").text


def check_repository(path: str) -> str:
    """``path`` if it is a repository path (distribution's reference grammar).

    Raises:
        ConfigurationError: it is not.
    """
    if not _PATH.match(path):
        raise ConfigurationError(f"{path!r} is not a repository path",
                                 "write lowercase letters, digits and separators . _ -, "
                                 "components joined by /, e.g. sglang-sm120 or team/sglang")
    return path


@dataclass(frozen=True)
class ImageName:
    """A tagged image name split as the Docker Engine splits it.

    Attributes:
        registry: the registry host as written (``docker.io`` when none is).
        repository: its path there (``library/`` added for Docker Hub's official images).
        tag: the tag.
    """

    registry: str
    repository: str
    tag: str

    @staticmethod
    def parse(name: str) -> ImageName:
        """Split ``[REGISTRY/]PATH:TAG`` (docker-py's rules for the registry part).

        Raises:
            BuilderError: no tag, a digest instead of one, or a name outside the reference
                grammar (a registry, path or tag it does not allow).
        """
        if "@" in name:
            raise ConfigurationError(f"{name!r} already names a digest",
                                     "write the tag in the pins file's name; the digest goes "
                                     "in its digest key")
        path, colon, tag = name.rpartition(":")
        if not colon or "/" in tag or not tag:
            raise ConfigurationError(f"image name {name!r} has no tag", "write it as NAME:TAG")
        if not _TAG.match(tag):
            raise ConfigurationError(f"image name {name!r}: tag {tag!r} is not a tag", _NAME_HINT)
        first, slash, rest = path.partition("/")
        # docker's rule for the first component: a registry if it has '.' or ':' or is
        # localhost (docker.auth.resolve_repository_name, docker-py 7).
        if slash and ("." in first or ":" in first or first == "localhost"):
            try:
                check_registry(first)
            except ConfigurationError:
                raise ConfigurationError(f"image name {name!r}: {first!r} is not a registry "
                                         "address", _NAME_HINT) from None
            repository_path = rest
        else:
            repository_path = path
        if not _PATH.match(repository_path):
            raise ConfigurationError(f"image name {name!r}: {repository_path!r} is not a "
                                     "repository path", _NAME_HINT)
        registry, repository = docker.auth.resolve_repository_name(path)
        if registry in ("docker.io", "index.docker.io") and "/" not in repository:
            repository = f"library/{repository}"
        return ImageName(registry, repository, tag)

    @property
    def base_url(self) -> str:
        """``scheme://host`` of the registry's API."""
        host = DOCKER_HUB_API if self.registry in ("docker.io", "index.docker.io") \
            else self.registry
        return f"{'http' if _loopback(host) else 'https'}://{host}"


def _loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Resolution:
    """What a tag points at now.

    Attributes:
        digest: the manifest for ``platform`` (the tag's own digest when it is a single
            manifest).
        index_digest: the index / manifest list the tag points at, ``""`` if none.
        platform: ``os/architecture`` of ``digest`` (``""`` when a single manifest does
            not say; the image config has it, not read here).
        media_type: the media type the tag's manifest was served as.
    """

    digest: str
    index_digest: str
    platform: str
    media_type: str


class RegistryClient:
    """One repository's manifests, with the registry's authentication handled.

    Args:
        name: the image name (its registry and repository).
        timeout: seconds per HTTP request.
        docker_config: folder of Docker's ``config.json`` (``None``: ``$DOCKER_CONFIG`` or
            ``~/.docker``).
    """

    def __init__(self, name: ImageName, *, timeout: float = 30,
                 docker_config: str | None = None) -> None:
        self.name = name
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "sglang-sm120-builder"
        self._authorization: str | None = None
        config_path = f"{docker_config}/config.json" if docker_config else None
        try:
            auth = docker.auth.load_config(config_path).resolve_authconfig(name.registry)
        except docker.errors.DockerException as exc:
            raise ConfigurationError(f"cannot read Docker's credentials for {name.registry}: "
                                     f"{exc}", "check ~/.docker/config.json (docker login)"
                                     ) from None
        self.credentials: tuple[str, str] | None = None
        # docker-py's keys: username/password from "auth", Username/Secret from helpers.
        auth = {k.lower(): v for k, v in (auth or {}).items()}
        user, secret = auth.get("username"), auth.get("password") or auth.get("secret")
        if user:
            self.credentials = (str(user), str(secret or ""))

    def _where(self) -> str:
        return f"{self.name.registry}/{self.name.repository}"

    def _send(self, method: str, url: str, headers: dict[str, str]) -> requests.Response:
        if self._authorization:
            headers = {**headers, "Authorization": self._authorization}
        try:
            return self.session.request(method, url, headers=headers, timeout=self.timeout,
                                        stream=True)
        except requests.RequestException as exc:
            raise SourceError(f"registry {self.name.registry} is not reachable: "
                              f"{type(exc).__name__}: {exc}",
                              "check the network (and a proxy)"
                              ) from None

    def _authenticate(self, challenge: str) -> None:
        scheme, _, rest = challenge.partition(" ")
        params = dict(_CHALLENGE.findall(rest))
        if scheme.lower() == "basic":
            if not self.credentials:
                raise SourceError(f"registry {self.name.registry} needs a login",
                                  f"docker login {self.name.registry}")
            self._authorization = requests.auth._basic_auth_str(*self.credentials)
            return
        if scheme.lower() != "bearer" or "realm" not in params:
            raise SourceError(f"registry {self.name.registry} asks for an authentication "
                              f"this client does not speak: {challenge!r}",
                              "use docker-py / the Docker CLI to resolve this image")
        query = {"service": params.get("service", ""),
                 "scope": params.get("scope", f"repository:{self.name.repository}:pull")}
        try:
            answer = self.session.get(params["realm"], params=query, timeout=self.timeout,
                                      auth=self.credentials)
        except requests.RequestException as exc:
            raise SourceError(f"the token service of {self.name.registry} "
                              f"({params['realm']}) is not reachable: {exc}",
                              "check the network") from None
        if answer.status_code in (401, 403):
            raise SourceError(f"the token service of {self.name.registry} refused "
                              f"{'the credentials' if self.credentials else 'anonymous pull'}"
                              f" (HTTP {answer.status_code})",
                              f"docker login {self.name.registry} with an account that "
                              "may pull it")
        try:
            body = parse_json(answer.content)  # a key named twice is no answer
            token = body.get("token") or body.get("access_token")
        except (ValueError, AttributeError, RecursionError):
            token = None
        if answer.status_code != 200:
            raise SourceError(f"the token service of {self.name.registry} gave no token "
                              f"(HTTP {answer.status_code})", "try again later")
        if not isinstance(token, str) or not token:
            raise VerificationError(f"the token service of {self.name.registry} answered "
                                    "HTTP 200 without a token", "the service is not a "
                                    "registry token service; check the registry's realm")
        self._authorization = f"Bearer {token}"

    def manifest(self, reference: str, method: str = "GET") -> tuple[requests.Response, str]:
        """Fetch (``GET``) or check (``HEAD``) a manifest by tag or digest.

        Args:
            reference: a tag or ``sha256:…``.
            method: ``GET`` or ``HEAD``.

        Returns:
            the response and its digest (checked against the body on ``GET``).

        Raises:
            BuilderError: unreachable, refused, not found, or a body that does not match
                its digest.
        """
        url = f"{self.name.base_url}/v2/{self.name.repository}/manifests/{reference}"
        headers = {"Accept": ACCEPT}
        response = self._send(method, url, headers)
        if response.status_code == 401 and "WWW-Authenticate" in response.headers:
            self._authenticate(response.headers["WWW-Authenticate"])
            response = self._send(method, url, headers)
        what = f"{self._where()}:{reference}" if not reference.startswith("sha256:") \
            else f"{self._where()}@{reference}"
        if response.status_code in (401, 403):
            whose = f"user {self.credentials[0]!r}" if self.credentials else "anonymous pull"
            raise SourceError(f"registry {self.name.registry} refused {whose} access to "
                              f"{what} (HTTP {response.status_code})",
                              f"docker login {self.name.registry} with an account that may "
                              "pull it")
        if response.status_code == 404:
            raise SourceError(f"{what} does not exist in its registry (HTTP 404)",
                              "check the tag in the pins file (upstream may have renamed it)")
        if response.status_code != 200:
            raise SourceError(f"registry {self.name.registry} answered HTTP "
                              f"{response.status_code} for {what}", "try again later")
        digest = response.headers.get("Docker-Content-Digest", "")
        if method == "GET":
            self._read_capped(response, what)
            actual = "sha256:" + hashlib.sha256(response.content).hexdigest()
            if digest and digest != actual:
                raise VerificationError(f"registry {self.name.registry} served {what} with digest "
                                        f"{digest} but its body hashes to {actual}",
                                        "a proxy may be rewriting it; check the proxy, "
                                        "do not pin it")
            digest = actual
        else:
            response.close()
        if not digest:
            raise VerificationError(f"registry {self.name.registry} sent no digest for {what}",
                                    "resolve it with GET")
        if reference.startswith("sha256:") and digest != reference:
            raise VerificationError(f"registry {self.name.registry} answered {what} with another "
                                    f"manifest ({digest})", "the registry (or a proxy) is "
                                    "serving the wrong content; do not pin it")
        return response, digest

    def _read_capped(self, response: requests.Response, what: str,
                     cap: int = MAX_MANIFEST_BYTES) -> None:
        """Read the streamed body into ``response.content``, refusing more than ``cap``.

        Raises:
            BuilderError: the declared or the real size is over ``cap``.
        """
        too_big = VerificationError(f"registry {self.name.registry} sent over {cap} bytes for "
                                    f"{what} (a manifest is at most {cap} bytes, as containerd "
                                    "takes)", "the registry is not serving a manifest; check "
                                    "the image name")
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > cap:
            response.close()
            raise too_big
        try:
            body = response.raw.read(cap + 1, decode_content=True)
        except (requests.RequestException, OSError) as exc:
            raise SourceError(f"registry {self.name.registry}: reading {what} failed: "
                              f"{type(exc).__name__}: {exc}", "try again") from None
        finally:
            response.close()
        if len(body) > cap:
            raise too_big
        response._content = body  # what .content and .json() then read

    def blob_json(self, digest: str) -> dict[str, Any]:
        """A small JSON blob (an image config) by digest, checked against it.

        Raises:
            BuilderError: refused, missing, not JSON, or not matching its digest.
        """
        if not DIGEST.fullmatch(digest):
            raise VerificationError(f"{self._where()}: a manifest without a sha256 config digest "
                                    f"({digest!r})", "the registry's manifest is malformed")
        url = f"{self.name.base_url}/v2/{self.name.repository}/blobs/{digest}"
        response = self._send("GET", url, {})
        if response.status_code != 200:
            response.close()
            raise SourceError(f"registry {self.name.registry} answered HTTP "
                              f"{response.status_code} for the config blob {digest} of "
                              f"{self._where()}", "try again later")
        self._read_capped(response, f"the config blob {digest} of {self._where()}")
        if "sha256:" + hashlib.sha256(response.content).hexdigest() != digest:
            raise VerificationError(f"{self._where()}: config blob {digest} does not match its "
                                    "digest", "a proxy may be rewriting it; check the proxy, "
                                    "do not pin it")
        return _json_object(response, f"{self._where()}: config blob {digest} is not JSON",
                            "the registry's manifest is malformed")


def _platform(entry: dict[str, Any]) -> str:
    platform = entry.get("platform") or {}
    if not isinstance(platform, dict):
        return ""
    text = f"{platform.get('os', '')}/{platform.get('architecture', '')}"
    return text + (f"/{platform['variant']}" if platform.get("variant") else "")


def _descriptors(name: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """An index's ``manifests``, every entry checked as an OCI descriptor with a platform.

    Raises:
        BuilderError: ``manifests`` is not a list, or an entry is not an object with a
            ``sha256:<64 hex>`` digest, a non-negative integer size and a platform object
            with string ``os`` and ``architecture``.
    """
    entries = body.get("manifests")
    hint = "the registry serves a malformed image index; pin another tag or registry"
    if not isinstance(entries, list):
        raise VerificationError(f"{name}: the image index's manifests is a "
                                f"{type(entries).__name__}, not a list", hint)
    for number, entry in enumerate(entries, 1):
        where = f"{name}: image index entry #{number}"
        if not isinstance(entry, dict):
            raise VerificationError(f"{where} is not an object", hint)
        digest, size = entry.get("digest"), entry.get("size")
        if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
            raise VerificationError(f"{where}: digest {digest!r} is not sha256:<64 hex>", hint)
        if not isinstance(size, int) or isinstance(size, bool) or not \
                0 <= size <= MAX_MANIFEST_BYTES:
            raise VerificationError(f"{where}: size {size!r} is not a manifest's size "
                                    f"(0..{MAX_MANIFEST_BYTES})", hint)
        platform = entry.get("platform")
        if platform is not None and not (
                isinstance(platform, dict)
                and all(isinstance(platform.get(k), str) for k in ("os", "architecture"))):
            raise VerificationError(f"{where}: platform {platform!r} is not an object with os "
                                    "and architecture", hint)
    return entries


def resolve(name: str, *, platform: str = "linux/amd64", timeout: float = 30,
            docker_config: str | None = None) -> Resolution:
    """Resolve ``name`` (``[REGISTRY/]PATH:TAG``) to digests, pulling nothing.

    Args:
        name: the tagged image name.
        platform: the platform whose manifest to pick from an image index.
        timeout: seconds per HTTP request.
        docker_config: folder of Docker's ``config.json`` (``None``: Docker's default).

    Returns:
        the :class:`Resolution`.

    Raises:
        BuilderError: the registry is unreachable or refuses, the tag does not exist, the
            index has no manifest for ``platform``, or the answer is not a manifest.
    """
    image = ImageName.parse(name)
    client = RegistryClient(image, timeout=timeout, docker_config=docker_config)
    response, digest = client.manifest(image.tag)
    media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
    body = _json_object(response, f"{name}: the registry's answer is not a JSON manifest",
                        "check the registry address")
    media_type = body.get("mediaType") or media_type
    if media_type not in INDEX_TYPES + MANIFEST_TYPES:
        raise VerificationError(f"{name}: the registry's answer is a {media_type!r}, not an OCI "
                                "or Docker v2 manifest or index",
                                "pin an image pushed with a current Docker or buildkit")
    if media_type not in INDEX_TYPES and "manifests" not in body:
        # A single manifest: its platform is in the image config it points at.
        config = body.get("config")
        config = config if isinstance(config, dict) else {}
        found = _platform({"platform": client.blob_json(str(config.get("digest", "")))})
        if found.split("/")[:2] != platform.split("/")[:2]:
            raise SourceError(f"{name} is a single-platform image for {found}, not "
                              f"{platform}", "pin the tag of the platform the build uses")
        return Resolution(digest, "", found, media_type)
    entries = _descriptors(name, body)
    matches = [entry for entry in entries if _platform(entry) == platform]
    if not matches:
        offered = sorted({_platform(e) for e in entries if _platform(e)})
        raise SourceError(f"{name} is a multi-platform image without {platform} (it has "
                          f"{', '.join(offered) or 'none'})",
                          "pin another tag, or the build's platform")
    chosen = str(matches[0].get("digest", ""))
    # The platform manifest must exist too: an index may list one the registry lost.
    client.manifest(chosen, "HEAD")
    return Resolution(chosen, digest, platform, media_type)


def _json_object(response: requests.Response, cause: str, hint: str) -> dict[str, Any]:
    """The response's body as a JSON object.

    Raises:
        BuilderError: ``cause`` and ``hint``, when the body is not JSON or not an object.
    """
    try:
        data = parse_json(response.content)  # a key named twice is not an object
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise VerificationError(cause, hint)
    return data
