"""Property test over generated sdists and wheels (issue 19): the source stage either gives
a tree (and, for a wheel, a repacked wheel) whose own metadata matches its name and pin,
or refuses with one BuilderError; it never writes outside its cache."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import zipfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from packaging.metadata import parse_email
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder import BuilderError
from builder.core.cache import MANIFEST, Cache, sha256_tree
from builder.core.config import SdistPin, WheelPin
from builder.source.fetch import fetch_pin
from builder.wheel.repack import repack_wheel
from tests.helpers.input_cases import sha256, write_wheel

PROJECT = "Foo.Bar"
SPELLINGS = ["foo_bar", "Foo-Bar", "foo.bar", "FOO__BAR", "foo_baz"]  # the last is another
PIN_VERSIONS = ["1.0", "1.0.post1", "2.0rc1"]
INNER_VERSIONS = ["1.0", "1.0.0", "1.0-post1", "1.0.post1", "2.0.0rc1", "2.0c1", "1.1"]
UNSAFE = [None, "../evil.py", "/tmp/evil-abs.py", "symlink", "duplicate"]


def _metadata(name: str, version: str, crlf: bool) -> bytes:
    text = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: x\n\n"
            "Version: 9.9 in the body is not a header\n")
    return (text.replace("\n", "\r\n") if crlf else text).encode()


def _sdist(path: Path, name: str, version: str, top: str, crlf: bool,
           unsafe: str | None) -> None:
    members = [("PKG-INFO", _metadata(name, version, crlf)),
               ("foo_bar/__init__.py", b"VALUE = 1\n")]
    with tarfile.open(path, "w:gz") as tar:
        for member, data in members:
            info = tarfile.TarInfo(f"{top}{member}")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        if unsafe == "symlink":
            info = tarfile.TarInfo(f"{top}link")
            info.type = tarfile.SYMTYPE
            info.linkname = "../../outside"
            tar.addfile(info)
        elif unsafe == "duplicate":
            info = tarfile.TarInfo(f"{top}foo_bar/__init__.py")
            info.size = 2
            tar.addfile(info, io.BytesIO(b"#\n"))
        elif unsafe:
            info = tarfile.TarInfo(unsafe)
            info.size = 5
            tar.addfile(info, io.BytesIO(b"evil\n"))


def _wheel(path: Path, name: str, version: str, crlf: bool, unsafe: str | None) -> None:
    info = f"{name}-{version}.dist-info"
    files = [("foo_bar/__init__.py", b"VALUE = 1\n"),
             (f"{info}/METADATA", _metadata(name, version, crlf)),
             (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\n"
                               b"Tag: py3-none-any\n")]
    if unsafe == "duplicate":
        files.insert(1, ("foo_bar/__init__.py", b"VALUE = 2\n"))
    elif unsafe in ("../evil.py", "/tmp/evil-abs.py"):
        files.append((unsafe, b"evil\n"))
    write_wheel(path, info, files)


def _snapshot(root: Path, skip: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if skip not in p.parents and p != skip}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["sdist", "wheel"]), spelling=st.sampled_from(SPELLINGS),
       pin_version=st.sampled_from(PIN_VERSIONS), inner=st.sampled_from(INNER_VERSIONS),
       top=st.sampled_from(["{name}-{version}/", "./{name}-{version}/", "./", ""]),
       crlf=st.booleans(), unsafe=st.sampled_from(UNSAFE))
def test_an_archive_is_what_its_pin_says_or_is_refused(kind: str, spelling: str,
                                                       pin_version: str, inner: str, top: str,
                                                       crlf: bool, unsafe: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        upstream = work / "upstream"
        upstream.mkdir()
        escaped = canonicalize_name(PROJECT).replace("-", "_")
        if kind == "sdist":
            archive = upstream / f"{escaped}-{pin_version}.tar.gz"
            _sdist(archive, spelling, inner, top.format(name=spelling, version=inner), crlf,
                   unsafe)
            pin: SdistPin | WheelPin = SdistPin(PROJECT, pin_version, sha256(archive),
                                                archive.as_uri())
        else:
            archive = upstream / f"{escaped}-{pin_version}-py3-none-any.whl"
            _wheel(archive, spelling, inner, crlf, unsafe)
            pin = WheelPin(PROJECT, pin_version, archive.name, sha256(archive),
                           archive.as_uri())
        cache = Cache(work / "cache")
        before = _snapshot(work, work / "cache")
        try:
            source = fetch_pin(pin, Version(pin_version), cache=cache)
        except BuilderError as exc:
            assert exc.cause and "\n" not in exc.cause and exc.hint
            assert not cache.lookup("source", f"{kind}-{pin.sha256}")
            source = None
        # nothing was written outside the cache, whatever the archive held
        assert _snapshot(work, work / "cache") == before
        assert not Path("/tmp/evil-abs.py").exists()
        good_version = Version(inner) == Version(pin_version)
        good_name = canonicalize_name(spelling) == canonicalize_name(PROJECT)
        if source is None:
            event("refused")
            return
        event(f"accepted {kind}")
        # accepted: only a truthful, safe archive gets here
        harmless = (None, "symlink") if kind == "wheel" else (None,)  # no symlinks in a zip here
        assert good_version and good_name and unsafe in harmless
        tree = source.tree
        if kind == "sdist":
            raw, _ = parse_email((tree / "PKG-INFO").read_bytes())
        else:
            info = next(tree.glob("*.dist-info"))
            raw, _ = parse_email((info / "METADATA").read_bytes())
        assert Version(str(raw["version"])) == Version(pin_version)
        assert canonicalize_name(str(raw["name"])) == canonicalize_name(PROJECT)
        assert sorted(os.listdir(source.tree.parent)) == [MANIFEST, "tree"]
        # the digest recorded while unpacking is the tree's (what the wheel stage checks)
        assert source.tree_sha256 == sha256_tree(source.tree)
        if kind == "wheel":
            ours = f"{Version(pin_version)}+sm120.1"
            repacked = repack_wheel(archive, tree, ours, "p.json", b"{}\n", 0, work / "cache")
            assert repacked.path.name == f"{escaped}-{ours}-py3-none-any.whl"
            with zipfile.ZipFile(repacked.path) as out:
                meta = out.read(f"{escaped}-{ours}.dist-info/METADATA")
            raw, unparsed = parse_email(meta)
            assert raw["version"] == ours and not unparsed
