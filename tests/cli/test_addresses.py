"""Addresses as the user gives them (issue 38, classes E and F): a package index's
credentials (pip's documented ``https://USER:TOKEN@host/simple``, in ``PIP_INDEX_URL``,
``pip.conf`` or ``--index-url``) are used for the downloads, as pip uses them, and shown as
``****`` wherever the address is printed; a port outside 1-65535 is bad input (exit 2)
before any request, wherever the index was set."""

from __future__ import annotations

import base64
import http.server
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pip._internal.utils.misc import redact_auth_from_url

from tests.helpers.cli import run_cli
from tests.helpers.input_cases import (
    sdist_members,
    sha256,
    write_series,
    write_tar,
    write_targets,
)
from tests.helpers.serve import serve_in_thread

TOKEN = "s3cret-TOKEN-4242"


# --- the redaction ---------------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "https://alice:s3cret@host/simple", "https://s3cret@host/simple",
    "http://alice:s3cret@127.0.0.1:8080/idx/", "https://host/simple",
    "https://alice:p@ss@host/simple", "file:///srv/a@b/simple"])
def test_an_address_is_shown_as_pip_shows_it(url: str) -> None:
    """pip's own redaction (pip 26.3) is the oracle."""
    from builder.core.address import redact

    assert redact(url) == redact_auth_from_url(url)
    assert "s3cret" not in redact(url) and "p@ss" not in redact(url)


def test_addresses_inside_a_text_are_redacted_and_the_rest_is_kept() -> None:
    from builder.core.address import redact

    text = ('could not reach http://alice:s3cret@h:1/simple/sglang/: refused; '
            '"url": "https://tok@h/x", ssh://git@github.com/a, mail a@b')
    assert redact(text) == ('could not reach http://alice:****@h:1/simple/sglang/: refused; '
                            '"url": "https://****@h/x", ssh://git@github.com/a, mail a@b')


# --- an index that needs the credentials --------------------------------------------------

def _project(root: Path) -> Path:
    """A project whose target pins an sdist found on the index ``root/idx``."""
    tgz = write_tar(root / "idx/files/sglang-0.5.9.tar.gz", sdist_members(),
                    dirs=["sglang-0.5.9"])
    page = root / "idx/simple/sglang"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        f'<a href="../../files/{tgz.name}#sha256={sha256(tgz)}">{tgz.name}</a>\n')
    write_series(root, versions=">=0.5.9")
    write_targets(root, kind="sdist", version="0.5.9", sha=sha256(tgz), url=None)
    return root


