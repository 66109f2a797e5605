"""Issue 19: every outside input checked against its own claims (shared/cases2, one test per
case with its right outcome), plus the index client, pip's configuration and resumable
downloads of issue 12. Index cases run against a real HTTP server on 127.0.0.1 that
answers real redirects; the CLI runs as a user runs it."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.metadata import parse_email

from builder import BuilderError
from builder.core.cache import MANIFEST, Cache
from builder.core.config import SdistPin, WheelPin
from builder.core.pipconfig import parse_config_list
from builder.patching import intent
from builder.patching.intent import live_definitions
from builder.source import download as download_module
from builder.source.download import RESUME_ATTEMPTS, download
from builder.source.fetch import fetch_pin, find_release
from tests.helpers.cli import run_cli
from tests.helpers.input_cases import (
    MOD_BEFORE,
    PATCH,
    make_archive_version_mismatch,
    make_config_bool_as_int,
    make_index_pep691_malformed_files,
    make_index_redirect_relative_urls,
    make_intent_function_defined_twice,
    make_sdist_dot_slash_members,
    make_wheel_crlf_metadata,
    make_wheel_duplicate_zip_entries,
    sdist_members,
    sha256,
    wheel_files,
    write_tar,
    write_wheel,
)
from tests.helpers.serve import serve_in_thread

# --- a small index server: files, PEP 691 pages, redirects and injected faults ----------


@dataclass
class Faults:
    """What the server does wrong: per path, how many GETs to cut off after ``drop_after``
    bytes, whether to ignore Range, and how many 503s to answer first."""

    drops: dict[str, int] = field(default_factory=dict)
    drop_after: int = 1000
    ignore_range: bool = False
    unavailable: dict[str, int] = field(default_factory=dict)
    # Set: a whole-file answer sends its first 64 KiB, then waits for the event.
    gate: threading.Event | None = None


@dataclass
class Server:
    url: str
    root: Path
    faults: Faults
    log: list[tuple[str, str | None, int]]  # (path, Range header, status)


def _handler(root: Path, faults: Faults, log: list[tuple[str, str | None, int]]) -> type:
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            log.append((self.path, self.headers.get("Range"), int(code)))

        def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            redirects = root / "_redirects.json"
            if redirects.is_file():
                for old, new in json.loads(redirects.read_text()).items():
                    if self.path.startswith(old):
                        self._answer(301, {"Location": new + self.path[len(old):],
                                           "Content-Length": "0"}, b"")
                        return
            if faults.unavailable.get(self.path, 0) > 0:
                faults.unavailable[self.path] -= 1
                self._answer(503, {"Content-Length": "0"}, b"")
                return
            local = root / self.path.split("?", 1)[0].split("#", 1)[0].lstrip("/")
            if self.path.endswith("/") and (local / "index.json").is_file():
                body = (local / "index.json").read_bytes()
                self._answer(200, {"Content-Type": "application/vnd.pypi.simple.v1+json",
                                   "Content-Length": str(len(body))}, body)
                return
            if local.is_file():
                data = local.read_bytes()
                start = 0
                asked = self.headers.get("Range")
                if asked and not faults.ignore_range and asked.startswith("bytes="):
                    start = int(asked[6:].split("-", 1)[0])
                if faults.drops.get(self.path, 0) > 0:
                    faults.drops[self.path] -= 1
                    self.send_response(206 if start else 200)
                    log[-1] = (self.path, asked, -1)  # cut off mid-file
                    self.send_header("Content-Length", str(len(data) - start))
                    if start:
                        self.send_header("Content-Range",
                                         f"bytes {start}-{len(data) - 1}/{len(data)}")
                    self.end_headers()
                    self.wfile.write(data[start:start + faults.drop_after])
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                if start:
                    self._answer(206, {"Content-Length": str(len(data) - start),
                                       "Content-Range":
                                           f"bytes {start}-{len(data) - 1}/{len(data)}"},
                                 data[start:])
                elif faults.gate is not None:
                    self._answer(200, {"Content-Length": str(len(data))}, data[:65_536])
                    self.wfile.flush()
                    faults.gate.wait(60)
                    self.wfile.write(data[65_536:])
                else:
                    self._answer(200, {"Content-Length": str(len(data))}, data)
                return
            super().do_GET()

    return Handler


@pytest.fixture
def serve() -> Iterator[object]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(root: Path, faults: Faults | None = None) -> Server:
        faults = faults or Faults()
        log: list[tuple[str, str | None, int]] = []
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                 _handler(root, faults, log))
        serve_in_thread(server)
        servers.append(server)
        return Server(f"http://127.0.0.1:{server.server_address[1]}", root, faults, log)

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _no_traceback(done: object) -> None:
    assert "Traceback" not in done.stderr + done.stdout  # type: ignore[attr-defined]


def _json_error(done: object) -> dict[str, str]:
    _no_traceback(done)
    payload = json.loads(done.stdout)  # type: ignore[attr-defined]
    assert set(payload) >= {"error", "hint"} and payload["hint"]
    return payload


# --- wheels --------------------------------------------------------------------------------

def test_wheel_with_two_zip_entries_of_one_name_is_refused(tmp_path: Path) -> None:
    case = make_wheel_duplicate_zip_entries(tmp_path / "case")
    done = run_cli("wheel", "--json", "--targets-file", "targets.toml", "--dist", "dist",
                   cwd=case, cache=tmp_path / "cache")
    assert done.returncode == 1
    assert "two zip entries named 'sglang/srt/other.py'" in _json_error(done)["error"]
    assert not (case / "dist").exists() or not any((case / "dist").iterdir())


def test_wheel_whose_record_disagrees_with_the_zip_is_refused(tmp_path: Path) -> None:
    info, files = wheel_files()
    good = write_wheel(tmp_path / "good" / "sglang-0.5.11-py3-none-any.whl", info, files)
    record = zipfile.ZipFile(good).read(f"{info}/RECORD").replace(b"sglang/srt/mod.py",
                                                                   b"sglang/srt/gone.py")
    bad = write_wheel(tmp_path / "bad" / "sglang-0.5.11-py3-none-any.whl", info, files,
                      record=record)
    for wheel, message in ((good, None), (bad, "sglang/srt/mod.py is not in RECORD")):
        pin = WheelPin("sglang", "0.5.11", wheel.name, sha256(wheel), wheel.as_uri())
        cache = Cache(tmp_path / f"cache-{wheel.parent.name}")
        if message is None:
            assert (fetch_pin(pin, pin_version(pin), cache=cache).tree / "sglang").is_dir()
        else:
            with pytest.raises(BuilderError, match=message):
                fetch_pin(pin, pin_version(pin), cache=cache)


def pin_version(pin: SdistPin | WheelPin) -> object:
    from packaging.version import Version

    return Version(pin.version)


def test_crlf_metadata_is_read_as_email_headers(tmp_path: Path) -> None:
    case = make_wheel_crlf_metadata(tmp_path / "case")
    done = run_cli("wheel", "--json", "--targets-file", "targets.toml", "--dist", "dist",
                   cwd=case, cache=tmp_path / "cache")
    _no_traceback(done)
    assert done.returncode == 0, done.stdout + done.stderr
    wheel = case / "dist" / "sglang-0.5.11+sm120.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read("sglang-0.5.11+sm120.1.dist-info/METADATA")
        raw, unparsed = parse_email(metadata)
        assert raw["version"] == "0.5.11+sm120.1" and not unparsed
        # the body (after the first blank line) is untouched, line endings included
        assert metadata.endswith(b"\r\n\r\nChangelog\r\nVersion: 0.5.10 notes\r\nmore text\r\n")


# --- sdists ----------------------------------------------------------------------------------

@pytest.mark.parametrize("sub", ["a", "b"])
def test_sdist_members_named_dot_slash_unpack_like_any_other(tmp_path: Path, sub: str) -> None:
    case = make_sdist_dot_slash_members(tmp_path / "case", sub)
    cache = tmp_path / "cache"
    done = run_cli("fetch", "--json", "--targets-file", "targets.toml", cwd=case, cache=cache)
    _no_traceback(done)
    assert done.returncode == 0, done.stdout + done.stderr
    tree = Path(json.loads(done.stdout)["tree"])
    assert sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file()) == \
        ["PKG-INFO", "pyproject.toml", "sglang/__init__.py", "sglang/srt/__init__.py",
         "sglang/srt/mod.py"]
    # the cache's own bookkeeping sits beside the tree, never inside it
    assert (tree.parent / MANIFEST).is_file() and not (tree / MANIFEST).exists()
    # and the same again from the cache is not taken for an edited entry
    again = run_cli("fetch", "--targets-file", "targets.toml", cwd=case, cache=cache)
    assert again.returncode == 0, again.stderr


def test_sdist_dot_slash_builds_a_wheel(tmp_path: Path) -> None:
    case = make_sdist_dot_slash_members(tmp_path / "case", "a")
    done = run_cli("wheel", "--targets-file", "targets.toml", "--dist", "dist", cwd=case,
                   cache=tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert [p.name for p in (case / "dist").iterdir()] == \
        ["sglang-0.5.9+sm120.1-py3-none-any.whl"]


@pytest.mark.parametrize("kind", ["hardlink", "device", "duplicate", "no-pkg-info",
                                  "two-tops-without-pkg-info"])
def test_sdist_unpack_rule_refuses_with_the_true_cause(tmp_path: Path, kind: str) -> None:
    members = sdist_members()
    links: list[tuple[str, str, str]] = []
    if kind == "hardlink":
        links = [("sglang-0.5.9/sglang/alias.py", "sglang-0.5.9/sglang/srt/mod.py", "hard")]
    elif kind == "duplicate":
        members = [*members, ("sglang-0.5.9/sglang/srt/mod.py", b"other\n")]
    elif kind == "no-pkg-info":
        members = members[1:]
    elif kind == "two-tops-without-pkg-info":
        members = [*members[1:], ("other-1.0/x.py", b"")]
    archive = write_tar(tmp_path / "sglang-0.5.9.tar.gz", members, links=links)
    if kind == "device":
        with tarfile.open(archive, "w:gz") as tar:
            node = tarfile.TarInfo("sglang-0.5.9/dev")
            node.type = tarfile.CHRTYPE
            tar.addfile(node)
    expected = {"hardlink": "is a link", "device": "is a special file",
                "duplicate": "two members named 'sglang-0.5.9/sglang/srt/mod.py'",
                "no-pkg-info": r"no PKG-INFO at its root \(inside sglang-0.5.9/\)",
                "two-tops-without-pkg-info": "no PKG-INFO at its root$"}[kind]
    pin = SdistPin("sglang", "0.5.9", sha256(archive), archive.as_uri())
    cache = Cache(tmp_path / "cache")
    with pytest.raises(BuilderError, match=expected):
        fetch_pin(pin, pin_version(pin), cache=cache)
    assert not cache.lookup("source", f"sdist-{pin.sha256}")


@pytest.mark.parametrize("sub", ["a", "b"])
def test_archive_whose_own_version_is_not_its_pin_is_refused(tmp_path: Path, sub: str) -> None:
    case = make_archive_version_mismatch(tmp_path / "case", sub)
    done = run_cli("wheel", "--json", "--targets-file", "targets.toml", "--dist", "dist",
                   cwd=case, cache=tmp_path / "cache")
    assert done.returncode == 1
    error = _json_error(done)["error"]
    assert {"a": "PKG-INFO) says version 0.5.8, but the pin and the file name say 0.5.9",
            "b": "folder sglang-0.5.10.dist-info/ is not sglang 0.5.11"}[sub] in error
    assert not (case / "dist").exists()


def test_pin_versions_are_normalized_before_file_names(tmp_path: Path) -> None:
    members = sdist_members(top="sglang-0.5.10.post1", version="0.5.10.post1")
    archive = write_tar(tmp_path / "up" / "sglang-0.5.10.post1.tar.gz", members)
    (tmp_path / "targets.toml").write_text(f'''
[[target]]
name = "t"
upstream_version = "0.5.10-post1"
local_label = "sm120.1"
series = "series.toml"
cuda_lane = "13.0"
arch_list = ["12.0f"]
[[target.source]]
kind = "sdist"
project = "SGLang"
version = "0.5.10-POST1"
sha256 = "{sha256(archive)}"
url = "{archive.as_uri()}"
''')
    from builder import load_targets

    pin = load_targets(tmp_path / "targets.toml").get(None).pin()
    assert isinstance(pin, SdistPin) and pin.filename == "sglang-0.5.10.post1.tar.gz"
    source = fetch_pin(pin, pin_version(pin), cache=Cache(tmp_path / "cache"))
    assert (source.tree / "PKG-INFO").is_file()


# --- configuration -------------------------------------------------------------------------

@pytest.mark.parametrize(("series", "message"), [
    ("a-max-fuzz-true", "'strip' must be an integer, got True"),
    ("b-allowance-true", "fuzz_allowance #1: 'max_fuzz' must be an integer, got True"),
])
def test_toml_boolean_is_never_an_integer(tmp_path: Path, series: str, message: str) -> None:
    case = make_config_bool_as_int(tmp_path / "case")
    done = run_cli("patch", "--json", "--source-dir", "tree", "--upstream-version", "0.5.9",
                   "--series", f"{series}/patches/series.toml", "--dry-run", cwd=case,
                   cache=tmp_path / "cache")
    assert done.returncode == 2
    assert message in _json_error(done)["error"]


def test_max_fuzz_true_alone_is_refused(tmp_path: Path) -> None:
    case = make_config_bool_as_int(tmp_path / "case")
    series = case / "a-max-fuzz-true" / "patches" / "series.toml"
    series.write_text(series.read_text().replace("strip = true", "strip = 1"))
    done = run_cli("patch", "--source-dir", "tree", "--upstream-version", "0.5.9",
                   "--series", str(series), "--dry-run", cwd=case, cache=tmp_path / "cache")
    assert done.returncode == 2
    assert "max_fuzz must be an integer from 0 to 3" in done.stderr


def test_integer_control_still_needs_its_fuzz(tmp_path: Path) -> None:
    case = make_config_bool_as_int(tmp_path / "case")
    done = run_cli("patch", "--source-dir", "tree", "--upstream-version", "0.5.9",
                   "--series", "c-int-control/patches/series.toml", "--dry-run", cwd=case,
                   cache=tmp_path / "cache")
    assert done.returncode == 5 and "needs fuzz 1, the series allows 0" in done.stderr


# --- intent checks -------------------------------------------------------------------------

@pytest.mark.parametrize("sub", ["a", "b"])
def test_intent_judges_the_definition_in_effect(tmp_path: Path, sub: str) -> None:
    case = make_intent_function_defined_twice(tmp_path / "case", sub)
    done = run_cli("patch", "--json", "--source-dir", "tree", "--upstream-version", "0.5.9",
                   "--series", "patches/series.toml", "--dry-run", cwd=case,
                   cache=tmp_path / "cache")
    _no_traceback(done)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    report = report.get("report", report)
    assert [p["status"] for p in report["patches"]] == ["applied"]
    assert [(i["held_before"], i["holds"]) for i in report["intents"]] == [(False, True)]


def test_live_definitions_skip_overridden_ones() -> None:
    import ast

    tree = ast.parse("def f(): pass\nclass C:\n    def g(self): return 1\n"
                     "    def g(self): return 2\nif X:\n    def h(): pass\nelse:\n"
                     "    def h(): pass\ndef f(): pass\n")
    assert [(n.name, n.lineno) for n in live_definitions(tree)] == \
        [("g", 4), ("h", 6), ("h", 8), ("f", 9)]


def test_catastrophic_intent_regex_trips_its_time_bound(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The bound, 5 s, shortened: the pattern backtracks for hours, either trips it.
    monkeypatch.setattr(intent, "REGEX_TIMEOUT_S", 0.5)
    tree = tmp_path / "tree" / "python" / "sglang" / "srt"
    tree.mkdir(parents=True)
    (tmp_path / "tree" / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\n')
    # 40 a's then "!": Python's re backtracks for hours on ^(a|aa)+$ over this line
    (tree / "mod.py").write_bytes(MOD_BEFORE + b"a" * 40 + b"!\n")
    patches = tmp_path / "patches"
    patches.mkdir()
    patch = PATCH
    (patches / "1.patch").write_bytes(patch)
    (patches / "series.toml").write_text(f'''[[patch]]
file = "1.patch"
sha256 = "{hashlib.sha256(patch).hexdigest()}"
strip = 1
versions = ">=0.5.9"
[[patch.intent]]
check = "regex-present"
file = "python/sglang/srt/mod.py"
pattern = '^(a|aa)+$'
''')
    done = run_cli("patch", "--json", "--source-dir", "tree", "--upstream-version", "0.5.9",
                   "--series", "patches/series.toml", "--dry-run", cwd=tmp_path,
                   cache=tmp_path / "cache")
    assert done.returncode == 5
    assert "ran longer than 0.5 s" in _json_error(done)["error"]


def test_bad_intent_regex_is_refused_when_the_series_loads(tmp_path: Path) -> None:
    from builder.patching.series import load_series

    (tmp_path / "series.toml").write_text(f'''[[patch]]
file = "1.patch"
sha256 = "{"0" * 64}"
strip = 1
versions = ">=0.5.9"
[[patch.intent]]
check = "regex-absent"
file = "x.py"
pattern = '(unclosed'
''')
    with pytest.raises(BuilderError, match="bad regular expression"):
        load_series(tmp_path / "series.toml")


# --- the package index -----------------------------------------------------------------------

@pytest.mark.parametrize("sub", ["a", "b"])
def test_relative_links_resolve_against_the_final_url(tmp_path: Path, serve: object,
                                                      sub: str) -> None:
    case = make_index_redirect_relative_urls(tmp_path / "case", sub)
    server = serve(case / "idx")  # type: ignore[operator]
    done = run_cli("fetch", "--json", "--targets-file", "targets.toml", "--index-url",
                   f"{server.url}/simple", cwd=case, cache=tmp_path / "cache")
    _no_traceback(done)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["index"] == {"url": f"{server.url}/simple",
                                                "origin": "--index-url"}
    paths = [(path, status) for path, _, status in server.log]
    assert ("/simple/sglang/", 301) in paths and ("/mirror/simple/sglang/", 200) in paths
    assert ("/mirror/files/sglang-0.5.9.tar.gz", 200) in paths


@pytest.mark.parametrize(("sub", "field"), [("a", "hashes: Field required"),
                                            ("b", "hashes: Input should be a valid dictionary"),
                                            ("c", "url: Field required")])
def test_malformed_pep691_entry_is_one_clear_error(tmp_path: Path, serve: object, sub: str,
                                                   field: str) -> None:
    case = make_index_pep691_malformed_files(tmp_path / "case", sub)
    server = serve(case / "idx")  # type: ignore[operator]
    done = run_cli("fetch", "--json", "--targets-file", "targets.toml", "--index-url",
                   f"{server.url}/simple", cwd=case, cache=tmp_path / "cache")
    assert done.returncode == 1
    assert _json_error(done)["error"] == (
        f"{server.url}/simple/sglang/ is not a valid PEP 691 project page: file entry "
        f"sglang-0.5.9.tar.gz: {field}")


def _index_page(root: Path, files: list[dict[str, object]]) -> None:
    page = root / "simple" / "sglang"
    page.mkdir(parents=True, exist_ok=True)
    (page / "index.json").write_text(json.dumps({"meta": {"api-version": "1.1"},
                                                 "name": "sglang", "files": files}))


def test_yanked_files_rank_last_per_file(tmp_path: Path, serve: object) -> None:
    sdist = write_tar(tmp_path / "idx" / "files" / "sglang-0.5.9.tar.gz", sdist_members())
    info, files = wheel_files(ver="0.5.9")
    wheel = write_wheel(tmp_path / "idx" / "files" / "sglang-0.5.9-py3-none-any.whl", info,
                        files)
    _index_page(tmp_path / "idx", [
        {"filename": sdist.name, "url": f"/files/{sdist.name}",
         "hashes": {"sha256": sha256(sdist)}, "yanked": "broken sdist"},
        {"filename": wheel.name, "url": f"/files/{wheel.name}",
         "hashes": {"sha256": sha256(wheel)}}])
    server = serve(tmp_path / "idx")  # type: ignore[operator]
    pin = find_release("sglang", "0.5.9", f"{server.url}/simple")
    assert isinstance(pin, WheelPin) and pin.filename == wheel.name
    # with both yanked, the sdist is preferred again
    _index_page(tmp_path / "idx", [
        {"filename": sdist.name, "url": f"/files/{sdist.name}",
         "hashes": {"sha256": sha256(sdist)}, "yanked": True},
        {"filename": wheel.name, "url": f"/files/{wheel.name}",
         "hashes": {"sha256": sha256(wheel)}, "yanked": True}])
    assert isinstance(find_release("sglang", "0.5.9", f"{server.url}/simple"), SdistPin)


def test_digests_compare_case_insensitively(tmp_path: Path, serve: object) -> None:
    sdist = write_tar(tmp_path / "idx" / "files" / "sglang-0.5.9.tar.gz", sdist_members())
    page = tmp_path / "idx" / "simple" / "sglang"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        f'<a href="../../files/{sdist.name}#sha256={sha256(sdist).upper()}">{sdist.name}</a>')
    server = serve(tmp_path / "idx")  # type: ignore[operator]
    pin = SdistPin("sglang", "0.5.9", sha256(sdist))
    source = fetch_pin(pin, pin_version(pin), cache=Cache(tmp_path / "cache"),
                       index_url=f"{server.url}/simple")
    assert (source.tree / "PKG-INFO").is_file()


# --- pip's configuration ---------------------------------------------------------------------

def test_pip_config_list_precedence() -> None:
    text = ("global.index-url='https://mirror.example/simple'\n"
            "install.index-url='https://install.example/simple'\n")
    assert str(parse_config_list(text)) == \
        "https://install.example/simple (from pip config (install.index-url))"
    assert parse_config_list(text + ":env:.index-url='http://env.example/simple'\n").origin \
        == "PIP_INDEX_URL"
    assert parse_config_list("global.cert='/x'\n").url == "https://pypi.org/simple"


@pytest.mark.parametrize("how", ["PIP_INDEX_URL", "PIP_CONFIG_FILE"])
def test_default_index_follows_pip_configuration(tmp_path: Path, serve: object,
                                                 how: str) -> None:
    case = make_index_redirect_relative_urls(tmp_path / "case", "b")
    server = serve(case / "idx")  # type: ignore[operator]
    env = {"PIP_INDEX_URL": "", "PIP_CONFIG_FILE": ""}
    if how == "PIP_INDEX_URL":
        env["PIP_INDEX_URL"] = f"{server.url}/simple"
        origin = "PIP_INDEX_URL"
    else:
        conf = tmp_path / "pip.conf"
        conf.write_text(f"[global]\nindex-url = {server.url}/simple\n")
        env["PIP_CONFIG_FILE"] = str(conf)
        origin = "pip config (global.index-url)"
    # both variables always set ("" is unset for pip), so the host's own cannot interfere
    done = run_cli("fetch", "--json", "--targets-file", "targets.toml", cwd=case,
                   cache=tmp_path / "cache", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["index"] == {"url": f"{server.url}/simple",
                                                "origin": origin}
    helped = run_cli("--help", cwd=case, env=env)  # --index-url is a shared option
    assert f"{server.url}/simple (from {origin})" in " ".join(helped.stdout.split())


# --- downloads: retried, resumed by range, verified ------------------------------------------

def _payload(tmp_path: Path, size: int = 200_000) -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = tmp_path / "srv" / "files" / "big.bin"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    return path, data


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resume at once after a dropped connection: the waits (0.25 s doubling, 7.75 s over
    six attempts) are the same code path, only shorter."""
    monkeypatch.setattr(download_module, "RESUME_BACKOFF_S", 0.001)


