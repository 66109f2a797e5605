"""A registry on 127.0.0.1 (``http.server``) serving bodies built by the test: the
``hostile`` fixture and the image index bodies it serves."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.helpers.serve import serve_in_thread

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


MAX_MANIFEST_BYTES = 4 << 20  # containerd's MaxManifestSize (remotes/docker, 1.7)


INDEX = "application/vnd.oci.image.index.v1+json"


MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


CONFIG = json.dumps({"architecture": "amd64", "os": "linux"}).encode()


CHILD = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST, "layers": [],
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               "digest": digest(CONFIG), "size": len(CONFIG)}}).encode()


GOOD_ENTRY = {"mediaType": MANIFEST, "digest": digest(CHILD), "size": len(CHILD),
              "platform": {"os": "linux", "architecture": "amd64"}}


def index(manifests: Any, **extra: Any) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests,
                       **extra}).encode()


class Hostile:
    """What the registry serves: the tag's body, and the answer to a child's ``HEAD``."""

    def __init__(self) -> None:
        self.tag_body = index([GOOD_ENTRY])
        self.head_digest: Callable[[str], str] = lambda ref: ref


@pytest.fixture
def hostile() -> Iterator[tuple[Hostile, str]]:
    """A registry on 127.0.0.1 serving ``lib/base:v1`` from a :class:`Hostile`."""
    state = Hostile()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def send(self, body: bytes, kind: str, dig: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Docker-Content-Digest", dig)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "GET":
                # The client may stop reading (the size cap).
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            ref = self.path.rsplit("/", 1)[1]
            if self.path.endswith("/manifests/v1"):
                return self.send(state.tag_body, INDEX, digest(state.tag_body))
            if "/manifests/" in self.path:
                return self.send(CHILD, MANIFEST, state.head_digest(ref))
            if "/blobs/" in self.path and ref == digest(CONFIG):
                return self.send(CONFIG, "application/octet-stream", ref)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serve_in_thread(server)
    yield state, f"127.0.0.1:{server.server_address[1]}/lib/base:v1"
    server.shutdown()
    server.server_close()
