"""Generators of the small lying inputs of issue 19 (copied from shared/cases2/lib/common.py,
the cases' own generators), plus one builder per case folder mirroring its ``make.py``.

Each ``make_*`` function writes the case into a folder and returns what a test needs.
"""
# ruff: noqa
from __future__ import annotations

import base64, csv, hashlib, io, os, tarfile, zipfile
from pathlib import Path

MOD_BEFORE = b'BACKENDS = [\n    "triton",\n    # "flashinfer_cutlass",\n]\n'
MOD_AFTER = b'BACKENDS = [\n    "triton",\n    "flashinfer_cutlass",\n]\n'
PATCH = b'''diff --git a/python/sglang/srt/mod.py b/python/sglang/srt/mod.py
--- a/python/sglang/srt/mod.py
+++ b/python/sglang/srt/mod.py
@@ -1,4 +1,4 @@
 BACKENDS = [
     "triton",
-    # "flashinfer_cutlass",
+    "flashinfer_cutlass",
 ]
'''
STAMP = (2026, 1, 2, 3, 4, 6)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def record_row(name: str, content: bytes) -> list:
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", len(content)]


def wheel_files(name="sglang", ver="0.5.11", info=None, metadata=None, wheel_meta=None,
                mod_path="sglang/srt/mod.py"):
    info = info or f"{name}-{ver}.dist-info"
    metadata = metadata if metadata is not None else (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\nSummary: test\n\nbody\n").encode()
    wheel_meta = wheel_meta if wheel_meta is not None else (
        b"Wheel-Version: 1.0\nGenerator: handmade\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    files = [
        ("sglang/__init__.py", b""),
        ("sglang/srt/__init__.py", b""),
        (mod_path, MOD_BEFORE),
        (f"{info}/METADATA", metadata),
        (f"{info}/WHEEL", wheel_meta),
    ]
    return info, files


def write_wheel(out: Path, info: str, files: list[tuple[str, bytes]], *, record="auto",
                extra_record_rows=(), force_zip64=False):
    """record: 'auto' (correct RECORD), None (no RECORD), or bytes (given RECORD)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if record == "auto":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        seen = set()
        for n, c in files:
            if n in seen:
                continue
            seen.add(n)
            w.writerow(record_row(n, c))
        for row in extra_record_rows:
            w.writerow(row)
        w.writerow([f"{info}/RECORD", "", ""])
        record = buf.getvalue().encode()
    import warnings
    warnings.simplefilter("ignore")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for n, c in files:
            zi = zipfile.ZipInfo(n, date_time=STAMP)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o100644 << 16
            with z.open(zi, "w", force_zip64=force_zip64) as fh:
                fh.write(c)
        if record is not None:
            zi = zipfile.ZipInfo(f"{info}/RECORD", date_time=STAMP)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o100644 << 16
            with z.open(zi, "w", force_zip64=force_zip64) as fh:
                fh.write(record)
    return out


def write_series(d: Path, versions=">=0.5.11", intent=None, patch=PATCH, strip=1,
                 extra_entry=""):
    d = Path(d) / "patches"
    d.mkdir(parents=True, exist_ok=True)
    (d / "0001-enable.patch").write_bytes(patch)
    intent = intent if intent is not None else (
        "[[patch.intent]]\ncheck = \"regex-present\"\nfile = \"python/sglang/srt/mod.py\"\n"
        "pattern = '^\\s+\"flashinfer_cutlass\",$'\n")
    (d / "series.toml").write_text(
        f'[[patch]]\nfile = "0001-enable.patch"\nsha256 = "{hashlib.sha256(patch).hexdigest()}"\n'
        f'description = "enable flashinfer_cutlass"\nstrip = {strip}\nversions = "{versions}"\n'
        f"{extra_entry}\n{intent}")
    return d / "series.toml"


def write_targets(d: Path, *, kind: str, version: str, sha: str, url: str | None,
                  filename: str | None = None, name: str | None = None,
                  upstream_version: str | None = None, extra_target="", extra_source=""):
    name = name or f"t-{version}"
    lines = [f'default = "{name}"', "", "[[target]]", f'name = "{name}"',
             f'upstream_version = "{upstream_version or version}"', 'local_label = "sm120.1"',
             'series = "patches/series.toml"', f'prefer = "{kind}"', 'cuda_lane = "13.0"',
             'arch_list = ["12.0f"]', extra_target, "", "[[target.source]]", f'kind = "{kind}"',
             'project = "sglang"', f'version = "{version}"']
    if filename:
        lines.append(f'filename = "{filename}"')
    lines.append(f'sha256 = "{sha}"')
    if url:
        lines.append(f'url = "{url}"')
    lines.append(extra_source)
    (Path(d) / "targets.toml").write_text("\n".join(lines) + "\n")


def sdist_members(top="sglang-0.5.9", version="0.5.9", pyproject_version=None):
    pkg_info = f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n".encode()
    if pyproject_version is None:
        pyproject = (b'[build-system]\nrequires = ["setuptools", "setuptools-scm"]\n'
                     b'build-backend = "setuptools.build_meta"\n\n[project]\nname = "sglang"\n'
                     b'dynamic = ["version"]\n\n[tool.setuptools_scm]\n'
                     b'\n[tool.setuptools.packages.find]\ninclude = ["sglang*"]\n')
    else:
        pyproject = (b'[build-system]\nrequires = ["setuptools"]\n'
                     b'build-backend = "setuptools.build_meta"\n\n[project]\nname = "sglang"\n'
                     + f'version = "{pyproject_version}"\n'.encode() +
                     b'\n[tool.setuptools.packages.find]\ninclude = ["sglang*"]\n')
    return [
        (f"{top}/PKG-INFO", pkg_info),
        (f"{top}/pyproject.toml", pyproject),
        (f"{top}/sglang/__init__.py", b""),
        (f"{top}/sglang/srt/__init__.py", b""),
        (f"{top}/sglang/srt/mod.py", MOD_BEFORE),
    ]


def write_tar(out: Path, members, *, dirs=(), fmt=tarfile.PAX_FORMAT, links=()):
    """members: (name, bytes); dirs: names of dir entries; links: (name, target, 'hard'|'sym')."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz", format=fmt) as t:
        for dname in dirs:
            ti = tarfile.TarInfo(dname)
            ti.type = tarfile.DIRTYPE
            ti.mode = 0o755
            ti.mtime = 1767322000
            t.addfile(ti)
        for n, c in members:
            ti = tarfile.TarInfo(n)
            ti.size = len(c)
            ti.mode = 0o644
            ti.mtime = 1767323000
            t.addfile(ti, io.BytesIO(c))
        for n, target, kind in links:
            ti = tarfile.TarInfo(n)
            ti.type = tarfile.LNKTYPE if kind == "hard" else tarfile.SYMTYPE
            ti.linkname = target
            ti.mtime = 1767323000
            t.addfile(ti)
    return out