@pytest.fixture
def private_index(tmp_path: Path) -> Iterator[tuple[str, list[tuple[str, bool]]]]:
    """An index on 127.0.0.1 that answers 401 without ``alice:TOKEN`` (basic auth).

    Yields:
        Its address without credentials, and the log: (path, whether it was authorised).
    """
    root = _project(tmp_path / "p") / "idx"
    expected = "Basic " + base64.b64encode(f"alice:{TOKEN}".encode()).decode()
    log: list[tuple[str, bool]] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            authorised = self.headers.get("Authorization") == expected
            log.append((self.path, authorised))
            if not authorised:
                self.send_error(401)
                return
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serve_in_thread(server)
    yield f"127.0.0.1:{server.server_address[1]}", log
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("how", ["PIP_INDEX_URL", "PIP_CONFIG_FILE"])
def test_index_credentials_are_used_and_never_printed(
        tmp_path: Path, private_index: tuple[str, list[tuple[str, bool]]], how: str) -> None:
    host, log = private_index
    url = f"http://alice:{TOKEN}@{host}/simple"
    env = {"PIP_INDEX_URL": "", "PIP_CONFIG_FILE": ""}
    if how == "PIP_INDEX_URL":
        env["PIP_INDEX_URL"] = url
    else:
        (tmp_path / "pip.conf").write_text(f"[global]\nindex-url = {url}\n")
        env["PIP_CONFIG_FILE"] = str(tmp_path / "pip.conf")
    case, cache = tmp_path / "p", tmp_path / "cache"
    fetched = run_cli("fetch", "--json", cwd=case, cache=cache, env=env)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert json.loads(fetched.stdout)["index"]["url"] == f"http://alice:****@{host}/simple"
    assert log and all(authorised for _, authorised in log)  # the page and the sdist
    helped = run_cli("--help", cwd=case, env=env)
    assert f"http://alice:****@{host}/simple" in " ".join(helped.stdout.split())
    shown = run_cli("fetch", cwd=tmp_path / "p", cache=tmp_path / "cache2", env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    for done in (fetched, helped, shown):
        assert TOKEN not in done.stdout + done.stderr


def test_an_error_naming_the_index_shows_no_credentials(
        tmp_path: Path, private_index: tuple[str, list[tuple[str, bool]]]) -> None:
    host, _ = private_index
    for extra in ([], ["--json"]):
        done = run_cli("fetch", *extra, "--index-url", f"http://alice:{TOKEN}@{host}/nope",
                       cwd=tmp_path / "p", cache=tmp_path / "cache")
        assert done.returncode == 4, done.stdout + done.stderr
        assert TOKEN not in done.stdout + done.stderr
        assert f"alice:****@{host}/nope" in done.stdout + done.stderr
    # argparse's own usage error quotes what was typed: redacted too
    misplaced = run_cli("fetch", f"http://alice:{TOKEN}@{host}/simple", "--json",
                        cwd=tmp_path / "p", cache=tmp_path / "cache")
    assert misplaced.returncode == 2 and TOKEN not in misplaced.stdout + misplaced.stderr
    assert f"alice:****@{host}/simple" in misplaced.stdout + misplaced.stderr


# --- a port that is not a port --------------------------------------------------------------

@pytest.mark.parametrize("port", ["99999", "0", "-1", "abc"])
@pytest.mark.parametrize("how", ["--index-url", "PIP_INDEX_URL", "PIP_CONFIG_FILE"])
def test_an_index_port_outside_1_65535_is_bad_input_before_any_request(
        tmp_path: Path, port: str, how: str) -> None:
    """Wherever the index was set: exit 2 naming where, never exit 4 ("a retry may help")
    after a request, never port 0 read as 80."""
    case = _project(tmp_path / "p")
    url = f"http://alice:{TOKEN}@127.0.0.1:{port}/simple"
    env = {"PIP_INDEX_URL": "", "PIP_CONFIG_FILE": ""}
    args = ["fetch"]
    if how == "--index-url":
        args += ["--index-url", url]
    elif how == "PIP_INDEX_URL":
        env["PIP_INDEX_URL"] = url
    else:
        (tmp_path / "pip.conf").write_text(f"[global]\nindex-url = {url}\n")
        env["PIP_CONFIG_FILE"] = str(tmp_path / "pip.conf")
    done = run_cli(*args, cwd=case, cache=tmp_path / "cache", env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "outside 1-65535" in done.stderr and "port=80" not in done.stderr
    assert ("pip config (global.index-url)" if how == "PIP_CONFIG_FILE" else how) \
        in done.stderr
    assert TOKEN not in done.stdout + done.stderr


# --- where a tool cannot use them ---------------------------------------------------------

@pytest.mark.parametrize("address", [f"tcp://alice:{TOKEN}@127.0.0.1:2375",
                                     f"tcp://{TOKEN}@127.0.0.1:2375",
                                     f"ssh://alice:{TOKEN}@127.0.0.1"])
def test_an_engine_address_with_credentials_is_refused_unprinted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    """docker-py cannot use them: exit 2 before any connection, the hint says what it
    takes instead, and the token is not printed."""
    from builder.core.engine import docker_host
    from builder.core.errors import ConfigurationError

    done = run_cli("image", "--docker-host", address, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "carries credentials" in done.stderr and "TLS client certificates" in done.stderr
    assert TOKEN not in done.stdout + done.stderr
    monkeypatch.setenv("DOCKER_HOST", address)
    with pytest.raises(ConfigurationError) as refused:
        docker_host()
    assert refused.value.cause.startswith("DOCKER_HOST the address")
    assert TOKEN not in refused.value.cause + refused.value.hint
    assert "TWINE" not in refused.value.hint
