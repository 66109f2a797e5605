"""The kernel stage's output: a ``flashinfer_jit_cache`` wheel FlashInfer looks modules up in.

FlashInfer's lookup (``flashinfer/jit/env.py`` and ``jit/core.py`` of 0.6.x): when a package
``flashinfer_jit_cache`` is importable, its ``__version__`` must start with FlashInfer's own
and a module ``NAME`` is ``<get_jit_cache_dir()>/NAME/NAME.so``; such a spec reports
``is_aot`` and is loaded instead of compiled. ``FLASHINFER_DISABLE_JIT=1`` turns a missing
module into an error rather than a compile.

The wheel also carries ``sm120-manifest.json`` beside ``__init__.py``: the modules with their
sha256 and the SASS/PTX archs cuobjdump found in each, the arch list, the CUDA and nvcc
versions and a hash of the compile flags.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from wheel.wheelfile import WheelFile

from builder.core.errors import BuilderError
from builder.wheel.repack import record_timestamp, zip_timestamp

PACKAGE = "flashinfer_jit_cache"
MANIFEST = "sm120-manifest.json"
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
    stamp = zip_timestamp(epoch)
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
    with record_timestamp(epoch), WheelFile(destination, "w") as wheel:
        for arcname, data, mode in files:
            entry = zipfile.ZipInfo(arcname, date_time=stamp)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = (0o100000 | mode) << 16
            wheel.writestr(entry, data)
    return destination


def read_manifest(wheel: Path) -> dict[str, Any]:
    """The manifest inside a kernel wheel.

    Raises:
        BuilderError: the file is not a kernel wheel of this builder.
    """
    try:
        with zipfile.ZipFile(wheel) as archive:
            data: dict[str, Any] = json.loads(archive.read(f"{PACKAGE}/{MANIFEST}"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
        raise BuilderError(f"{wheel} is not a kernel wheel of this builder ({error})",
                           "build one with `python -m builder kernels`") from None
    return data