# --- the cases (shared/cases2/*/make.py), one function each ------------------------------

import json as _json


def make_wheel_duplicate_zip_entries(here: Path) -> Path:
    info, files = wheel_files()
    files.insert(3, ("sglang/srt/other.py", b"MODE = 'first'\n"))
    files.insert(4, ("sglang/srt/other.py", b"MODE = 'second'\n"))
    whl = write_wheel(here / "upstream/sglang-0.5.11-py3-none-any.whl", info, files)
    write_series(here)
    write_targets(here, kind="wheel", version="0.5.11", sha=sha256(whl), url=whl.as_uri(),
                  filename=whl.name)
    return here


def make_wheel_crlf_metadata(here: Path, body_version: bool = True) -> Path:
    meta = ("Metadata-Version: 2.1\r\nName: sglang\r\nVersion: 0.5.11\r\nSummary: test\r\n"
            "Description-Content-Type: text/plain\r\n\r\nChangelog\r\n"
            + ("Version: 0.5.10 notes\r\n" if body_version else "") + "more text\r\n").encode()
    wheel_meta = (b"Wheel-Version: 1.0\r\nGenerator: bdist_wheel (0.35.1)\r\n"
                  b"Root-Is-Purelib: true\r\nTag: py3-none-any\r\n")
    info, files = wheel_files(metadata=meta, wheel_meta=wheel_meta)
    whl = write_wheel(here / "upstream/sglang-0.5.11-py3-none-any.whl", info, files)
    write_series(here)
    write_targets(here, kind="wheel", version="0.5.11", sha=sha256(whl), url=whl.as_uri(),
                  filename=whl.name)
    return here


