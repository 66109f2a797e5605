"""The kernel stage's output: a ``flashinfer_jit_cache`` wheel FlashInfer looks modules up in.

FlashInfer's lookup (``flashinfer/jit/env.py`` and ``jit/core.py`` of 0.6.x): when a package
``flashinfer_jit_cache`` is importable, its ``__version__`` must start with FlashInfer's own
and a module ``NAME`` is ``<get_jit_cache_dir()>/NAME/NAME.so``; such a spec reports
``is_aot`` and is loaded instead of compiled. ``FLASHINFER_DISABLE_JIT=1`` turns a missing
module into an error rather than a compile.

The wheel also carries ``sm120-manifest.json`` beside ``__init__.py``: the modules with their
sha256 and the SASS/PTX archs cuobjdump found in each, the arch list, the CUDA and nvcc
versions and a hash of the compile flags.

**From FlashInfer 0.7.0** the jit-cache is split (FlashInfer's design note "JIT Cache
Provider Wheels" and ``flashinfer/jit/env.py`` of 0.7.2): ``flashinfer-jit-cache`` is a shim
without libraries that pins per-arch provider wheels exactly (``==`` its own full version);
each provider, e.g. ``flashinfer-jit-cache-sm120f``, is the package
``flashinfer_jit_cache.providers.sm120f`` (``NAME/NAME.so`` under its ``jit_cache``, SASS
only), registers ``sm120f = flashinfer_jit_cache.providers.sm120f:get_provider`` in the
entry-point group ``flashinfer.jit_cache.providers`` and depends on nothing. FlashInfer asks
the shim's ``get_jit_cache_providers()`` for them, ignores a provider whose version is not
the shim's, and picks per module the provider whose arch fits the GPU best (exact, then
family, then unsuffixed). :func:`pack_provider` and :func:`pack_shim` write that pair; the
shim's code is ours (written to that interface), FlashInfer's shim is not on PyPI.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from wheel.wheelfile import WheelFile

from builder.core.errors import BuildError
from builder.core.reproducible import record_timestamp, zip_timestamp
from builder.core.userfiles import parse_json
from builder.kernels import coverage

PACKAGE = "flashinfer_jit_cache"
MANIFEST = coverage.MANIFEST  # the launcher finds it by this name too
MANIFEST_SCHEMA = 1

_INIT = '''"""FlashInfer modules compiled ahead of time by sglang-sm120-builder.

