"""The image's launcher restores the JIT cache artifact before the server starts (issue 37):
``restore_jit_caches`` in ``builder/image/data/sglang-sm120-serve``, on artifacts packed by
:func:`builder.kernels.jit_caches.pack_jit_caches`.

The launcher runs as in the image, in a process of its own (``SGLANG_SM120_DRY_RUN=1``,
``SGLANG_SM120_PROFILE=none``), with a folder on ``PYTHONPATH`` holding the distributions'
metadata an image has (``triton``, ``tilelang``, ``sglang``) and an ``nvidia-smi`` on
``PATH`` that reports the GPU's compute capability (none here has a GPU). The cache
folders packed are laid out as Triton's and TileLang's; the real Triton cache, restored
and then found by Triton's launch path, is ``tests/kernels/test_triton_cache.py``'s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from builder.core.errors import BuildError, ConfigurationError
from builder.image.build import read_extra_wheel
from builder.image.profile import LAUNCHER_SOURCE
from builder.kernels.jit_caches import (
    ENTRY_NAME,
    MANIFEST,
    PACKAGE,
    InductorCapture,
    inductor_files,
    pack_jit_caches,
    read_specs,
    selection_files,
)
from builder.kernels.tilelang_cache import MANIFEST as TILELANG_MANIFEST
from builder.kernels.triton_cache import MANIFEST as TRITON_MANIFEST
from tests.helpers.releases import UpstreamRelease
from tests.helpers.tiers import BEHAVIOUR

TRITON_KEYS = ("2XQZBN6M3WQOUSYCBEB4FSGMZKDYTH2JNZV5SEOIHBI5JOUMA3PA",
               "7CBHK6QBRD3OHRPIMQSVUL3QDPMPLQKRYCTVRSYHHMCYKBFZKQ4Q")
TILELANG_ENTRY = "0.1.12/linux-x86_64/kernels/" + "ab" * 32


#: The Python the launcher runs under here (the server's, in an image).
PYTHON = "{}.{}".format(*sys.version_info[:2])
#: Its wheel tag: a Triton cache is tagged for the Python it was built under.
CP = "cp{}{}".format(*sys.version_info[:2])


def _triton_cache(folder: Path, *, arch: str = "sm_90a", version: str = "3.9.0",
                  python: str = PYTHON) -> Path:
    """A folder in Triton's layout (one folder per kernel key) with its build manifest;
    each entry's group file lists its files by absolute path, as Triton writes it."""
    for key in TRITON_KEYS:
        entry = folder / key
        entry.mkdir(parents=True)
        (entry / "k.cubin").write_bytes(key.encode() + b"\x00cubin")
        (entry / "k.json").write_text(json.dumps({"name": "k", "key": key}))
        (entry / "__grp__k.json").write_text(json.dumps({"child_paths": {
            name: str(entry / name) for name in ("k.cubin", "k.json")}}))
    (folder / TRITON_MANIFEST).write_text(json.dumps({"built_with": {
        "triton": version, "arch": arch, "release": "0.5.23", "python": python,
        "cache_dir": str(folder)}, "kernels": []}))
    return folder


def _groups(folder: Path) -> dict[str, dict[str, str]]:
    return {p.relative_to(folder).as_posix(): json.loads(p.read_text())["child_paths"]
            for p in sorted(folder.rglob("__grp__*.json"))}


def _tilelang_cache(folder: Path, arch: str = "sm_90a") -> Path:
    entry = folder / TILELANG_ENTRY
    entry.mkdir(parents=True)
    (entry / "executable.so").write_bytes(b"\x7fELF host")
    (entry / "executable.so").chmod(0o755)
    (entry / "kernel.cu").write_text("// device code")
    (folder / TILELANG_MANIFEST).write_text(json.dumps({"built_with": {
        "tilelang": "0.1.12", "target_arch": "sm_90a", "arch": arch, "release": "0.5.23"}}))
    return folder


def _artifact(tmp_path: Path, **caches: Path) -> Path:
    """The artifact packed, and installed as pip installs a wheel (unpacked into a site
    folder); returns its package folder."""
    packed = pack_jit_caches(caches, target="sglang-0.5.23", release="0.5.23",
                             version="0.5.23+sm120.1", epoch=1_700_000_000,
                             out_dir=tmp_path / "dist", machine="x86_64")
    return install(packed.wheel, tmp_path / "artifact-site") / PACKAGE