@pytest.mark.parametrize("ignore_range", [False, True])
@pytest.mark.usefixtures("no_backoff")
def test_download_resumes_after_a_dropped_connection(tmp_path: Path, serve: object,
                                                     ignore_range: bool) -> None:
    from builder.core.progress import Reporter

    _, data = _payload(tmp_path)
    # cut off after one 64 KiB chunk (what the client writes at a time), twice
    faults = Faults(drops={"/files/big.bin": 2}, drop_after=65_536, ignore_range=ignore_range)
    server = serve(tmp_path / "srv", faults)  # type: ignore[operator]
    target = tmp_path / "out" / "big.bin"
    partial = tmp_path / "partial" / "big.bin.part"
    download(f"{server.url}/files/big.bin", target, hashlib.sha256(data).hexdigest(),
             partial, Reporter(quiet=True))
    assert target.read_bytes() == data and not partial.exists()
    ranges = [rng for path, rng, _ in server.log if path == "/files/big.bin"]
    if ignore_range:  # asked for the rest, got the whole file, started over
        assert ranges == [None, "bytes=65536-", "bytes=65536-"]
    else:
        assert ranges == [None, "bytes=65536-", "bytes=131072-"]


def test_download_retries_server_errors(tmp_path: Path, serve: object) -> None:
    from builder.core.progress import Reporter

    _, data = _payload(tmp_path)
    server = serve(tmp_path / "srv", Faults(unavailable={"/files/big.bin": 2}))  # type: ignore[operator]
    target = tmp_path / "out" / "big.bin"
    download(f"{server.url}/files/big.bin", target, hashlib.sha256(data).hexdigest(),
             tmp_path / "p.part", Reporter(quiet=True))
    assert [s for _, _, s in server.log] == [503, 503, 200]


