"""Downloads that survive a flaky network: retried, resumed by HTTP range, verified.

One ``requests`` session with urllib3's ``Retry`` (exponential backoff on connection
errors, read errors and HTTP 429/5xx, honouring ``Retry-After``) serves the index pages
and the files. A file is streamed into a partial file in the cache
(``<cache>/partial/<sha256>.part``); when the connection drops mid-file the next attempt
asks for the rest with ``Range: bytes=N-`` (RFC 9110 section 14) and appends, or starts
over when the server ignores the range (HTTP 200). The whole file's sha256 is compared
with the pin at the end: a mismatch removes the partial file and fails.

One partial file has one writer: a command holds an exclusive ``flock`` on it
(:func:`partial_lock`) from before it looks for the cache entry to after the entry is in
place. A second command fetching the same file into the same cache waits for that lock,
then finds the first one's entry, rather than writing the file the first one is writing
or renaming away. A killed writer's lock goes with its process: the next run resumes its
bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from builder.core.address import file_name, local_path
from builder.core.address import scheme as url_scheme
from builder.core.cache import sha256_file
from builder.core.errors import BuilderError, ConfigurationError, SourceError, VerificationError
from builder.core.progress import Reporter

#: Seconds to wait to connect and between two reads.
TIMEOUT_S = 60
#: Retries of one request when ``PIP_RETRIES`` does not say (pip's default).
DEFAULT_RETRIES = 5
#: Attempts at one file when the connection drops mid-body (each resumes).
RESUME_ATTEMPTS = 6
#: Seconds before the second attempt; each later one waits twice as long, at most 4 s.
RESUME_BACKOFF_S = 0.25
_CHUNK = 1 << 16


def session() -> Any:
    """The process's retrying ``requests.Session`` (imported lazily: it is slow to load).

    Returns:
        A session whose HTTP(S) adapters retry ``PIP_RETRIES`` times (pip's own variable
        for its ``--retries``; default 5, as pip's) with backoff (0.5 s, 1 s, 2 s, ...) on
        connection errors and on HTTP 429, 500, 502, 503 and 504.

    Raises:
        ConfigurationError: ``PIP_RETRIES`` is not a whole number from 0 to 100.
    """
    text = os.environ.get("PIP_RETRIES", "").strip() or str(DEFAULT_RETRIES)
    if not text.isdigit() or int(text) > 100:
        raise ConfigurationError(f"PIP_RETRIES={text!r} is not a number of retries",
                                 "set it to a whole number from 0 to 100, or unset it")
    return _session(int(text))


@lru_cache(maxsize=4)
def _session(tries: int) -> Any:
    """One session per retry count (a process keeps its connections)."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    retry = Retry(total=tries, connect=tries, read=tries, status=tries, backoff_factor=0.5,
                  status_forcelist=(429, 500, 502, 503, 504),
                  allowed_methods=frozenset({"GET", "HEAD"}),
                  respect_retry_after_header=True, raise_on_status=False)
    client = requests.Session()
    adapter = HTTPAdapter(max_retries=retry)
    client.mount("http://", adapter)
    client.mount("https://", adapter)
    client.headers["User-Agent"] = "sglang-sm120-builder"
    return client


def unreachable(url: str, exc: BaseException) -> BuilderError:
    """The one error for a URL that could not be reached after the retries."""
    reason = getattr(exc, "reason", None) or exc
    return SourceError(f"could not reach {url}: {reason}",
                       "check the network, or pass --index-url for a reachable index")