def install(wheel: Path, site: Path) -> Path:
    """Unpack ``wheel`` into ``site`` as pip installs it: the files, and the executable bit
    where the archive's mode has one (pip 26.3, ``_internal/operations/install/wheel.py``
    ``ZipBackedFile.save``)."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
        for info in archive.infolist():
            if (info.external_attr >> 16) & 0o111:
                (site / info.filename).chmod(0o755)
    return site


def _launch(tmp_path: Path, artifact: Path | None, *, capability: str = "9.0",
            versions: dict[str, str] | None = None, **environ: str
            ) -> subprocess.CompletedProcess[str]:
    """The launcher's dry run; ``artifact`` is found on PYTHONPATH (None: not installed)."""
    site = tmp_path / "site"
    versions = {"triton": "3.9.0", "tilelang": "0.1.12", "sglang": "0.5.23+sm120.1",
                **(versions or {})}
    for dist, version in versions.items():
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\n"
                                       f"Version: {version}\n")
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    smi = tools / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$*\" in *compute_cap*) echo " + capability +
                   ";; *) echo 'NVIDIA H200';; esac\n")
    smi.chmod(0o755)
    path = [str(site)] + ([str(artifact.parent)] if artifact is not None else [])
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SGLANG", "TRITON", "TILELANG", "PYTHON"))}
    env.update({"SGLANG_SM120_PROFILE": "none", "SGLANG_SM120_DRY_RUN": "1",
                "PYTHONPATH": os.pathsep.join(path), "HOME": str(tmp_path / "home"),
                "PATH": os.pathsep.join([str(tools), os.path.dirname(sys.executable)]),
                **environ})
    return subprocess.run([sys.executable, str(LAUNCHER_SOURCE), "--model-path", "/m"],
                          env=env, capture_output=True, text=True, timeout=120)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_entry_is_restored_where_the_server_reads_it(tmp_path: Path) -> None:
    built = _triton_cache(tmp_path / "triton")
    tilelang = _tilelang_cache(tmp_path / "tilelang")
    artifact = _artifact(tmp_path, triton=built, tilelang=tilelang)
    done = _launch(tmp_path, artifact, TRITON_CACHE_DIR=str(tmp_path / "t"),
                   TILELANG_CACHE_DIR=str(tmp_path / "tl"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"sglang-sm120-serve: JIT caches for sglang-0.5.23: tilelang 1 of 1 kernel(s) "
        f"restored to {tmp_path / 'tl'}; triton 2 of 2 kernel(s) restored to {tmp_path / 't'}"]
    assert "sglang.launch_server" in done.stdout  # the dry run went on
    # the entries only (not the build's manifest), byte for byte but for Triton's group
    # files, which name the restored folder's files; the host library runnable
    assert {k: v for k, v in _tree(tmp_path / "t").items() if "__grp__" not in k} == {
        k: v for k, v in _tree(built).items() if "/" in k and "__grp__" not in k}
    assert _tree(tmp_path / "tl") == {k: v for k, v in _tree(tilelang).items() if "/" in k}
    assert os.access(tmp_path / "tl" / TILELANG_ENTRY / "executable.so", os.X_OK)
    assert not [p for p in (tmp_path / "t").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(("sglang", "environ", "where"), [
    # 0.5.20-0.5.23: `import sglang` points TRITON_CACHE_DIR at $SGLANG_CACHE_DIR/triton
    ("0.5.23+sm120.1", {"SGLANG_CACHE_DIR": "{tmp}/sg"}, "{tmp}/sg/triton"),
    ("0.5.23+sm120.1", {}, "{tmp}/home/.cache/sglang/triton"),
    ("0.5.20", {"SGLANG_CACHE_DIR": "{tmp}/sg"}, "{tmp}/sg/triton"),
    # 0.5.16 redirects nothing: Triton's own default, under TRITON_HOME or the home folder
    ("0.5.16", {"SGLANG_CACHE_DIR": "{tmp}/sg"}, "{tmp}/home/.triton/cache"),
    ("0.5.16", {"TRITON_HOME": "{tmp}/th"}, "{tmp}/th/.triton/cache"),
    # the user's TRITON_CACHE_DIR wins over both
    ("0.5.23", {"SGLANG_CACHE_DIR": "{tmp}/sg", "TRITON_CACHE_DIR": "{tmp}/mine"},
     "{tmp}/mine"),
])
def test_the_folder_is_the_one_the_release_points_triton_at(
        tmp_path: Path, sglang: str, environ: dict[str, str], where: str) -> None:
    artifact = _artifact(tmp_path, triton=_triton_cache(tmp_path / "triton"))
    done = _launch(tmp_path, artifact, versions={"sglang": sglang},
                   **{k: v.format(tmp=tmp_path) for k, v in environ.items()})
    folder = Path(where.format(tmp=tmp_path))
    assert f"triton 2 of 2 kernel(s) restored to {folder}" in done.stderr, done.stderr
    assert sorted(p.name for p in folder.iterdir()) == sorted(TRITON_KEYS)


def test_entries_already_there_are_kept_byte_for_byte(tmp_path: Path) -> None:
    artifact = _artifact(tmp_path, triton=_triton_cache(tmp_path / "triton"))
    mine = tmp_path / "t" / TRITON_KEYS[0]
    mine.mkdir(parents=True)
    (mine / "k.cubin").write_bytes(b"the server's own compile")
    (tmp_path / "t" / "OTHERKEY").mkdir()
    (tmp_path / "t" / "OTHERKEY" / "x.json").write_text("{}")
    before = _tree(tmp_path / "t")
    done = _launch(tmp_path, artifact, TRITON_CACHE_DIR=str(tmp_path / "t"))
    assert "triton 1 of 2 kernel(s) restored" in done.stderr, done.stderr
    assert "(1 there already, kept)" in done.stderr
    after = _tree(tmp_path / "t")
    assert {k: after[k] for k in before} == before  # every file kept, byte for byte
    assert sorted(os.listdir(mine)) == ["k.cubin"]  # nothing merged into the entry
    assert (tmp_path / "t" / TRITON_KEYS[1] / "k.cubin").is_file()
    # a second start adds nothing and changes nothing
    done = _launch(tmp_path, artifact, TRITON_CACHE_DIR=str(tmp_path / "t"))
    assert "triton 0 of 2 kernel(s) restored" in done.stderr, done.stderr
    assert _tree(tmp_path / "t") == after


@pytest.mark.parametrize(("built", "launch", "message"), [
    ({"version": "3.8.0"}, {}, "triton ignored (built with triton 3.8.0, this server has "
                               "3.9.0): its kernels compile at first use"),
    ({}, {"versions": {"triton": "3.9.1"}}, "built with triton 3.9.0, this server has 3.9.1"),
    ({}, {"versions": {"triton": "3.9.0+git1"}}, "this server has 3.9.0+git1"),
    ({"arch": "12.0f"}, {}, "triton ignored (built for 12.0f, this GPU is compute "
                            "capability 9.0): its kernels compile at first use"),
    ({}, {"capability": "12.0"}, "built for sm_90a, this GPU is compute capability 12.0"),
    # triton_key() hashes libtriton, whose bytes differ between a triton's cp311 and cp312
    ({"python": "3.0"}, {}, f"triton ignored (built under Python 3.0, this server runs "
                            f"{PYTHON}): its kernels compile at first use"),
])
def test_a_version_or_arch_that_differs_restores_nothing_with_one_line(
        tmp_path: Path, built: dict[str, str], launch: dict[str, object], message: str
        ) -> None:
    artifact = _artifact(tmp_path, triton=_triton_cache(tmp_path / "triton", **built))
    done = _launch(tmp_path, artifact, TRITON_CACHE_DIR=str(tmp_path / "t"),
                   **launch)  # type: ignore[arg-type]
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()  # exactly one line
    assert line.startswith("sglang-sm120-serve: JIT caches for sglang-0.5.23: ")
    assert message in line, line
    assert not (tmp_path / "t").exists()


def test_triton_groups_name_the_restored_files_not_the_build_folder(tmp_path: Path) -> None:
    """Triton drops a group's child whose path does not exist (``get_group``), so a group
    naming the build folder, gone at the server, is a miss: the wheel ships file names, and
    the launcher points them at the folder it restores to."""
    built = _triton_cache(tmp_path / "build" / "triton")
    artifact = _artifact(tmp_path, triton=built)
    assert _groups(artifact / "triton") == {f"{key}/__grp__k.json": {
        "k.cubin": "k.cubin", "k.json": "k.json"} for key in TRITON_KEYS}
    done = _launch(tmp_path, artifact, TRITON_CACHE_DIR=str(tmp_path / "t"))
    assert "triton 2 of 2 kernel(s) restored" in done.stderr, done.stderr
    restored = _groups(tmp_path / "t")
    assert restored == {f"{key}/__grp__k.json": {
        name: str(tmp_path / "t" / key / name) for name in ("k.cubin", "k.json")}
        for key in TRITON_KEYS}
    assert all(Path(p).is_file() for children in restored.values() for p in children.values())


def test_one_framework_that_differs_leaves_the_other_restored(tmp_path: Path) -> None:
    artifact = _artifact(tmp_path, triton=_triton_cache(tmp_path / "triton"),
                         tilelang=_tilelang_cache(tmp_path / "tilelang"))
    done = _launch(tmp_path, artifact, versions={"tilelang": "0.1.11"},
                   TRITON_CACHE_DIR=str(tmp_path / "t"), TILELANG_CACHE_DIR=str(tmp_path / "tl"))
    (line,) = done.stderr.splitlines()
    assert "tilelang ignored (built with tilelang 0.1.12, this server has 0.1.11)" in line
    assert "triton 2 of 2 kernel(s) restored" in line
    assert not (tmp_path / "tl").exists()


def test_without_a_gpu_it_restores_and_says_the_arch_was_not_checked(tmp_path: Path) -> None:
    artifact = _artifact(tmp_path, triton=_triton_cache(tmp_path / "triton"))
    done = _launch(tmp_path, artifact, capability="", TRITON_CACHE_DIR=str(tmp_path / "t"))
    (line,) = done.stderr.splitlines()
    assert "(no GPU seen: arch not checked): triton 2 of 2 kernel(s) restored" in line


def _broken_manifest(artifact: Path, text: str) -> None:
    (artifact / MANIFEST).write_text(text)


def _manifest_a_folder(artifact: Path) -> None:
    (artifact / MANIFEST).unlink()
    (artifact / MANIFEST).mkdir()


def _manifest(artifact: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((artifact / MANIFEST).read_text())
    return data


@pytest.mark.parametrize(("breaks", "message"), [
    (lambda a: (a / MANIFEST).unlink(), "ignored: unreadable ([Errno 2]"),
    (lambda a: _broken_manifest(a, "{not json"), "ignored: unreadable (Expecting"),
    (lambda a: _broken_manifest(a, "[]"), "ignored: not a format-1 manifest with frameworks"),
    (lambda a: _broken_manifest(a, json.dumps({**_manifest(a), "format": 2})),
     "ignored: not a format-1 manifest with frameworks"),
    (lambda a: _broken_manifest(a, json.dumps({**_manifest(a), "frameworks": {
        "triton": {**_manifest(a)["frameworks"]["triton"],  # type: ignore[index]
                   "entry_depth": "1"}}})), "triton ignored: unreadable (entry_depth '1')"),
    (lambda a: os.rename(a / "triton", a / "moved"), "triton ignored: unreadable ([Errno 2]"),
    (lambda a: _manifest_a_folder(a), f"ignored: {MANIFEST} is not a regular file"),
])
def test_a_malformed_artifact_is_one_line_and_the_start_goes_on(
        tmp_path: Path, breaks: object, message: str) -> None:
    artifact = _artifact(tmp_path, triton=_triton_cache(tmp_path / "triton"))
    breaks(artifact)  # type: ignore[operator]
    done = _launch(tmp_path, artifact, TRITON_CACHE_DIR=str(tmp_path / "t"))
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("sglang-sm120-serve: JIT caches") and message in line, line
    assert "sglang.launch_server" in done.stdout
    assert not (tmp_path / "t").exists()


def test_no_symlink_out_of_the_artifact_is_followed(tmp_path: Path) -> None:
    artifact = _artifact(tmp_path, triton=_triton_cache(tmp_path / "triton"))
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "secret").write_text("not the artifact's")
    (artifact / "triton" / "LINKEDKEY").symlink_to(secret)  # an entry that is a link
    (artifact / "triton" / TRITON_KEYS[0] / "secret").symlink_to(secret / "secret")
    (artifact / "triton" / TRITON_KEYS[1] / "sub").symlink_to(secret)
    done = _launch(tmp_path, artifact, TRITON_CACHE_DIR=str(tmp_path / "t"))
    assert "triton 2 of 2 kernel(s) restored" in done.stderr, done.stderr
    restored = _tree(tmp_path / "t")
    assert not [name for name in restored if "secret" in name or "LINKED" in name], restored
    assert not [p for p in (tmp_path / "t").rglob("*") if p.is_symlink()]

    # the framework's folder itself a link: nothing is taken from it
    (artifact / "triton").rename(tmp_path / "real-triton")
    (artifact / "triton").symlink_to(tmp_path / "real-triton")
    done = _launch(tmp_path, artifact, TRITON_CACHE_DIR=str(tmp_path / "t2"))
    assert "triton ignored: unreadable" in done.stderr and "is a symlink" in done.stderr
    assert not (tmp_path / "t2").exists()


def test_the_variable_points_at_an_artifact_or_turns_the_restore_off(tmp_path: Path) -> None:
    artifact = _artifact(tmp_path, triton=_triton_cache(tmp_path / "triton"))
    done = _launch(tmp_path, None, SGLANG_SM120_JIT_CACHES=str(artifact),
                   TRITON_CACHE_DIR=str(tmp_path / "t"))
    assert "triton 2 of 2 kernel(s) restored" in done.stderr, done.stderr
    done = _launch(tmp_path, artifact, SGLANG_SM120_JIT_CACHES="none",
                   TRITON_CACHE_DIR=str(tmp_path / "t2"))
    assert done.stderr == "" and not (tmp_path / "t2").exists()
    done = _launch(tmp_path, None, TRITON_CACHE_DIR=str(tmp_path / "t3"))  # none installed
    assert done.stderr == "" and not (tmp_path / "t3").exists()


def test_the_wheel_holds_the_entries_and_the_key_and_is_reproducible(tmp_path: Path) -> None:
    triton = _triton_cache(tmp_path / "triton")
    (triton / "LINK").symlink_to(tmp_path)  # never packed
    one = pack_jit_caches({"triton": triton}, target="sglang-0.5.23", release="0.5.23",
                          version="0.5.23+sm120.1", epoch=1_700_000_000,
                          out_dir=tmp_path / "a")
    two = pack_jit_caches({"triton": triton}, target="sglang-0.5.23", release="0.5.23",
                          version="0.5.23+sm120.1", epoch=1_700_000_000,
                          out_dir=tmp_path / "b")
    assert one.wheel.name == f"sglang_sm120_jit_caches-0.5.23+sm120.1-{CP}-none-any.whl"
    assert one.wheel.read_bytes() == two.wheel.read_bytes()
    # the same kernels built in another folder: the same wheel (no build path inside)
    elsewhere = _triton_cache(tmp_path / "elsewhere" / "triton")
    three = pack_jit_caches({"triton": elsewhere}, target="sglang-0.5.23", release="0.5.23",
                            version="0.5.23+sm120.1", epoch=1_700_000_000,
                            out_dir=tmp_path / "d")
    assert three.wheel.read_bytes() == one.wheel.read_bytes()
    # it travels as the kernel wheels do: `image --kernel-wheel` takes it as it is
    extra = read_extra_wheel(one.wheel)
    assert (extra.name, extra.version, extra.manifest) == (
        "sglang-sm120-jit-caches", "0.5.23+sm120.1", None)
    with zipfile.ZipFile(one.wheel) as wheel:
        names = wheel.namelist()
        manifest = json.loads(wheel.read(f"{PACKAGE}/{MANIFEST}"))
    assert sorted(n for n in names if "/triton/" in n) == sorted(
        f"{PACKAGE}/triton/{k}/{f}" for k in TRITON_KEYS for f in ("__grp__k.json", "k.cubin",
                                                                     "k.json"))
    assert manifest["frameworks"]["triton"] == {
        "version": "3.9.0", "arch": "sm_90a", "capability": 90, "entry_depth": 1,
        "entries": 2, "python": PYTHON, "built_with": {
            "triton": "3.9.0", "arch": "sm_90a", "release": "0.5.23", "python": PYTHON}}
    assert (manifest["format"], manifest["target"], manifest["release"]) == (
        1, "sglang-0.5.23", "0.5.23")
    with_tilelang = pack_jit_caches({"triton": triton,
                                     "tilelang": _tilelang_cache(tmp_path / "tl")},
                                    target="t", release="0.5.23", version="1", epoch=0,
                                    out_dir=tmp_path / "c", machine="x86_64")
    assert with_tilelang.wheel.name.endswith(f"-{CP}-none-manylinux_2_28_x86_64.whl")
    tilelang_only = pack_jit_caches({"tilelang": _tilelang_cache(tmp_path / "tl2")},
                                    target="t", release="0.5.23", version="1", epoch=0,
                                    out_dir=tmp_path / "e", machine="x86_64")
    assert tilelang_only.wheel.name.endswith("-py3-none-manylinux_2_28_x86_64.whl")
    # pip installs a Triton cache only for the Python it was built under
    from packaging.tags import Tag
    from packaging.utils import parse_wheel_filename

    assert parse_wheel_filename(one.wheel.name)[3] == frozenset({Tag(CP, "none", "any")})


def test_packing_refuses_what_is_no_built_cache(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigurationError, match="is not a triton cache built ahead"):
        pack_jit_caches({"triton": tmp_path / "plain"}, target="t", release="0.5.23",
                        version="1", epoch=0, out_dir=tmp_path / "d")
    with pytest.raises(ConfigurationError, match="no JIT cache to pack"):
        pack_jit_caches({"cute": tmp_path}, target="t", release="0.5.23", version="1",
                        epoch=0, out_dir=tmp_path / "d")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / TRITON_MANIFEST).write_text(json.dumps({"built_with": {
        "triton": "3.9.0", "arch": "sm_90a"}}))
    with pytest.raises(BuildError, match="holds no kernel"):
        pack_jit_caches({"triton": empty}, target="t", release="0.5.23", version="1",
                        epoch=0, out_dir=tmp_path / "d")


def test_specs_are_read_as_triton_watch_writes_them(tmp_path: Path) -> None:
    spec = json.dumps({"name": "sglang.k", "signature": {}})
    watch = tmp_path / "watch"
    watch.mkdir()
    (watch / "1.jsonl").write_text(json.dumps({"compile": "k", "cache_hit": False, "us": 9})
                                   + "\n" + json.dumps({"spec": spec}) + "\n\n")
    (watch / "2.jsonl").write_text(json.dumps({"spec": spec}) + "\n")
    assert read_specs(watch) == [spec]  # both processes' records, once
    assert read_specs(watch / "2.jsonl") == [spec]
    (tmp_path / "list.json").write_text(json.dumps([spec, spec]))
    assert read_specs(tmp_path / "list.json") == [spec]
    for text, error in (("", "holds no specialization record"),
                        (json.dumps({"compile": "k"}), "holds no specialization record"),
                        ("{oops\n", "line 1 is not JSON"),
                        (json.dumps({"other": 1}), "line 1 is no triton_watch record"),
                        (json.dumps([1]), "item 0 of the list is no string")):
        (tmp_path / "bad.jsonl").write_text(text)
        with pytest.raises(ConfigurationError, match=error):
            read_specs(tmp_path / "bad.jsonl")
    (tmp_path / "no-watch").mkdir()
    with pytest.raises(ConfigurationError, match=r"holds no \.jsonl file"):
        read_specs(tmp_path / "no-watch")


def test_packing_never_writes_through_a_link_or_leaves_a_half_wheel(tmp_path: Path) -> None:
    """A link where the wheel goes is refused and what it points to is left as it was (the
    command once wrote the wheel through it); a second run replaces a wheel whole."""
    triton = _triton_cache(tmp_path / "triton")
    out = tmp_path / "dist"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    name = f"sglang_sm120_jit_caches-1-{CP}-none-any.whl"
    (out / name).symlink_to(victim)
    args = {"target": "t", "release": "0.5.23", "version": "1", "epoch": 0}
    with pytest.raises(ConfigurationError, match="symbolic link"):
        pack_jit_caches({"triton": triton}, out_dir=out, **args)
    assert victim.read_text() == "precious" and (out / name).is_symlink()
    assert sorted(p.name for p in out.iterdir()) == [name]
    (out / name).unlink()
    first = pack_jit_caches({"triton": triton}, out_dir=out, **args).wheel.read_bytes()
    again = pack_jit_caches({"triton": triton}, out_dir=out, **args)
    assert again.wheel.read_bytes() == first and sorted(p.name for p in out.iterdir()) == [name]


# Inductor's cache (issue 37, run 5 of the derived-serving report): SGLang's torch.compile
# helpers compile at first use. Here a function of the shape of 0.5.16's
# moe_sum_reduce_torch_compile is compiled by the release's own torch (its behaviour
# environment; Inductor's CPU backend, as no GPU is here): the cache it leaves is the capture.
_COMPILE = """
import json, torch
from torch._dynamo.utils import counters
@torch.compile
def moe_sum_reduce(x, out, scale):
    torch.sum(x, dim=1, out=out)
    out.mul_(scale)
moe_sum_reduce(torch.randn(4, 8, 64), torch.empty(4, 64), 2.5)
print(json.dumps({"torch": torch.__version__.split("+")[0], **{
    k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}}))
"""


def _inductor_compile(python: Path, cache_dir: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH", "PYTHON"))}
    done = subprocess.run([str(python), "-c", _COMPILE], capture_output=True, text=True,
                          env={**env, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)},
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.slow(reason="compiles with Inductor in sglang 0.5.16's behaviour environment",
                  group=BEHAVIOUR)
def test_an_inductor_cache_captured_is_restored_by_the_launcher_and_hit(
        upstream_0_5_16: UpstreamRelease, tmp_path: Path) -> None:
    python = upstream_0_5_16.env.python
    captured = _inductor_compile(python, tmp_path / "captured")
    assert captured["fxgraph_cache_miss"] == 1  # the GPU run: Inductor compiled
    torch = captured.pop("torch")
    capture = InductorCapture(tmp_path / "captured", torch,
                              "{}.{}".format(*sys.version_info[:2]), "sm_90a")
    packed = pack_jit_caches({}, target="sglang-0.5.16", release="0.5.16",
                             version="0.5.16+sm120.1.sm90a", epoch=1_700_000_000,
                             out_dir=tmp_path / "dist", inductor=capture)
    record = packed.manifest["frameworks"]["inductor"]
    assert (record["version"], record["entry_depth"], record["capability"]) == (torch, 0, 90)
    artifact = install(packed.wheel, tmp_path / "artifact-site") / PACKAGE

    # another torch: nothing restored, one line
    (tmp_path / "o").mkdir()
    other = _launch(tmp_path / "o", artifact, versions={"torch": "2.10.0+cu130"},
                    TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "other"))
    assert f"inductor ignored (built with torch {torch}, this server has 2.10.0)" \
        in other.stderr and not (tmp_path / "other").exists()

    done = _launch(tmp_path, artifact, versions={"torch": f"{torch}+cu130"},
                   TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "server"))
    assert done.returncode == 0, done.stderr
    assert f"inductor {record['entries']} of {record['entries']} file(s) restored to " \
        f"{tmp_path / 'server'}" in done.stderr
    served = _inductor_compile(python, tmp_path / "server")
    # the same start compiled on an empty cache (above); with the restored one it does not
    assert {k: v for k, v in served.items() if k != "torch"} == {"fxgraph_cache_hit": 1}


