"""Real services for the tests, started here on 127.0.0.1 only, and stopped after.

* :func:`start_docker_engine`: Debian's ``dockerd`` (package ``docker.io``) with
  ``--storage-driver=vfs --iptables=false --bridge=none`` on a private socket, with its
  own data root, exec root and pid file, so several engines can run side by side.
* :func:`start_registry`: Debian's ``docker-registry`` (distribution 2.8) with a fresh
  storage folder; optionally htpasswd authentication or read-only (maintenance mode).
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
import threading
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


def start_docker_engine(root: Path) -> DockerEngine:
    """Start ``dockerd`` with vfs storage, no iptables and no bridge, data under ``root``.

    The socket, exec root (containerd's sockets) and pid file go to a short folder
    under /tmp (a unix socket path is limited to 107 bytes).
    """
    dockerd = need("dockerd", "docker.io")
    need_root("dockerd")
    run_dir = Path(tempfile.mkdtemp(prefix="sm120-dockerd-"))
    sock = run_dir / "docker.sock"
    data_root = root / "data"
    argv = [dockerd, "--storage-driver=vfs", "--iptables=false", "--bridge=none",
            "--ip-masq=false", "-H", f"unix://{sock}", "--data-root", str(data_root),
            "--exec-root", str(run_dir / "exec"), "--pidfile", str(run_dir / "docker.pid")]
    # A user's DOCKER_* settings must not leak into the daemon.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    process = Process.start("dockerd", argv, root / "dockerd.log", env)
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
                   read_only: bool = False) -> Registry:
    """Start Debian's ``docker-registry`` serving a fresh storage folder on 127.0.0.1.

    Args:
        root: a folder for its config, storage and log.
        credentials: turn on htpasswd (bcrypt) authentication with this user.
        read_only: maintenance read-only mode: every push is refused.
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
    (root / "config.yml").write_text("\n".join(config) + "\n")
    process = Process.start("docker-registry", [binary, "serve", str(root / "config.yml")],
                            root / "registry.log")
    process.wait_until(lambda: _http_status(f"http://127.0.0.1:{port}/v2/") in (200, 401))
    return Registry(f"127.0.0.1:{port}", credentials, storage, process)


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
    threading.Thread(target=server.serve_forever, daemon=True).start()
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