@contextlib.contextmanager
def partial_lock(partial: Path, reporter: Reporter) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the partial file ``partial`` (made empty if missing)
    for a block that may download into it.

    A writer that finishes renames the file away while it holds the lock; a command that
    waited then finds the name missing or another file under it, and opens it again. An
    empty partial file the block left (nothing was downloaded) is removed.

    Args:
        partial: the partial file of one download.
        reporter: progress output (a line when another command holds it).

    Yields:
        Nothing; the lock is held until the block ends.
    """
    partial.parent.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waited:
                    reporter.info(f"Waiting for another command's download of {partial.name}")
                    waited = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(partial, fd):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # renamed away by the writer waited for: open the name again
    try:
        yield
    finally:
        try:
            if _same_file(partial, fd) and os.fstat(fd).st_size == 0:
                partial.unlink()
        finally:
            os.close(fd)  # releases the lock


def _same_file(path: Path, fd: int) -> bool:
    """Whether ``path`` names the file open as ``fd`` (not a file made since)."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def download(url: str, destination: Path, sha256: str, partial: Path,
             reporter: Reporter) -> None:
    """Fetch ``url`` into ``destination``, resuming ``partial`` and checking ``sha256``.

    Args:
        url: ``https://``, ``http://`` or ``file://``.
        destination: the final file (written only once the digest matched).
        sha256: the pinned hex sha256.
        partial: where the bytes collect meanwhile; kept across runs when a download is
            interrupted, so the next run resumes it. A caller that shares it with other
            commands holds :func:`partial_lock` on it.
        reporter: progress output.

    Raises:
        BuilderError: the URL is unreachable or answers with an error after the retries,
            or the file's sha256 is not ``sha256`` (the partial file is removed).
    """
    partial.parent.mkdir(parents=True, exist_ok=True)
    scheme = url_scheme(url)
    if scheme == "file":
        _copy_local(url, partial, reporter)
    elif scheme in ("http", "https"):
        _fetch_http(url, partial, reporter)
    else:
        raise ConfigurationError(f"{url!r} is not a URL",
                                 "give an https://, http:// or file:// URL")
    actual = sha256_file(partial)
    if actual != sha256:
        partial.unlink(missing_ok=True)
        raise VerificationError(f"sha256 mismatch for {destination.name} from {url}: got {actual},"
                                f" pinned {sha256}",
                                "the file changed upstream or the pin is wrong; nothing was "
                                "unpacked")
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial.replace(destination)


def _copy_local(url: str, partial: Path, reporter: Reporter) -> None:
    path = local_path(url)
    try:
        with path.open("rb") as source, partial.open("wb") as out, \
                reporter.download(f"Copying {path.name}", path.stat().st_size) as bar:
            while chunk := source.read(_CHUNK):
                out.write(chunk)
                bar.advance(bar.task_ids[0], len(chunk))
    except OSError as exc:
        raise SourceError(f"cannot read {url}: {exc.strerror or exc}",
                          "check the pin's url") from None


def _fetch_http(url: str, partial: Path, reporter: Reporter) -> None:
    import requests

    last: BaseException | None = None
    for attempt in range(RESUME_ATTEMPTS):
        if attempt:
            time.sleep(min(RESUME_BACKOFF_S * 2 ** (attempt - 1), 4.0))
        have = partial.stat().st_size if partial.is_file() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            with session().get(url, headers=headers, stream=True, timeout=TIMEOUT_S) as r:
                if r.status_code == 416 and have:  # the partial file is already complete
                    return
                if r.status_code >= 400:
                    raise SourceError(f"{url} answered HTTP {r.status_code} {r.reason}",
                                      "check the URL, the index URL (--index-url) and "
                                      "the pin")
                resumed = r.status_code == 206 and _range_start(r) == have
                if r.status_code == 206 and not resumed:  # not the range we asked for
                    partial.unlink(missing_ok=True)
                    last = VerificationError(f"{url} answered a range we did not ask for "
                                             f"(asked bytes={have}-)", "the server answers "
                                             "Range requests wrongly; report it to its "
                                             "operator, or use another index")
                    continue
                mode = "ab" if resumed else "wb"  # HTTP 200: the range was ignored
                length = r.headers.get("Content-Length")
                total = (int(length) + (have if resumed else 0)) if length else None
                # The file's name from the URL: the partial file is named by its hash.
                name = file_name(url)
                label = f"{'Resuming' if resumed else 'Downloading'} {name or partial.name}"
                with partial.open(mode) as out, reporter.download(label, total) as bar:
                    if resumed:
                        bar.advance(bar.task_ids[0], have)
                    for chunk in r.iter_content(_CHUNK):
                        out.write(chunk)
                        bar.advance(bar.task_ids[0], len(chunk))
            return
        except (requests.exceptions.ChunkedEncodingError,
                requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            last = exc  # dropped mid-file or unreachable: try again from where it stopped
    assert last is not None
    if isinstance(last, BuilderError):  # the last attempt was answered wrongly (a range)
        raise last
    raise unreachable(url, last)


def _range_start(response: Any) -> int | None:
    """The first byte of a 206 answer's ``Content-Range: bytes START-END/TOTAL``."""
    value = response.headers.get("Content-Range", "")
    unit, _, rest = value.partition(" ")
    start = rest.split("-", 1)[0]
    return int(start) if unit == "bytes" and start.isdigit() else None