def test_an_inductor_folder_that_is_no_servers_cache_is_refused(tmp_path: Path) -> None:
    (tmp_path / "inductor" / "aotautograd").mkdir(parents=True)
    with pytest.raises(ConfigurationError, match="holds no Inductor FX graph entry"):
        inductor_files(tmp_path / "inductor")
    (tmp_path / "inductor" / "fxgraph").mkdir()
    (tmp_path / "inductor" / "fxgraph" / "readme.txt").write_text("not an entry")
    with pytest.raises(ConfigurationError, match="holds no Inductor FX graph entry"):
        inductor_files(tmp_path / "inductor")
    with pytest.raises(ConfigurationError, match="does not exist"):
        inductor_files(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigurationError, match="is not a folder"):
        inductor_files(tmp_path / "file")


def test_a_selection_folder_holding_anything_but_kept_selections_is_refused(
        tmp_path: Path) -> None:
    folder = tmp_path / "selection"
    folder.mkdir()
    key = "ab" * 32
    record = {"format": 1, "key": key, "observed": {"attention_backend": "flashinfer"}}
    (folder / f"{key}.json").write_text(json.dumps(record))
    (folder / ".selection-x1y2").write_text("half written")  # the launcher's temporary
    assert [name for name, _ in selection_files(folder)] == [f"{key}.json"]
    (folder / f"{'cd' * 32}.json").write_text(json.dumps(record))  # another key inside
    with pytest.raises(ConfigurationError, match="is not a selection the launcher kept"):
        selection_files(folder)
    (folder / f"{'cd' * 32}.json").unlink()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(ConfigurationError, match=r"notes\.txt is not a selection"):
        selection_files(folder)
    with pytest.raises(ConfigurationError, match="are not a folder"):
        selection_files(folder / "notes.txt")
    (folder / "notes.txt").unlink()
    # what the launcher would not take is not shipped (a fresh walk found these packed as
    # 0 entries, or crashing the command): each refused, by name
    other = "ef" * 32
    for make in (lambda p: p.symlink_to(folder / f"{key}.json"), lambda p: p.mkdir(),
                 lambda p: os.mkfifo(p),
                 lambda p: p.write_text("[" * 200_000 + "]" * 200_000),
                 lambda p: p.write_text(json.dumps({**record, "key": other,
                                                    "observed": {}})),
                 lambda p: p.write_bytes(json.dumps({**record, "key": other}).encode()
                                         + b" " * (4 * 1024 * 1024))):
        make(folder / f"{other}.json")
        with pytest.raises(ConfigurationError, match=f"{other}.json is not a selection"):
            selection_files(folder)
        path = folder / f"{other}.json"
        path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
    (folder / f"{key}.json").unlink()
    with pytest.raises(ConfigurationError, match="hold none"):
        selection_files(folder)


