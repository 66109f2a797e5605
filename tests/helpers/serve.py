"""A static folder served on 127.0.0.1 (a simple index for the upstream check)."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PEP691_JSON = "application/vnd.pypi.simple.v1+json"


@contextmanager
def serve_directory(root: Path, *, json_pages: bool = False) -> Iterator[str]:
    """Serve ``root`` over HTTP on 127.0.0.1 (``http.server``); yield its base URL.

    With ``json_pages`` a folder's ``index.html`` is sent as PEP 691 JSON (its content
    must be JSON), as PyPI answers a client asking for JSON.
    """
    class Handler(http.server.SimpleHTTPRequestHandler):
        def guess_type(self, path: str | os.PathLike[str]) -> str:
            if json_pages and str(path).endswith("index.html"):
                return PEP691_JSON
            return super().guess_type(path)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