def test_wrong_sha256_removes_the_partial_and_fails(tmp_path: Path, serve: object) -> None:
    from builder.core.progress import Reporter

    _payload(tmp_path)
    server = serve(tmp_path / "srv")  # type: ignore[operator]
    partial = tmp_path / "p.part"
    with pytest.raises(BuilderError, match=r"sha256 mismatch for big\.bin .* pinned 0000"):
        download(f"{server.url}/files/big.bin", tmp_path / "out" / "big.bin", "0" * 64,
                 partial, Reporter(quiet=True))
    assert not partial.exists() and not (tmp_path / "out" / "big.bin").exists()


@pytest.mark.usefixtures("no_backoff")
def test_interrupted_run_leaves_a_partial_that_the_next_run_resumes(tmp_path: Path,
                                                                   serve: object) -> None:
    _, data = _payload(tmp_path, 1_000_000)
    sha = hashlib.sha256(data).hexdigest()
    faults = Faults(drops={"/files/big.bin": 99}, drop_after=65_536)
    server = serve(tmp_path / "srv", faults)  # type: ignore[operator]
    name = "sglang-0.5.9-py3-none-any.whl"
    pin = WheelPin("sglang", "0.5.9", name, sha, f"{server.url}/files/big.bin")
    cache = Cache(tmp_path / "cache")
    with pytest.raises(BuilderError, match="could not reach"):
        fetch_pin(pin, pin_version(pin), cache=cache)  # every attempt cut off
    partial = cache.root / "partial" / f"{sha}.{name}.part"
    kept = partial.stat().st_size
    assert kept == 65_536 * RESUME_ATTEMPTS
    faults.drops.clear()
    with pytest.raises(BuilderError, match="cannot read"):
        fetch_pin(pin, pin_version(pin), cache=cache)  # random bytes: not a wheel
    assert (cache.entry("downloads", sha) / name).read_bytes() == data
    assert server.log[-1] == ("/files/big.bin", f"bytes={kept}-", 206)