def _inductor_cache(folder: Path) -> Path:
    """An Inductor cache's layout (torch 2.11): an FX graph entry, a kernel module, its
    autotune result, and a Triton entry of Inductor's own Triton cache with its group file
    (absolute paths, as Triton writes them)."""
    entry = folder / "fxgraph" / "hj" / "fhjjlbk5oqjid6z6"
    entry.mkdir(parents=True)
    (entry / "2y7spbqg44mwzbax").write_bytes(b"pickled entry")
    (folder / "ra").mkdir()
    (folder / "ra" / "cra2jccenp7eeuhtmhvh.py").write_text("# kernel module\n")
    (folder / "ra" / "4d3094f98d410421.best_config").write_text("{}")
    kernel = folder / "triton" / "0" / "KEYKEYKEY"
    kernel.mkdir(parents=True)
    (kernel / "k.cubin").write_bytes(b"cubin")
    (kernel / "__grp__k.json").write_text(json.dumps({"child_paths": {
        "k.cubin": "/gpu-machine/inductor/triton/0/KEYKEYKEY/k.cubin"}}))
    (folder / "locks").mkdir()
    (folder / "locks" / "x.lock").write_text("")
    (folder / ".ssh").mkdir()
    (folder / ".ssh" / "id_rsa").write_text("secret")
    (folder / "ra" / "name with space").write_text("x")
    return folder