def make_sdist_dot_slash_members(here: Path, sub: str) -> Path:
    prefix = {"a": ".", "b": "./sglang-0.5.9"}[sub]
    d = here / sub
    members = [(n.replace("sglang-0.5.9", prefix, 1), c) for n, c in sdist_members()]
    tgz = write_tar(d / "upstream/sglang-0.5.9.tar.gz", members, dirs=[prefix])
    write_series(d, versions=">=0.5.9")
    write_targets(d, kind="sdist", version="0.5.9", sha=sha256(tgz), url=tgz.as_uri())
    return d


def make_index_redirect_relative_urls(here: Path, sub: str) -> Path:
    """Returns the case folder; its index root is ``<folder>/idx``."""
    d = here / sub
    tgz = write_tar(d / "idx/mirror/files/sglang-0.5.9.tar.gz", sdist_members(),
                    dirs=["sglang-0.5.9"])
    sha = sha256(tgz)
    page = d / "idx/mirror/simple/sglang"
    page.mkdir(parents=True, exist_ok=True)
    if sub == "a":
        (page / "index.html").write_text(
            f'<!DOCTYPE html><html><body>\n<a href="../../files/sglang-0.5.9.tar.gz#sha256={sha}">'
            f'sglang-0.5.9.tar.gz</a><br/>\n</body></html>\n')
    else:
        (page / "index.json").write_text(_json.dumps({
            "meta": {"api-version": "1.1"}, "name": "sglang",
            "files": [{"filename": "sglang-0.5.9.tar.gz", "url": "../../files/sglang-0.5.9.tar.gz",
                       "hashes": {"sha256": sha}}]}))
    (d / "idx/_redirects.json").write_text(_json.dumps({"/simple/": "/mirror/simple/"}))
    write_series(d, versions=">=0.5.9")
    write_targets(d, kind="sdist", version="0.5.9", sha=sha, url=None)
    return d


def make_index_pep691_malformed_files(here: Path, sub: str) -> Path:
    d = here / sub
    tgz = write_tar(d / "idx/files/sglang-0.5.9.tar.gz", sdist_members(), dirs=["sglang-0.5.9"])
    sha = sha256(tgz)
    entry = {"filename": "sglang-0.5.9.tar.gz", "url": "/files/sglang-0.5.9.tar.gz"}
    if sub == "a": entry["digests"] = {"sha256": sha}
    if sub == "b": entry["hashes"] = None
    if sub == "c": del entry["url"]; entry["hashes"] = {"sha256": sha}
    page = d / "idx/simple/sglang"
    page.mkdir(parents=True, exist_ok=True)
    (page / "index.json").write_text(_json.dumps({"meta": {"api-version": "1.0"},
                                                  "name": "sglang", "files": [entry]}))
    write_series(d, versions=">=0.5.9")
    write_targets(d, kind="sdist", version="0.5.9", sha=sha, url=None)
    return d


