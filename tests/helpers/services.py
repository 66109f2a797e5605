"""Real services for the tests, started here on 127.0.0.1 only, and stopped after.

* :func:`start_docker_engine`: Debian's ``dockerd`` (package ``docker.io``) with
  ``--iptables=false --bridge=none`` on a private socket, storage driver overlay2 (vfs
  where the data root cannot hold overlay mounts), with its own data root, exec root and
  pid file, so several engines can run side by side.
* :func:`start_registry`: Debian's ``docker-registry`` (distribution 2.8) with a fresh
  storage folder; optionally htpasswd authentication or read-only (maintenance mode).
* :func:`start_token_server`: a small registry token service (Docker's token spec: JWTs
  signed RS256 with the signing certificate in ``x5c``), for a registry started with
  ``token=``.
* :func:`push_blob` / :func:`push_manifest`: the registry's own API (OCI distribution),
  for synthetic images and multi-platform indexes.
* :func:`start_package_index`: ``pypiserver`` with ``--disable-fallback``; optionally
  authentication for uploads.
* :func:`start_body_limit_proxy`: a small HTTP proxy that refuses request bodies over a
  size (HTTP 413, like a web server's body limit in front of an index).
* :func:`debian_rootfs` / :func:`import_image` / :func:`push_image`: a minimal Debian
  with Python made by ``debootstrap`` (cached between runs as a tarball, written
  atomically), imported into an engine and pushed to a registry to get a digest.

Missing tools skip the tests that need them, except in CI (``CI=true``), where they fail.
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NoReturn

import docker
import pytest

from tests.helpers.serve import serve_in_thread

DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "python3-pip")
DEBIAN_MIRROR = os.environ.get("SGLANG_SM120_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def need(tool: str, package: str) -> str:
    """Return the path of ``tool``; fail the test without it.

    Args:
        tool: the executable's name.
        package: the Debian package that has it (for the message).
    """
    path = shutil.which(tool) or next(
        (str(p) for p in (Path("/usr/sbin") / tool, Path("/sbin") / tool) if p.exists()), None)
    if path:
        return path
    missing(f"{tool} not found (Debian package {package}; .ci/run installs it)")


def missing(message: str) -> NoReturn:
    """Fail the test: a service it needs cannot be started here. Never a skip, in CI or
    out of it: a test that did not run must not look like one that passed."""
    pytest.fail(message, pytrace=False)


def need_root(what: str) -> None:
    """Fail unless running as root, which ``what`` needs."""
    if os.geteuid() != 0:
        missing(f"{what} needs root")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    """A service process with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @staticmethod
    def start(name: str, argv: list[str], log: Path, env: dict[str, str] | None = None
              ) -> Process:
        """Start ``argv`` with stdout and stderr into ``log``, in its own session."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        return Process(name, popen, log)

    def tail(self, lines: int = 20) -> str:
        """The log's last lines."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_until(self, ready: Callable[[], bool], timeout: float = 60) -> None:
        """Poll ``ready`` until true; fail with the log's tail if the process exits or
        the time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n"
                                   f"{self.tail()}")
            try:
                if ready():
                    return
            except Exception:  # not up yet
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {timeout} s:\n{self.tail()}")

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; only this process."""
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


# ------------------------------------------------------------------ Docker Engine


@dataclass
class DockerEngine:
    """A running ``dockerd`` on a private socket.

    Attributes:
        host: its address, ``unix:///…/docker.sock`` (for ``DOCKER_HOST``,
            ``--docker-host``).
        client: a docker-py client of it (``client.api`` is the low-level API).
        data_root: its data root (images, containers, build cache).
        process: the daemon.
    """

    host: str
    client: docker.DockerClient
    data_root: Path
    process: Process
    run_dir: Path

    @property
    def api(self) -> docker.APIClient:
        """The low-level client."""
        return self.client.api

    @property
    def env(self) -> dict[str, str]:
        """Environment naming this engine (``DOCKER_HOST``)."""
        return {"DOCKER_HOST": self.host}

    def stop(self, *, remove_data: bool = True) -> None:
        """Remove its containers, stop the daemon, and delete its data (unless asked)."""
        try:
            for container in self.api.containers(all=True, quiet=True):
                self.api.remove_container(container["Id"], force=True)
        except docker.errors.DockerException:
            pass
        self.client.close()
        self.process.stop(timeout=60)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if remove_data:
            shutil.rmtree(self.data_root, ignore_errors=True)