FlashInfer finds module NAME at get_jit_cache_dir()/NAME/NAME.so; sm120-manifest.json
beside this file lists what was built, for which archs, with which toolchain.
"""

import json
import os

__version__ = {version!r}


def get_jit_cache_dir() -> str:
    """The folder holding NAME/NAME.so for every module built."""
    return os.path.join(os.path.dirname(__file__), "jit_cache")


def manifest() -> dict:
    """The build manifest (modules, arch list, CUDA and nvcc versions, flags hash)."""
    with open(os.path.join(os.path.dirname(__file__), {manifest!r})) as handle:
        return json.load(handle)
'''


def wheel_tag(machine: str = "x86_64") -> str:
    """The wheel's tag: pure Python API, but shared libraries for one platform.

    ``manylinux_2_28`` because the libraries need a glibc at least as new as the build
    container's (Debian 12: 2.36; NVIDIA's CUDA images: Ubuntu 22.04+), and 2.28 is what
    FlashInfer's own jit-cache wheels declare.
    """
    return f"py3-none-manylinux_2_28_{machine}"


def pack(modules_dir: Path, version: str, manifest: dict[str, Any], epoch: int,
         out_dir: Path, *, machine: str = "x86_64") -> Path:
    """Pack ``modules_dir`` (``NAME/NAME.so`` each) as a ``flashinfer_jit_cache`` wheel.

    Args:
        modules_dir: compiled modules, one folder each.
        version: ``<flashinfer version>+<label>``.
        manifest: JSON-ready build manifest, stored as ``sm120-manifest.json``.
        epoch: SOURCE_DATE_EPOCH, for the zip and RECORD timestamps.
        out_dir: where the wheel is written.
        machine: the CPU architecture in the platform tag.

    Returns:
        The wheel's path. Entries are sorted and stamped with ``epoch``: the same modules
        give the same bytes.
    """
    tag = wheel_tag(machine)
    destination = out_dir / f"{PACKAGE}-{version}-{tag}.whl"
    files: list[tuple[str, bytes, int]] = [
        (f"{PACKAGE}/__init__.py", _INIT.format(version=version, manifest=MANIFEST).encode(),
         0o644),
        (f"{PACKAGE}/{MANIFEST}", (json.dumps(manifest, indent=2, sort_keys=True)
                                   + "\n").encode(), 0o644)]
    for library in sorted(modules_dir.rglob("*.so")):
        relative = library.relative_to(modules_dir).as_posix()
        files.append((f"{PACKAGE}/jit_cache/{relative}", library.read_bytes(), 0o755))
    info = f"{PACKAGE}-{version}.dist-info"
    archs = " ".join(manifest["arch_list"])
    files.append((f"{info}/METADATA", (
        f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n"
        f"Summary: FlashInfer {manifest['flashinfer_version']} modules for {archs}, "
        f"compiled ahead of time (CUDA {manifest['cuda_version']})\n"
        f"Requires-Dist: flashinfer-python=={manifest['flashinfer_version']}\n").encode(),
        0o644))
    files.append((f"{info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: sglang-sm120-builder\n"
                                    f"Root-Is-Purelib: false\nTag: {tag}\n").encode(), 0o644))
    return write_wheel(destination, files, epoch)


def read_manifest(wheel: Path) -> dict[str, Any]:
    """The manifest inside a kernel wheel.

    Raises:
        BuilderError: the file is not a kernel wheel of this builder.
    """
    try:
        with zipfile.ZipFile(wheel) as archive:
            # A pre-0.7 wheel: beside __init__.py; a provider: in its package folder.
            name = next((n for n in archive.namelist() if n == f"{PACKAGE}/{MANIFEST}" or (
                n.startswith(f"{PACKAGE}/providers/") and n.endswith(f"/{MANIFEST}"))),
                f"{PACKAGE}/{MANIFEST}")
            data = parse_json(archive.read(name))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
        raise BuildError(f"{wheel} is not a kernel wheel of this builder ({error})",
                         "build one with `python -m builder kernels build`") from None
    if not isinstance(data, dict):
        raise BuildError(f"{wheel} is not a kernel wheel of this builder (its {MANIFEST} "
                         f"holds a {type(data).__name__}, not an object)",
                         "build one with `python -m builder kernels build`")
    return data


# --- FlashInfer >= 0.7: a shim and per-arch providers --------------------------------------

#: The entry-point group FlashInfer 0.7's shim discovers providers through.
PROVIDER_GROUP = "flashinfer.jit_cache.providers"
PROVIDER_SCHEMA = 1

_SHIM_INIT = '''"""flashinfer-jit-cache shim by sglang-sm120-builder (FlashInfer >= 0.7 layout).