def make_config_bool_as_int(here: Path) -> Path:
    tree = here / "tree/python/sglang/srt"
    tree.mkdir(parents=True, exist_ok=True)
    (here / "tree/python/pyproject.toml").write_text('[project]\nname = "sglang"\n')
    (tree / "mod.py").write_bytes(MOD_BEFORE.replace(b"BACKENDS = [", b"MOE_BACKENDS = ["))
    for name, strip, fuzz in (
            ("a-max-fuzz-true", "true", "max_fuzz = true"),
            ("b-allowance-true", "1", "max_fuzz = 0\n\n[[patch.fuzz_allowance]]\n"
                                      "versions = \">=0.5.9\"\nmax_fuzz = true\nreason = \"x\""),
            ("c-int-control", "1", "max_fuzz = 0")):
        d = here / name
        d.mkdir(exist_ok=True)
        write_series(d, versions=">=0.5.9", strip=strip, extra_entry=fuzz)
    return here


DEAD = b'''    def _should_run_flashinfer_autotune(self):
        backend = self.server_args.moe_runner_backend
        return backend in ["flashinfer_trtllm", "flashinfer_cutlass"]

'''
LIVE = b'''class ModelRunner:
    def _should_run_flashinfer_autotune(self):
        backend = self.server_args.moe_runner_backend
        return backend in [
            "flashinfer_trtllm",
            # "flashinfer_cutlass",
        ]
'''
_PATCH_A = b'''diff --git a/python/sglang/srt/model_executor/model_runner.py b/python/sglang/srt/model_executor/model_runner.py
--- a/python/sglang/srt/model_executor/model_runner.py
+++ b/python/sglang/srt/model_executor/model_runner.py
@@ -7,5 +7,5 @@ class ModelRunner:
         backend = self.server_args.moe_runner_backend
         return backend in [
             "flashinfer_trtllm",
-            # "flashinfer_cutlass",
+            "flashinfer_cutlass",
         ]
'''
_INTENT = '''[[patch.intent]]
check = "literal-contains"
file = "python/sglang/srt/model_executor/*.py"
function = ["_should_run_flashinfer_autotune", "should_run_flashinfer_autotune"]
compared_with = "moe_runner_backend"
value = "flashinfer_cutlass"
'''


def make_intent_function_defined_twice(here: Path, sub: str) -> Path:
    d = here / sub
    me = d / "tree/python/sglang/srt/model_executor"
    me.mkdir(parents=True, exist_ok=True)
    (d / "tree/python/pyproject.toml").write_text('[project]\nname = "sglang"\n')
    if sub == "a":
        (me / "model_runner.py").write_bytes(
            LIVE.replace(b"class ModelRunner:\n", b"class ModelRunner:\n" + DEAD))
        write_series(d, versions=">=0.5.9", patch=_PATCH_A, intent=_INTENT)
    else:
        (me / "model_runner.py").write_bytes(LIVE)
        (me / "model_runner_legacy.py").write_bytes(b"class LegacyModelRunner:\n" + DEAD)
        write_series(d, versions=">=0.5.9", patch=_PATCH_A.replace(b"@@ -7,5 +7,5 @@", b"@@ -3,5 +3,5 @@"),
                     intent=_INTENT)
    return d


def make_archive_version_mismatch(here: Path, sub: str) -> Path:
    d = here / sub
    if sub == "a":
        tgz = write_tar(d / "upstream/sglang-0.5.9.tar.gz",
                        sdist_members(top="sglang-0.5.8", version="0.5.8"), dirs=["sglang-0.5.8"])
        write_series(d, versions=">=0.5.8")
        write_targets(d, kind="sdist", version="0.5.9", sha=sha256(tgz), url=tgz.as_uri())
    else:
        info, files = wheel_files(ver="0.5.10")
        whl = write_wheel(d / "upstream/sglang-0.5.11-py3-none-any.whl", info, files)
        write_series(d, versions=">=0.5.10")
        write_targets(d, kind="wheel", version="0.5.11", sha=sha256(whl), url=whl.as_uri(),
                      filename=whl.name)
    return d