def test_two_fetches_of_one_file_on_one_cache_both_succeed(tmp_path: Path,
                                                           serve: object) -> None:
    """Issue 38, class I: two commands fetch one pin into one empty cache at once. The
    second waits for the first's partial file (a lock on it), then finds the finished
    entry: one download, two successes (two writers of one partial file: one failed with
    "No such file")."""
    from builder.core.progress import Reporter

    _, data = _payload(tmp_path, 1_000_000)
    sha = hashlib.sha256(data).hexdigest()
    gate = threading.Event()
    server = serve(tmp_path / "srv", Faults(gate=gate))  # type: ignore[operator]
    name = "sglang-0.5.9-py3-none-any.whl"
    pin = WheelPin("sglang", "0.5.9", name, sha, f"{server.url}/files/big.bin")
    cache = Cache(tmp_path / "cache")
    partial = cache.root / "partial" / f"{sha}.{name}.part"
    outcomes: list[str] = []

    def fetch() -> None:
        try:
            fetch_pin(pin, pin_version(pin), cache=cache, reporter=Reporter(quiet=True))
        except BuilderError as exc:  # random bytes are not a wheel: the download was done
            outcomes.append("downloaded" if "cannot read" in str(exc) else str(exc))
        except OSError as exc:
            outcomes.append(repr(exc))

    first = threading.Thread(target=fetch)
    first.start()
    for _ in range(600):  # the first is mid-file: its first 64 KiB are in the partial
        if partial.is_file() and partial.stat().st_size >= 65_536:
            break
        time.sleep(0.05)
    second = threading.Thread(target=fetch)
    second.start()
    time.sleep(1.0)  # the second reaches the partial file (and waits, or writes it too)
    gate.set()
    first.join(60)
    second.join(60)
    assert outcomes == ["downloaded", "downloaded"]
    assert (cache.entry("downloads", sha) / name).read_bytes() == data
    assert [p for p, _, _ in server.log] == ["/files/big.bin"]  # fetched once
    assert not partial.exists()


