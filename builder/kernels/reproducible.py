"""Kernel libraries whose bytes do not depend on where the build ran.

A FlashInfer module's ``.so`` picks up the build machine in three ways (issue 29, measured
with nvcc 13.0.88 and GCC 12.2 on this project's build machines):

* nvcc names a translation unit's internal symbols (``_INTERNAL_<hash>_7_norm_cu_...``)
  after a hash of the source's absolute path (cudafe++'s ``--orig_src_path_name``, as
  ``nvcc --dryrun`` shows), and no nvcc option changes that path. So the build compiles
  in one fixed folder, :data:`FIXED_ROOT`, on every machine: FlashInfer's package (and
  TVM-FFI's, whose headers it includes) is staged there (:func:`stage`: hard links, or
  copies across file systems; FlashInfer resolves its paths, so a symbolic link would not
  do), and FlashInfer's workspace, its generated sources and ``CUDA_HOME`` live there.
* ``__FILE__`` in host code (``TVM_FFI_ICHECK`` and FlashInfer's own checks) expands to
  the absolute path of every header; the toolkit's and the build environment's own
  folders are mapped to fixed names. GCC's ``-ffile-prefix-map=OLD=NEW`` rewrites it
  (GCC manual, "Options for Code Generation Conventions", GCC 8 and later); nvcc passes
  it to every host compiler run, the device-side preprocessing included, through
  ``-Xcompiler``. The C++ sources get it directly.
* nvcc compiles the host side from a temporary file ``tmpxft_<pid>_...cudafe1.cpp``; that
  name, with the process id, becomes an ``STT_FILE`` symbol of every object and then of
  the library's ``.symtab``. No nvcc 13.0 option names that file otherwise, so the
  libraries are linked with ``-s``: ``.symtab`` goes, the dynamic symbols FlashInfer's
  loader needs (``.dynsym``) stay.
* With ``-lineinfo`` or ``-G`` the cubin's line table and the fatbin's ``identifier``
  hold source paths as given on nvcc's command line, which no prefix map reaches. No
  module of the groups the builder builds uses them; :func:`leaked_paths` refuses a
  library that still names a build path, so such a module cannot ship unnoticed.

The job count changes only the order in which ninja runs independent steps; each step's
output depends on its own inputs, and the link takes its objects in the order FlashInfer
wrote them into the graph. Zip dates come from ``SOURCE_DATE_EPOCH``
(:mod:`builder.core.reproducible`).
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Iterable
from pathlib import Path

from builder.core.cache import sha256_json
from builder.core.errors import BuildError

#: Raised when what the flags do changes: part of the kernel entry's key, the manifest and
#: the version lock's digest.
SCHEME = 1

#: The folder every kernel build compiles in, the same on every machine and for every user
#: (one build at a time per machine: a user's builds take turns on their lock beside it, and
#: another user's build is refused while the root is theirs; ``build._workspace``).
FIXED_ROOT = "/tmp/sglang-sm120-build"

#: What :data:`FIXED_ROOT` and the mapped folders read as in the libraries (``__FILE__``).
SHOWN_ROOT = "/sglang-sm120-build"

#: The packages whose files the compile reads (FlashInfer's sources and headers, TVM-FFI's
#: headers) and their metadata, staged into the fixed root.
STAGED = ("flashinfer", "tvm_ffi", "flashinfer_python-*.dist-info",
          "apache_tvm_ffi-*.dist-info")

#: The variables FlashInfer's ``jit/cpp_ext.py`` (0.6.3 to 0.7.2) appends to the C++, CUDA
#: and link flags of every module; the builder puts its own flags first.
FLASHINFER_FLAG_VARIABLES = ("FLASHINFER_EXTRA_CFLAGS", "FLASHINFER_EXTRA_CUDAFLAGS",
                             "FLASHINFER_EXTRA_LDFLAGS")

#: The link flag that drops ``.symtab`` (and with it nvcc's ``tmpxft_<pid>`` file names).
STRIP = "-s"


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(source, destination)


def stage(site_packages: Path, destination: Path) -> list[Path]:
    """Put the :data:`STAGED` packages of ``site_packages`` into ``destination``.

    Returns:
        What was staged (``flashinfer`` first when present).

    Raises:
        BuilderError: ``site_packages`` has no ``flashinfer`` package.
    """
    if not (site_packages / "flashinfer").is_dir():
        raise BuildError(f"{site_packages} has no flashinfer package to build from",
                         "install flashinfer-python in the build environment")
    destination.mkdir(parents=True, exist_ok=True)
    staged = []
    for pattern in STAGED:
        for found in sorted(site_packages.glob(pattern)):
            shutil.copytree(found, destination / found.name, symlinks=True,
                            copy_function=_link_or_copy,
                            ignore=shutil.ignore_patterns("__pycache__"))
            staged.append(destination / found.name)
    return staged


def path_maps(roots: dict[str, Iterable[Path]]) -> list[tuple[str, str]]:
    """The prefix maps of a build: each folder (as given and resolved) to its fixed name.

    Args:
        roots: a fixed name (``"work"``, ``"site-packages"``, ``"cuda"``) to the folders
            that appear as it.

    Returns:
        ``(folder, FIXED_ROOT/name)`` pairs, shortest folder first: GCC applies the last
        map that matches (``remap_filename`` in GCC 12's ``file-prefix-map.cc``), so a
        folder inside another one is mapped by its own entry.
    """
    found: dict[str, str] = {FIXED_ROOT: SHOWN_ROOT}
    for name, folders in roots.items():
        for folder in folders:
            for form in {str(folder), os.path.realpath(folder)}:
                found.setdefault(form.rstrip("/") or "/", f"{SHOWN_ROOT}/mapped/{name}")
    return sorted(found.items(), key=lambda item: (len(item[0]), item))


def flag_environment(maps: list[tuple[str, str]],
                     environ: dict[str, str]) -> dict[str, str]:
    """FlashInfer's extra-flag variables with the prefix maps and ``-s`` first.

    Args:
        maps: from :func:`path_maps`.
        environ: the environment the build starts from; a user's own values of these
            variables are kept after the builder's.

    Returns:
        The three ``FLASHINFER_EXTRA_*`` variables, each a shell-quoted flag list
        (FlashInfer splits them with ``shlex.split``).
    """
    host = [f"-ffile-prefix-map={old}={new}" for old, new in maps]
    flags = {"FLASHINFER_EXTRA_CFLAGS": host,
             "FLASHINFER_EXTRA_CUDAFLAGS": [f"-Xcompiler={flag}" for flag in host],
             "FLASHINFER_EXTRA_LDFLAGS": [STRIP]}
    return {name: " ".join([*map(shlex.quote, value), environ.get(name, "")]).strip()
            for name, value in flags.items()}


def flags_digest(maps: list[tuple[str, str]]) -> str:
    """The sha256 of what the builder adds, machine paths left out (only their fixed
    names): equal on every machine for one scheme."""
    return sha256_json({"scheme": SCHEME, "fixed": sorted({new for _old, new in maps}),
                        "ldflags": [STRIP]})


def leaked_paths(library: Path, folders: Iterable[str]) -> list[str]:
    """The build folders whose path occurs in ``library``'s bytes.

    Args:
        library: a built ``.so``.
        folders: absolute paths of the build machine (build folder, FlashInfer's install,
            the toolkit, the cache).

    Returns:
        Those found, sorted.
    """
    data = library.read_bytes()
    return sorted({f for f in folders if f and f != "/" and f.encode() in data})
