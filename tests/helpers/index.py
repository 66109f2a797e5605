"""A simple index on 127.0.0.1 (PEP 691 JSON, byte ranges) holding the real 0.5.13 and
0.5.16 wheels and a stand-in torch wheel, and a project whose targets.toml is
hand-written: the fixtures of the add-target tests (``index_root``, ``index``,
``project``)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import os
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tests.helpers.releases import MATRIX_RELEASES
from tests.helpers.serve import serve_in_thread

TORCH_WHEEL = "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl"


PEP691 = "application/vnd.pypi.simple.v1+json"


HEAD = """# A hand-written file: this comment, the order and the spacing must survive.
default = "sglang-0.5.12"

[[target]]
name = "sglang-0.5.12"   # aligned comment
upstream_version = "0.5.12.post1"
local_label = "sm120.1"
series = "{series}"
prefer = "wheel"
cuda_lane = "13.0"
arch_list = ["12.0f"]

[[target.source]]
kind = "wheel"
project = "sglang"
version = "0.5.12.post1"
filename = "sglang-0.5.12.post1-cp311-cp311-manylinux_2_34_x86_64.whl"
sha256 = "{sha}"
"""


def handler(root: Path, ranges: bool) -> type[http.server.SimpleHTTPRequestHandler]:
    class Handler(http.server.SimpleHTTPRequestHandler):
        """Static files; ``index.html`` as PEP 691 JSON; ``Range: bytes=`` honoured (as
        PyPI's file host does) unless ``ranges`` is false."""

        def guess_type(self, path: str | os.PathLike[str]) -> str:
            return PEP691 if str(path).endswith("index.html") else "application/octet-stream"

        def send_head(self) -> io.BytesIO | None:  # type: ignore[override]
            spec = self.headers.get("Range")
            path = Path(self.translate_path(self.path))
            if not ranges or not spec or not path.is_file():
                return super().send_head()  # type: ignore[return-value]
            data = path.read_bytes()
            first, last = re.fullmatch(r"bytes=(\d*)-(\d*)", spec).groups()  # type: ignore[union-attr]
            start = len(data) - int(last) if not first else int(first)
            end = len(data) - 1 if not first or not last else min(int(last), len(data) - 1)
            start = max(start, 0)
            self.send_response(206)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            return io.BytesIO(data[start:end + 1])

        def log_message(self, *args: object) -> None:
            pass

    return functools.partial(Handler, directory=str(root))  # type: ignore[return-value]


def serve(root: Path, ranges: bool) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler(root, ranges))
    serve_in_thread(server)
    return server, f"http://127.0.0.1:{server.server_address[1]}/simple"


def page(root: Path, project: str, files: list[tuple[str, str]]) -> None:
    page = root / "simple" / project
    page.mkdir(parents=True)
    page.joinpath("index.html").write_text(json.dumps({
        "meta": {"api-version": "1.1"}, "name": project,
        "files": [{"filename": name, "url": f"../../files/{name}", "hashes": {"sha256": sha},
                   "yanked": False} for name, sha in files]}))


def build_index(root: Path, matrix_files: dict[str, Path]) -> None:

    (root / "files").mkdir(parents=True)
    listed = []
    for version in ("0.5.13", "0.5.16"):
        wheel = matrix_files[version]
        (root / "files" / wheel.name).symlink_to(wheel)
        listed.append((wheel.name, MATRIX_RELEASES[version].sha256))
    page(root, "sglang", listed)
    torch = root / "files" / TORCH_WHEEL
    with zipfile.ZipFile(torch, "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr("torch/__init__.py", "")
        out.writestr("torch/lib/padding.bin", os.urandom(300_000))  # ranges must matter
        out.writestr("torch-2.11.0.dist-info/METADATA",
                     (REPO / "tests/data/torch-2.11.0-METADATA").read_text())
    page(root, "torch", [(TORCH_WHEEL, hashlib.sha256(torch.read_bytes()).hexdigest())])


@pytest.fixture(scope="module")
def index_root(matrix_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
               ) -> Path:
    root = tmp_path_factory.mktemp("index")
    build_index(root, matrix_files)
    return root


@pytest.fixture
def index(index_root: Path) -> Iterator[str]:
    server, url = serve(index_root, ranges=True)
    yield url
    server.shutdown()
    server.server_close()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "targets.toml").write_text(HEAD.format(
        series=REPO / "patches" / "series.toml",
        sha=MATRIX_RELEASES["0.5.12.post1"].sha256))
    return root
