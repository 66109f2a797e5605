"""A project's files on a simple package index, read the way pip reads them.

One client for the whole builder: ``pypi-simple`` parses PEP 503 HTML and PEP 691 JSON
pages (``ProjectPage.from_response``), resolves each file's URL against the page's final
URL after redirects, reads the digests (``#sha256=`` fragments or ``hashes``) and the
PEP 592 ``yanked`` flag per file. The page is fetched with the retrying session of
:mod:`builder.source.download`. A ``file://`` index (a folder laid out like one) is read
from disk. Digests are compared lower-cased (hex is case-insensitive). A page that
breaks the spec is one :class:`BuilderError` naming the entry, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.utils import canonicalize_name

from builder.core.address import local_path, scheme
from builder.core.errors import BuilderError, SourceError, VerificationError
from builder.core.userfiles import parse_json
from builder.source.download import TIMEOUT_S, session, unreachable

# PEP 691 content negotiation: JSON preferred, HTML accepted (the spec's example header).
_ACCEPT = ("application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
           "text/html;q=0.01")


@dataclass(frozen=True)
class IndexFile:
    """One file of a project page.

    Attributes:
        name: the file name.
        url: its absolute URL (resolved against the page's final URL).
        sha256: its lower-case hex sha256 as the index lists it (``""``: none listed).
        yanked: PEP 592: the index marks the file yanked.
    """

    name: str
    url: str
    sha256: str
    yanked: bool


def project_page_url(project: str, index_url: str) -> str:
    """The PEP 503 URL of ``project``'s page: ``<index>/<normalized name>/``."""
    return f"{index_url.rstrip('/')}/{canonicalize_name(project)}/"


def project_files(project: str, index_url: str) -> tuple[str, list[IndexFile]]:
    """Read ``project``'s page on ``index_url``.

    Args:
        project: the project name (any spelling; normalized per PEP 503).
        index_url: the simple index's root URL (``https://``, ``http://`` or ``file://``).

    Returns:
        The page's final URL (after redirects) and its files, in page order.

    Raises:
        BuilderError: the index is unreachable, answers with an error, has no such
            project, or sends a page that is not PEP 503 HTML or PEP 691 JSON.
    """
    from pypi_simple import UnsupportedContentTypeError, UnsupportedRepoVersionError

    page_url = project_page_url(project, index_url)
    try:
        if scheme(page_url) == "file":
            page_url, page = _file_page(project, page_url)
        else:
            page_url, page = _http_page(project, page_url)
    except UnsupportedContentTypeError as exc:
        raise VerificationError(f"{page_url} is not a simple index page ({exc.content_type})",
                                "check --index-url: it names the index's /simple root") from None
    except UnsupportedRepoVersionError as exc:
        raise SourceError(f"{page_url} uses simple API version {exc.declared_version}, "
                          "newer than this builder reads", "use another index") from None
    files = [IndexFile(name=pkg.filename, url=pkg.url,
                       sha256=(pkg.digests.get("sha256") or "").lower(),
                       yanked=bool(pkg.is_yanked)) for pkg in page.packages]
    return page_url, files


def _http_page(project: str, page_url: str) -> tuple[str, Any]:
    import requests
    from pypi_simple import ProjectPage

    try:
        response = session().get(page_url, headers={"Accept": _ACCEPT}, timeout=TIMEOUT_S)
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
        raise unreachable(page_url, exc) from None
    except requests.exceptions.RequestException as exc:
        raise SourceError(f"cannot read {page_url}: {exc}", "check --index-url") from None
    if response.status_code == 404:
        raise SourceError(f"{page_url} answered HTTP 404: the index has no project "
                          f"{canonicalize_name(project)}", "check --index-url and the "
                          "project name")
    if response.status_code >= 400:
        raise SourceError(f"{page_url} answered HTTP {response.status_code} "
                          f"{response.reason}", "check --index-url, or try again later")
    final = response.url  # after redirects: relative file URLs resolve against it
    try:
        if "json" in response.headers.get("Content-Type", ""):
            parse_json(response.content)  # a key named twice: which value is meant?
        return final, ProjectPage.from_response(response, project)
    except ValueError as exc:  # a JSON error, or pydantic's ValidationError (a ValueError)
        raise _malformed(final, response.content, exc) from None


def _file_page(project: str, page_url: str) -> tuple[str, Any]:
    from pypi_simple import ProjectPage

    folder = local_path(page_url)
    for name in ("index.json", "index.html"):
        if (folder / name).is_file():
            body = (folder / name).read_bytes()
            try:
                if name == "index.json":
                    return page_url, ProjectPage.from_json_data(parse_json(body), page_url)
                return page_url, ProjectPage.from_html(project, body, page_url)
            except ValueError as exc:
                raise _malformed(page_url, body, exc) from None
    raise SourceError(f"{folder} has no index.html or index.json: the index has no project "
                      f"{canonicalize_name(project)}", "check --index-url")


def _malformed(page_url: str, body: bytes, exc: ValueError) -> BuilderError:
    """One clear error for a page that breaks PEP 691, naming the entry if it can."""
    where = ""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            problems = errors()
            location: tuple[Any, ...] = tuple(problems[0].get("loc", ())) if problems else ()
            files = parse_json(body).get("files", [])
            if len(location) >= 2 and location[0] == "files" and isinstance(location[1], int):
                entry = files[location[1]]
                label = entry.get("filename", f"#{location[1] + 1}") \
                    if isinstance(entry, dict) else f"#{location[1] + 1}"
                field = ".".join(str(part) for part in location[2:]) or "the entry"
                where = f": file entry {label}: {field}: {problems[0].get('msg', '')}"
            elif problems:
                where = f": {'.'.join(str(p) for p in location)}: {problems[0].get('msg', '')}"
        except (ValueError, AttributeError, IndexError, TypeError):
            pass
    if not where:
        where = f": {str(exc).splitlines()[0]}"
    return VerificationError(f"{page_url} is not a valid PEP 691 project page{where}",
                             "the index (or a proxy in front of it) sends a malformed page; "
                             "report it to the index's operator, or pass --index-url for "
                             "another index")