def test_unpack_digest_equals_the_trees(tmp_path: Path, sdists: dict[str, Path]) -> None:
    """The digest recorded while unpacking is sha256_tree's, path order included
    (``a/b`` sorts before ``a.b`` by component, after it as a string)."""
    from builder.core.cache import sha256_tree

    members = [*sdist_members(), ("sglang-0.5.9/a.b", b"1"), ("sglang-0.5.9/a/b", b"2"),
               ("sglang-0.5.9/a-c", b"3")]
    crafted = write_tar(tmp_path / "up" / "sglang-0.5.9.tar.gz", members)
    real = sdists["0.5.9"]
    for archive in (crafted, real):
        pin = SdistPin("sglang", "0.5.9", sha256(archive), archive.as_uri())
        source = fetch_pin(pin, pin_version(pin), cache=Cache(tmp_path / archive.parent.name))
        assert source.tree_sha256 == sha256_tree(source.tree)


# --- the user's TOML files -----------------------------------------------------------------

@pytest.mark.parametrize("which", ["targets", "series", "pins"])
def test_a_toml_file_that_is_not_utf8_is_one_clear_error(tmp_path: Path, which: str) -> None:
    from tests.helpers.project import write_project

    root = write_project(tmp_path / "p")
    broken = {"targets": root / "targets.toml", "series": root / "patches" / "series.toml",
              "pins": root / "pins.toml"}[which]
    broken.write_bytes(b'default = "t"\xff\n')  # TOML is UTF-8; \xff never is
    argv = {"targets": ("plan",), "series": ("patch", "--dry-run"),
            "pins": ("pin-images", "--verify", "--pins-file", str(broken))}[which]
    done = run_cli(*argv, "--json", cwd=root, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)
    assert error["error"].endswith(f"{broken} is not UTF-8 text (byte 13: invalid start byte)")
    assert "Traceback" not in done.stderr