It holds no libraries. Per-arch provider packages (flashinfer_jit_cache.providers.smXX)
register a factory in the entry-point group {group!r}; FlashInfer asks
get_jit_cache_providers() for them and loads modules from the best-fitting one.
"""

import importlib.metadata
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import FrozenSet, Tuple

__version__ = {version!r}
JIT_CACHE_PROVIDER_ENTRY_POINT_GROUP = {group!r}
JIT_CACHE_PROVIDER_SCHEMA_VERSION = {schema!r}

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JitCacheProvider:
    """One installed provider: where its NAME/NAME.so live, for which archs."""

    provider_id: str
    distribution: str
    version: str
    jit_cache_dir: Path
    cuda_architectures: FrozenSet[str]
    modules: FrozenSet[str]


def _arch(text: str) -> str:
    """12.0f, sm_120f, compute_120f or sm120f -> sm120f."""
    plain = re.sub(r"^(compute_|sm_|sm)", "", str(text).strip().lower()).replace(".", "")
    if not re.fullmatch(r"[0-9]{{2,3}}[af]?", plain):
        raise ValueError("not a CUDA architecture: %r" % (text,))
    return "sm" + plain


def _provider(name: str, data: dict) -> JitCacheProvider:
    if data.get("schema_version") != JIT_CACHE_PROVIDER_SCHEMA_VERSION:
        raise ValueError("manifest schema %r" % (data.get("schema_version"),))
    archs = frozenset(_arch(a) for a in data["cuda_architectures"])
    modules = frozenset(str(m) for m in data["modules"])
    if not archs or not modules:
        raise ValueError("no architectures or no modules")
    return JitCacheProvider(name, str(data["distribution"]), str(data["version"]),
                            Path(str(data["jit_cache_dir"])).resolve(), archs, modules)


def get_jit_cache_providers() -> Tuple[JitCacheProvider, ...]:
    """The installed providers, sorted by id; a broken one is logged and left out."""
    found = []
    for entry in importlib.metadata.entry_points(group=JIT_CACHE_PROVIDER_ENTRY_POINT_GROUP):
        try:
            data = entry.load()()
            found.append(_provider(entry.name, dict(data)))
        except Exception as error:  # a broken provider must not break FlashInfer's import
            _log.warning("ignoring flashinfer jit-cache provider %s: %s", entry.name, error)
    return tuple(sorted(found, key=lambda p: p.provider_id))


def get_jit_cache_dir() -> str:
    """The pre-0.7 single folder; empty in this layout (the providers hold the modules)."""
    return os.path.join(os.path.dirname(__file__), "jit_cache")


def manifest() -> dict:
    """The build manifest of the first provider written by this builder."""
    for provider in get_jit_cache_providers():
        path = provider.jit_cache_dir.parent / {manifest!r}
        if path.is_file():
            return json.loads(path.read_text())
    raise FileNotFoundError("no provider of sglang-sm120-builder is installed")
'''

_PROVIDER_INIT = '''"""FlashInfer modules for {provider}, compiled ahead of time (AOT).

Built by sglang-sm120-builder. A flashinfer-jit-cache provider (FlashInfer >= 0.7):
manifest.json names the modules, jit_cache/NAME/NAME.so holds them (SASS for
{provider} only), sm120-manifest.json says how they were built.
"""

import json
import os

_HERE = os.path.dirname(__file__)


def get_provider() -> dict:
    """The provider manifest FlashInfer's shim reads, with this installation's folder."""
    with open(os.path.join(_HERE, "manifest.json")) as handle:
        data = json.load(handle)
    data["jit_cache_dir"] = os.path.join(_HERE, "jit_cache")
    return data
'''


def provider_id(arch: str) -> str:
    """``12.0f`` -> ``sm120f``: the provider's id and the suffix of its distribution."""
    return "sm" + arch.replace(".", "")


def write_wheel(destination: Path, files: list[tuple[str, bytes, int]], epoch: int) -> Path:
    """Write a reproducible wheel: every entry stamped ``epoch`` (``SOURCE_DATE_EPOCH``),
    deflated, with its mode; ``wheel``'s ``WheelFile`` writes ``RECORD``.

    Args:
        destination: the wheel's path (its file name is the wheel's name and tags).
        files: ``(archive name, bytes, mode)`` for every file but ``RECORD``.
        epoch: the timestamp of every entry.

    Returns:
        ``destination``.
    """
    stamp = zip_timestamp(epoch)
    with record_timestamp(epoch), WheelFile(destination, "w") as wheel:
        for arcname, data, mode in files:
            entry = zipfile.ZipInfo(arcname, date_time=stamp)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = (0o100000 | mode) << 16
            wheel.writestr(entry, data)
    return destination


def _dist_name(distribution: str) -> str:
    return distribution.replace("-", "_")