def test_an_inductor_cache_is_packed_as_the_launcher_takes_it_and_restored_file_by_file(
        tmp_path: Path) -> None:
    capture = InductorCapture(_inductor_cache(tmp_path / "captured"), "2.11.0", "{}.{}".format(
        *sys.version_info[:2]), "sm_90a")
    packed = pack_jit_caches({}, target="sglang-0.5.16", release="0.5.16",
                             version="0.5.16+sm120.1.sm90a", epoch=1_700_000_000,
                             out_dir=tmp_path / "dist", inductor=capture)
    with zipfile.ZipFile(packed.wheel) as archive:
        names = sorted(n.split("/inductor/", 1)[1] for n in archive.namelist()
                       if "/inductor/" in n)
        group = json.loads(archive.read(f"{PACKAGE}/inductor/triton/0/KEYKEYKEY/__grp__k.json"))
    assert names == ["fxgraph/hj/fhjjlbk5oqjid6z6/2y7spbqg44mwzbax",
                     "ra/4d3094f98d410421.best_config", "ra/cra2jccenp7eeuhtmhvh.py",
                     "triton/0/KEYKEYKEY/__grp__k.json", "triton/0/KEYKEYKEY/k.cubin"]
    assert group["child_paths"] == {"k.cubin": "k.cubin"}  # no machine's folder
    artifact = install(packed.wheel, tmp_path / "artifact-site") / PACKAGE
    dest = tmp_path / "server"
    done = _launch(tmp_path, artifact, versions={"torch": "2.11.0+cu130"},
                   TORCHINDUCTOR_CACHE_DIR=str(dest))
    assert f"inductor 5 of 5 file(s) restored to {dest}" in done.stderr, done.stderr
    assert json.loads((dest / "triton/0/KEYKEYKEY/__grp__k.json").read_text()) == {
        "child_paths": {"k.cubin": str(dest / "triton/0/KEYKEYKEY/k.cubin")}}

    # a destination that cannot take a file: counted, said, the rest restored, rc 0
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "ra").write_text("a file where a folder goes")
    done = _launch(tmp_path, artifact, versions={"torch": "2.11.0+cu130"},
                   TORCHINDUCTOR_CACHE_DIR=str(blocked))
    assert done.returncode == 0
    assert f"inductor 3 of 5 file(s) restored to {blocked}; cannot write 2 to {blocked}: ra/" \
        in done.stderr, done.stderr

    # an artifact whose inductor/ folder is gone: one line, nothing restored
    shutil.rmtree(artifact / "inductor")
    done = _launch(tmp_path, artifact, versions={"torch": "2.11.0+cu130"},
                   TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "none"))
    assert "inductor ignored: unreadable" in done.stderr and not (tmp_path / "none").exists()


def test_the_launchers_entry_name_rule_is_the_packers() -> None:
    source = LAUNCHER_SOURCE.read_text()
    assert f'JIT_ENTRY = re.compile(r"{ENTRY_NAME.pattern}")' in source