STORAGE_DRIVERS = ("overlay2", "vfs")


def start_docker_engine(root: Path) -> DockerEngine:
    """Start ``dockerd`` with no iptables and no bridge, data under ``root``.

    The storage driver is the first of STORAGE_DRIVERS the daemon starts with: overlay2
    shares a layer's files with the layers above it, where vfs copies the whole tree for
    every layer (several GB over the image tests); dockerd refuses overlay2 at start where
    the data root's file system cannot hold overlay mounts (itself an overlay, say), and
    vfs works anywhere. The socket, exec root (containerd's sockets) and pid file go to a
    short folder under /tmp (a unix socket path is limited to 107 bytes).

    Raises:
        RuntimeError: dockerd started with no driver (each one's log tail).
    """
    dockerd = need("dockerd", "docker.io")
    need_root("dockerd")
    failures = []
    for driver in STORAGE_DRIVERS:
        run_dir = Path(tempfile.mkdtemp(prefix="sm120-dockerd-"))
        data_root = root / f"data-{driver}"
        try:
            return _start_dockerd(dockerd, driver, root / f"dockerd-{driver}.log",
                                  data_root, run_dir)
        except RuntimeError as exc:
            failures.append(f"--storage-driver={driver}: {exc}")
            # dockerd bind-mounts its data root on itself and leaves that when its driver
            # fails: unmounted, or the folder could never be deleted (os.path.ismount
            # misses a bind mount within one file system, so umount is simply tried).
            if data_root.is_dir():
                subprocess.run(["umount", str(data_root)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=False)
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(data_root, ignore_errors=True)
    raise RuntimeError("dockerd started with no storage driver:\n" + "\n".join(failures))


def _start_dockerd(dockerd: str, driver: str, log: Path, data_root: Path,
                   run_dir: Path) -> DockerEngine:
    """One start of ``dockerd`` with storage ``driver``; RuntimeError if it exits or is
    not ready in 90 s."""
    sock = run_dir / "docker.sock"
    argv = [dockerd, f"--storage-driver={driver}", "--iptables=false", "--bridge=none",
            "--ip-masq=false", "-H", f"unix://{sock}", "--data-root", str(data_root),
            "--exec-root", str(run_dir / "exec"), "--pidfile", str(run_dir / "docker.pid")]
    # A user's DOCKER_* settings must not leak into the daemon.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    process = Process.start("dockerd", argv, log, env)
    host = f"unix://{sock}"

    def ready() -> bool:
        if not sock.exists():
            return False
        probe = docker.DockerClient(base_url=host, timeout=5)
        try:
            return bool(probe.ping())
        finally:
            probe.close()
    process.wait_until(ready, timeout=90)
    return DockerEngine(host, docker.DockerClient(base_url=host, timeout=900), data_root,
                        process, run_dir)


# ------------------------------------------------------------------ registry


@dataclass
class Registry:
    """A running ``docker-registry`` on 127.0.0.1.

    Attributes:
        host: ``127.0.0.1:PORT`` (the engine treats 127.0.0.0/8 as an insecure
            registry, so plain HTTP works).
        credentials: (user, password) when authentication is on.
        storage: its storage folder.
        process: the registry (``None`` for an address where nothing listens).
    """

    host: str
    credentials: tuple[str, str] | None
    storage: Path
    process: Process | None

    @property
    def url(self) -> str:
        """``http://host``."""
        return f"http://{self.host}"

    def stop(self) -> None:
        """Stop it."""
        if self.process is not None:
            self.process.stop()


def _htpasswd(path: Path, user: str, password: str, *, bcrypt: bool) -> None:
    tool = need("htpasswd", "apache2-utils")
    # -i: the password on standard input, never on a command line.
    flags = "-Bin" if bcrypt else "-in"
    line = subprocess.run([tool, flags, user], input=password, capture_output=True,
                          text=True, check=True).stdout.strip()
    path.write_text(line + "\n")


def start_registry(root: Path, *, credentials: tuple[str, str] | None = None,
                   read_only: bool = False, token: TokenServer | None = None) -> Registry:
    """Start Debian's ``docker-registry`` serving a fresh storage folder on 127.0.0.1.

    Args:
        root: a folder for its config, storage and log.
        credentials: turn on htpasswd (bcrypt) authentication with this user.
        read_only: maintenance read-only mode: every push is refused.
        token: turn on token authentication with this token service instead.
    """
    binary = need("docker-registry", "docker-registry")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    storage = root / "storage"
    config = [
        "version: 0.1",
        "log:",
        "  level: info",
        "  accesslog:",
        "    disabled: true",
        "storage:",
        "  filesystem:",
        f"    rootdirectory: {storage}",
        "  maintenance:",
        "    uploadpurging:",
        "      enabled: false",
        "    readonly:",
        f"      enabled: {'true' if read_only else 'false'}",
        "http:",
        f"  addr: 127.0.0.1:{port}",
    ]
    if credentials:
        _htpasswd(root / "htpasswd", *credentials, bcrypt=True)
        config += ["auth:", "  htpasswd:", "    realm: sm120-test",
                   f"    path: {root / 'htpasswd'}"]
    if token:
        config += ["auth:", "  token:", f"    realm: {token.realm}",
                   f"    service: {token.service}", f"    issuer: {token.issuer}",
                   f"    rootcertbundle: {token.certificate}"]
    (root / "config.yml").write_text("\n".join(config) + "\n")
    process = Process.start("docker-registry", [binary, "serve", str(root / "config.yml")],
                            root / "registry.log")
    process.wait_until(lambda: _http_status(f"http://127.0.0.1:{port}/v2/") in (200, 401))
    return Registry(f"127.0.0.1:{port}", credentials, storage, process)


@dataclass
class TokenServer:
    """A running :func:`start_token_server`.

    Attributes:
        realm: the token endpoint's URL.
        service: the registry's service name (the tokens' audience).
        issuer: the tokens' issuer.
        certificate: PEM file of the signing certificate (the registry's root bundle).
        credentials: the one (user, password) it accepts.
        key: the signing key.
        server: the HTTP server.
        requests: the scopes asked for, in order (with the user, or ``None``).
    """

    realm: str
    service: str
    issuer: str
    certificate: Path
    credentials: tuple[str, str]
    key: object
    der: bytes
    server: ThreadingHTTPServer
    requests: list[tuple[str | None, str]] = field(default_factory=list)

    def token(self, scope: str) -> str:
        """A signed token granting ``scope`` (``repository:NAME:ACTIONS``)."""
        import base64

        import jwt

        kind, name, actions = scope.split(":")
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": self.credentials[0], "aud": self.service,
                  "exp": now + 300, "nbf": now - 10, "iat": now, "jti": os.urandom(8).hex(),
                  "access": [{"type": kind, "name": name, "actions": actions.split(",")}]}
        return jwt.encode(claims, self.key, algorithm="RS256",  # type: ignore[arg-type]
                          headers={"x5c": [base64.b64encode(self.der).decode()]})

    def stop(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def start_token_server(root: Path, credentials: tuple[str, str]) -> TokenServer:
    """Serve registry tokens on 127.0.0.1 (Docker's token spec): ``GET /token?service=…&
    scope=…`` with HTTP Basic ``credentials`` answers ``{"token": JWT}`` granting the
    scope, anything else 401. The signing key and its self-signed certificate are made
    here (``cryptography``), the certificate written under ``root`` for the registry."""
    import base64
    import datetime
    import json
    import urllib.parse

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    root.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sm120-test-token")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = root / "token-cert.pem"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    expected = "Basic " + base64.b64encode(":".join(credentials).encode()).decode()
    holder: list[TokenServer] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            scope = query.get("scope", [""])[0]
            given = self.headers.get("Authorization")
            holder[0].requests.append((given and credentials[0], scope))
            if given != expected or not scope.startswith("repository:"):
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = json.dumps({"token": holder[0].token(scope)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serve_in_thread(server)
    started = TokenServer(f"http://127.0.0.1:{server.server_address[1]}/token",
                          "sm120-test-registry", "sm120-test-issuer", pem, credentials, key,
                          cert.public_bytes(serialization.Encoding.DER), server)
    holder.append(started)
    return started


def push_blob(registry: str, repository: str, data: bytes,
              headers: dict[str, str] | None = None) -> str:
    """Upload a blob monolithically (POST an upload, PUT its bytes); return its digest."""
    import hashlib
    import urllib.parse

    import requests

    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    started = requests.post(f"http://{registry}/v2/{repository}/blobs/uploads/",
                            headers=headers, timeout=30)
    assert started.status_code == 202, started.text
    location = urllib.parse.urljoin(f"http://{registry}/", started.headers["Location"])
    sep = "&" if "?" in location else "?"
    done = requests.put(f"{location}{sep}digest={digest}", data=data, timeout=30,
                        headers={**(headers or {}),
                                 "Content-Type": "application/octet-stream"})
    assert done.status_code == 201, done.text
    return digest


def push_manifest(registry: str, repository: str, reference: str, manifest: dict[str, object],
                  headers: dict[str, str] | None = None) -> tuple[str, int]:
    """PUT a manifest (or index) under a tag; return its digest and size."""
    import hashlib
    import json

    import requests

    body = json.dumps(manifest, sort_keys=True).encode()
    done = requests.put(f"http://{registry}/v2/{repository}/manifests/{reference}",
                        data=body, timeout=30,
                        headers={**(headers or {}), "Content-Type": str(manifest["mediaType"])})
    assert done.status_code == 201, done.text
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    assert done.headers.get("Docker-Content-Digest") == digest
    return digest, len(body)


def push_synthetic_image(registry: str, repository: str, tag: str, *,
                         architecture: str = "amd64", content: str = "",
                         headers: dict[str, str] | None = None) -> tuple[str, int]:
    """Push a one-layer OCI image for linux/``architecture`` whose layer holds ``content``;
    return its manifest's digest and size."""
    import hashlib
    import io
    import json
    import tarfile as tar_module

    raw = io.BytesIO()
    with tar_module.open(fileobj=raw, mode="w") as archive:
        data = content.encode()
        info = tar_module.TarInfo("content.txt")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    layer = raw.getvalue()
    config = json.dumps({"architecture": architecture, "os": "linux",
                         "rootfs": {"type": "layers",
                                    "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
                         "config": {}}).encode()
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": push_blob(registry, repository, config, headers),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": push_blob(registry, repository, layer, headers),
                    "size": len(layer)}]}
    return push_manifest(registry, repository, tag, manifest, headers)


def dead_registry() -> Registry:
    """An address where no registry listens (a free port, nothing started)."""
    return Registry(f"127.0.0.1:{free_port()}", None, Path("/nonexistent"), None)


# ------------------------------------------------------------------ package index


@dataclass
class PackageIndex:
    """A running pypiserver on 127.0.0.1.

    Attributes:
        url: the upload URL (its root, ``http://127.0.0.1:PORT/``).
        packages: the folder it serves.
        credentials: (user, password) uploads need, when authentication is on.
        process: the server (``None`` for an address where nothing listens).
    """

    url: str
    packages: Path
    credentials: tuple[str, str] | None
    process: Process | None

    @property
    def simple_url(self) -> str:
        """The simple index, ``<url>simple/``."""
        return self.url + "simple/"

    def env(self) -> dict[str, str]:
        """``TWINE_USERNAME`` / ``TWINE_PASSWORD`` for it (empty without authentication)."""
        if not self.credentials:
            return {}
        return {"TWINE_USERNAME": self.credentials[0], "TWINE_PASSWORD": self.credentials[1]}

    def stop(self) -> None:
        """Stop it."""
        if self.process is not None:
            self.process.stop()


def start_package_index(root: Path, *, credentials: tuple[str, str] | None = None
                        ) -> PackageIndex:
    """Start pypiserver (``--disable-fallback``) serving a fresh folder on 127.0.0.1.

    Args:
        root: a folder for its packages, password file and log.
        credentials: require this user for uploads (htpasswd, apr1), else no
            authentication at all.
    """
    if importlib.util.find_spec("pypiserver") is None:
        missing("pypiserver is not installed (pip install -e '.[test]')")
    packages = root / "packages"
    packages.mkdir(parents=True, exist_ok=True)
    port = free_port()
    if credentials:
        _htpasswd(root / "htpasswd", *credentials, bcrypt=False)
        auth = ["-P", str(root / "htpasswd"), "-a", "update"]
    else:
        auth = ["-P", ".", "-a", "."]
    argv = [sys.executable, "-m", "pypiserver", "run", "-p", str(port), "-i", "127.0.0.1",
            "--disable-fallback", *auth, str(packages)]
    process = Process.start("pypiserver", argv, root / "pypiserver.log")
    url = f"http://127.0.0.1:{port}/"
    process.wait_until(lambda: _http_status(url + "simple/") == 200)
    return PackageIndex(url, packages, credentials, process)


def dead_index() -> PackageIndex:
    """An address where no index listens."""
    return PackageIndex(f"http://127.0.0.1:{free_port()}/", Path("/nonexistent"), None, None)


# ------------------------------------------------------------------ proxy


@dataclass
class Proxy:
    """A running :func:`start_body_limit_proxy`."""

    url: str
    server: ThreadingHTTPServer
    refused: list[str] = field(default_factory=list)

    def stop(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def start_body_limit_proxy(upstream: str, limit: int) -> Proxy:
    """Forward HTTP to ``upstream`` (``http://127.0.0.1:PORT/``) but answer 413 to any
    request whose body is over ``limit`` bytes, as a web server with a body size limit
    in front of an index does. Listens on 127.0.0.1."""
    target = upstream.removeprefix("http://").rstrip("/")
    refused: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > limit:
                refused.append(self.path)
                body = b"413 Request Entity Too Large\n"
                self.send_response(413, "Request Entity Too Large")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True
                return
            data = self.rfile.read(length) if length else None
            connection = http.client.HTTPConnection(target, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            connection.request(self.command, self.path, body=data, headers=headers)
            response = connection.getresponse()
            payload = response.read()
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            connection.close()

        do_GET = do_POST = do_PUT = do_HEAD = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serve_in_thread(server)
    return Proxy(f"http://127.0.0.1:{server.server_address[1]}/", server, refused)


# ------------------------------------------------------------------ base image


def debian_rootfs(cache: Path, packages: tuple[str, ...] = DEBIAN_PACKAGES) -> Path:
    """A minimal Debian (``debootstrap --variant=minbase``, with ``packages``: Python and pip
    by default) as a tarball, cached in ``cache`` between runs (built in a temporary folder,
    renamed into place when complete; ≈ 40 s and 300 MB the first time)."""
    tarball = cache / f"debian-{DEBIAN_SUITE}-minbase-{'-'.join(packages)}.tar"
    if tarball.is_file():
        return tarball
    debootstrap = need("debootstrap", "debootstrap")
    need_root("debootstrap")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".debootstrap-", dir=cache) as tmp:
        rootfs = Path(tmp) / "rootfs"
        done = subprocess.run([debootstrap, "--variant=minbase",
                               f"--include={','.join(packages)}", DEBIAN_SUITE,
                               str(rootfs), DEBIAN_MIRROR], capture_output=True, text=True,
                              timeout=1200)
        if done.returncode != 0:
            raise RuntimeError(f"debootstrap failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        part = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(part), "."],
                       check=True, timeout=600)
        part.replace(tarball)
    return tarball


def import_image(engine: DockerEngine, tarball: Path, repository: str, tag: str) -> str:
    """``docker import`` a root file system tarball; return the image ID."""
    engine.api.import_image(
        src=str(tarball), repository=repository, tag=tag,
        changes=["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "ENV LANG=C.UTF-8", 'CMD ["python3"]'])
    return str(engine.api.inspect_image(f"{repository}:{tag}")["Id"])


def push_image(engine: DockerEngine, image: str, reference: str,
               auth: dict[str, str] | None = None) -> str:
    """Tag ``image`` as ``reference`` and push it; return the manifest digest (read from
    the stream; any error event raises)."""
    repository, _, tag = reference.rpartition(":")
    engine.api.tag(image, repository, tag)
    digest = None
    for event in engine.api.push(repository, tag, stream=True, decode=True, auth_config=auth):
        if "error" in event or "errorDetail" in event:
            raise RuntimeError(f"push of {reference} failed: {event}")
        aux = event.get("aux")
        if isinstance(aux, dict) and aux.get("Digest"):
            digest = str(aux["Digest"])
    if digest is None:
        raise RuntimeError(f"push of {reference} gave no digest")
    return digest


@dataclass(frozen=True)
class LocalImage:
    """An image imported into the test engine."""

    name: str
    image_id: str