def pack_provider(modules_dir: Path, version: str, manifest: dict[str, Any], epoch: int,
                  out_dir: Path, *, machine: str = "x86_64") -> Path:
    """Pack ``modules_dir`` as FlashInfer 0.7's provider wheel for the one arch of
    ``manifest["arch_list"]`` (``flashinfer-jit-cache-sm120f``).

    Args:
        modules_dir: compiled modules, ``NAME/NAME.so`` each.
        version: the full version, which the shim pins exactly (``0.7.2+sm120.1.cu130``).
        manifest: our build manifest (stored as ``sm120-manifest.json``).
        epoch: SOURCE_DATE_EPOCH for the zip and RECORD timestamps.
        out_dir: where the wheel is written.
        machine: the CPU architecture in the platform tag.

    Returns:
        The wheel's path.

    Raises:
        BuilderError: the arch list does not hold exactly one arch (a provider declares
            exactly its own).
    """
    if len(manifest["arch_list"]) != 1:
        raise BuildError(f"a FlashInfer >= 0.7 provider holds one arch, not "
                         f"{' '.join(manifest['arch_list'])}", "build once per arch")
    ident = provider_id(manifest["arch_list"][0])
    distribution = f"{PACKAGE.replace('_', '-')}-{ident}"
    package = f"{PACKAGE}/providers/{ident}"
    libraries = sorted(modules_dir.rglob("*.so"))
    names = sorted(library.parent.name for library in libraries)
    contract = {"schema_version": PROVIDER_SCHEMA, "provider_id": ident,
                "distribution": distribution, "version": version,
                "cuda_architectures": [ident], "modules": names}
    # No __init__.py for flashinfer_jit_cache/ or providers/: the shim owns the first, the
    # second is a namespace shared by every provider.
    files: list[tuple[str, bytes, int]] = [
        (f"{package}/__init__.py", _PROVIDER_INIT.format(provider=ident).encode(), 0o644),
        (f"{package}/manifest.json", (json.dumps(contract, indent=2) + "\n").encode(), 0o644),
        (f"{package}/{MANIFEST}", (json.dumps(manifest, indent=2, sort_keys=True)
                                   + "\n").encode(), 0o644)]
    for library in libraries:
        relative = library.relative_to(modules_dir).as_posix()
        files.append((f"{package}/jit_cache/{relative}", library.read_bytes(), 0o755))
    tag = wheel_tag(machine)
    info = f"{_dist_name(distribution)}-{version}.dist-info"
    files.append((f"{info}/METADATA", (
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
        f"Summary: FlashInfer {manifest['flashinfer_version']} modules for {ident} (SASS), "
        f"compiled ahead of time (CUDA {manifest['cuda_version']})\n").encode(), 0o644))
    files.append((f"{info}/entry_points.txt",
                   f"[{PROVIDER_GROUP}]\n{ident} = {package.replace('/', '.')}:get_provider\n"
                   .encode(), 0o644))
    files.append((f"{info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: sglang-sm120-builder\n"
                                    f"Root-Is-Purelib: false\nTag: {tag}\n").encode(), 0o644))
    return write_wheel(out_dir / f"{_dist_name(distribution)}-{version}-{tag}.whl", files,
                        epoch)


def pack_shim(version: str, providers: list[str], flashinfer: str, epoch: int,
              out_dir: Path, *, machine: str = "x86_64") -> Path:
    """Pack FlashInfer 0.7's ``flashinfer-jit-cache`` shim: no libraries, an exact pin on
    each provider (``flashinfer-jit-cache-sm120f==<version>``).

    Args:
        version: the shim's version, equal to every provider's.
        providers: provider ids (``["sm120f"]``).
        flashinfer: FlashInfer's version (for the summary).
        epoch: SOURCE_DATE_EPOCH.
        out_dir: where the wheel is written.
        machine: the CPU architecture in the platform tag.

    Returns:
        The wheel's path.
    """
    tag = wheel_tag(machine)
    info = f"{PACKAGE}-{version}.dist-info"
    pins = "".join(f"Requires-Dist: {PACKAGE.replace('_', '-')}-{ident}=={version}\n"
                   for ident in sorted(providers))
    files: list[tuple[str, bytes, int]] = [
        (f"{PACKAGE}/__init__.py", _SHIM_INIT.format(
            version=version, group=PROVIDER_GROUP, schema=PROVIDER_SCHEMA,
            manifest=MANIFEST).encode(), 0o644),
        (f"{info}/METADATA", (
            f"Metadata-Version: 2.1\nName: {PACKAGE.replace('_', '-')}\nVersion: {version}\n"
            f"Summary: FlashInfer {flashinfer} jit-cache shim for the providers "
            f"{', '.join(sorted(providers))}\n{pins}").encode(), 0o644),
        (f"{info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: sglang-sm120-builder\n"
                           f"Root-Is-Purelib: false\nTag: {tag}\n").encode(), 0o644)]
    return write_wheel(out_dir / f"{PACKAGE}-{version}-{tag}.whl", files, epoch)
