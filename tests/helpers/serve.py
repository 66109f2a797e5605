"""A static folder served on 127.0.0.1 (a simple index for the upstream check)."""

from __future__ import annotations

import functools
import http.server
import os
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PEP691_JSON = "application/vnd.pypi.simple.v1+json"


def serve_in_thread(server: socketserver.BaseServer) -> threading.Thread:
    """Start ``server.serve_forever`` in a daemon thread that stops soon after ``shutdown()``.

    ``shutdown()`` waits for the serving loop to look at its flag again, every
    ``poll_interval`` seconds: 0.5 s by default (``socketserver``, Python 3.11), paid by
    every test that stops a server; 0.05 s here.

    Args:
        server: a bound server (``http.server.ThreadingHTTPServer`` ...).

    Returns:
        The started thread.
    """
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    return thread


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
    serve_in_thread(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
