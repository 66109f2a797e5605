"""The JIT cache artifact: Triton's and TileLang's caches built ahead, shipped as one wheel.

:func:`builder.kernels.triton_cache.build_triton_cache` and
:func:`builder.kernels.tilelang_cache.build_tilelang_cache` write a cache folder each, in
the layout its framework reads (``TRITON_CACHE_DIR``, ``TILELANG_CACHE_DIR``).
:func:`pack_jit_caches` packs them into one wheel, ``sglang-sm120-jit-caches``: the package
``sglang_sm120_jit_caches`` holds ``triton/`` and/or ``tilelang/`` (the cache entries only:
Triton's kernel-key folders, TileLang's ``<version>/<platform>/kernels/<key>`` folders) and
one manifest, :data:`MANIFEST`, with the key the server's launcher checks: per framework
the version and target arch it was built with, plus the sglang release, the target and the
platform.

**Why a wheel of its own** (and not the kernel wheel's package data, nor a folder the image
copies): it travels the way the kernel wheels already do. ``image --kernel-wheel WHEEL``
(and a plain ``pip install`` next to a pip-installed sglang) installs it with the same one
``pip install --no-deps`` step of ``images/Dockerfile``, so the image still adds one layer,
needs no new flag, no Dockerfile step and no fixed path, and ``pip uninstall`` removes it.
The FlashInfer kernel wheel is keyed by FlashInfer and the CUDA lane and is built (and
cached) from another input; the Triton cache is keyed by triton, the sglang release and the
launches recorded on a GPU: one wheel for both would rebuild each whenever the other
changes. The launcher ``sglang-sm120-serve`` finds the package where Python imports it
(``importlib.util.find_spec``, without importing it) and, before ``launch_server``, copies
every entry the server's cache folder lacks into it (``restore_jit_caches`` there): the
cache folders stay the server's own (writable, where SGLang points them), never replaced.

The manifest is the one contract between this module and the launcher (a stdlib-only
script that cannot import this one): format :data:`FORMAT`, ``frameworks.<name>`` with
``version``, ``arch``, ``capability`` (``major * 10 + minor``, what both frameworks key by:
Triton's ``GPUTarget`` arch, TileLang's ``sm_<cc>a``), ``entry_depth`` and ``entries``, and
for Triton ``python``, the ``major.minor`` it was built under (Triton's key hashes
``libtriton``, built per Python; the wheel's Python tag says the same to pip).

Inductor's cache (what SGLang's ``torch.compile`` helpers compile at first use) is the one
part not built here: Inductor benchmarks its candidate kernels on the GPU. It is carried as
a GPU server run left it (:class:`InductorCapture`, ``frameworks.inductor``: ``version`` is
torch's, ``entry_depth`` 0, restored file by file) and Inductor's own key (torch, Triton, the
GPU, the graph) decides at the server whether an entry is taken.

The launcher's kept backend selections of the recorded run (:func:`selection_files`, the
manifest's ``selection``) ride along: the launcher reads ``selection/<key>.json`` here
when its own key of a start (``selection_key`` in ``sglang-sm120-serve``) names one.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.arch import parse_arch
from builder.core.cache import atomic_copy, replaceable
from builder.core.errors import BuildError, ConfigurationError
from builder.core.options import Options, select_target
from builder.core.userfiles import parse_json, read_input
from builder.kernels import tilelang_cache, triton_cache
from builder.kernels.jitcache import wheel_tag, write_wheel

PACKAGE = "sglang_sm120_jit_caches"
DISTRIBUTION = "sglang-sm120-jit-caches"
#: The artifact's manifest, beside the package's ``__init__.py`` (the launcher reads it).
MANIFEST = "sm120-jit-caches.json"
FORMAT = 1
#: Per framework: its cache folder's own manifest (read, not shipped), the manifest key of
#: the version it was built with, and how deep an entry lies under the cache folder:
#: Triton's ``<key>/`` (triton 3.9 ``FileCacheManager``: one folder per kernel key),
#: TileLang's ``<version>/<platform>-<machine>/kernels/<key>/`` (tilelang 0.1.12
#: ``tilelang/cache/kernel_cache.py``).
FRAMEWORKS: dict[str, tuple[str, str, int]] = {
    "triton": (triton_cache.MANIFEST, "triton", 1),
    "tilelang": (tilelang_cache.MANIFEST, "tilelang", 4),
}

#: Inductor's cache, captured from a GPU run (:class:`InductorCapture`).
INDUCTOR = "inductor"
#: The launcher's kept selections of a recorded run (``keep_selection`` in
#: ``sglang-sm120-serve``: ``selection/<key>.json``, format 1), shipped as they are: a
#: start whose inputs give the same key takes one instead of running the selection.
SELECTION = "selection"
SELECTION_FORMAT = 1
SELECTION_NAME = re.compile(r"[0-9a-f]{64}\.json")
#: The largest kept selection the launcher reads (its ``SELECTION_MAX``).
SELECTION_MAX = 4 * 1024 * 1024

_INIT = '''"""Triton/TileLang caches built ahead (and Inductor's, captured) by sglang-sm120-builder
for {target}.

sglang-sm120-serve copies the entries the server's cache folders lack from triton/,
tilelang/ and inductor/ here when {manifest} beside this file matches the installed
frameworks and the GPU.
"""

import os

FOLDER = os.path.dirname(__file__)
'''


@dataclass(frozen=True)
class InductorCapture:
    """Inductor's cache folder as a server run on the GPU left it, and what it ran.

    SGLang's ``torch.compile`` helpers (0.5.16's ``moe_sum_reduce_torch_compile`` in
    ``layers/moe/moe_runner/triton_utils/fused_moe.py``, with the Triton MoE runner) are
    compiled by Inductor at first use, which benchmarks its candidate kernels on the GPU
    (its ``.best_config`` files), so they cannot be built on a CPU. Inductor's entries are
    whole files keyed by torch, Triton, the GPU and the graph (``FxGraphCache``, torch
    2.11); a folder copied elsewhere is found there (a Triton-bundled FX graph entry holds
    its kernels).

    Attributes:
        folder: the run's ``TORCHINDUCTOR_CACHE_DIR``: torch's default
            ``/tmp/torchinductor_<user>`` (``default_cache_dir`` in
            ``torch/_inductor/runtime/cache_dir_utils.py``), ``$SGLANG_CACHE_DIR/inductor``
            from SGLang 0.5.20 (``third_party_cache_defaults`` in ``sglang/srt/environ.py``).
        torch: the torch version the server ran (the launcher compares it).
        python: the server's ``major.minor`` (Inductor's key holds Triton's, which hashes
            ``libtriton``, built per Python).
        arch: the GPU's arch, as the artifact's (``sm_90a``, ``12.0f``).
    """

    folder: Path
    torch: str
    python: str
    arch: str


#: A path component of a cache entry, as the launcher takes it (its ``JIT_ENTRY``): Inductor's
#: and Triton's base32 and hex keys, with their extensions; no hidden name, no space.
ENTRY_NAME = re.compile(r"[0-9A-Za-z_][0-9A-Za-z._+-]{0,199}")


def inductor_files(folder: Path) -> list[tuple[str, Path]]:
    """The files of an Inductor cache folder the launcher restores (arcname below it, path).

    Regular files whose every path component is a cache key's (:data:`ENTRY_NAME`: no
    hidden file, nothing a launcher would skip); Inductor's locks and a writer's
    temporaries left out. A Triton group file (Inductor's own Triton cache) is packed as
    :func:`portable_group` writes it.

    Raises:
        ConfigurationError: ``folder`` does not exist, is no folder, or holds no FX graph
            entry (``fxgraph/<2>/<key>/<file>``, ``FxGraphCache`` in torch 2.11): not the
            cache of a server that compiled.
    """
    hint = ("give the TORCHINDUCTOR_CACHE_DIR a server run on the GPU left "
            "(/tmp/torchinductor_<user>; $SGLANG_CACHE_DIR/inductor from SGLang 0.5.20)")
    if not folder.exists():
        raise ConfigurationError(f"the Inductor cache {folder} does not exist", hint)
    if not folder.is_dir():
        raise ConfigurationError(f"the Inductor cache {folder} is not a folder", hint)
    files = [(path.relative_to(folder).as_posix(), path) for path in _regular_files(folder)]
    files = [(name, path) for name, path in files
             if all(ENTRY_NAME.fullmatch(part) for part in name.split("/"))
             and not name.startswith("locks/") and not name.endswith((".lock", ".tmp"))]
    if not any(name.startswith("fxgraph/") and name.count("/") == 3 for name, _ in files):
        raise ConfigurationError(f"{folder} holds no Inductor FX graph entry "
                                 "(fxgraph/<2>/<key>/<file>)", hint)
    return files


def selection_files(folder: Path) -> list[tuple[str, bytes]]:
    """The launcher's kept selections in ``folder`` (a recorded run's ``selection/``).

    Each entry but the launcher's hidden temporaries (``.selection-*``) must be a regular
    file ``<key>.json`` of at most :data:`SELECTION_MAX` bytes holding a format-1 record of
    that key (``{"format", "key", "observed"}``, ``observed`` a non-empty object), as
    ``keep_selection`` in ``sglang-sm120-serve`` writes it: the launcher takes nothing
    else, so nothing else is shipped.

    Returns:
        ``(name, bytes)`` per file, sorted by name.

    Raises:
        ConfigurationError: ``folder`` is no folder or cannot be read, holds no kept
            selection, or holds another entry (exit 2).
    """
    hint = ("keep only what the launcher wrote there (SGLANG_SM120_TRITON_WATCH/selection/"
            "<key>.json), or remove the folder")
    if not folder.is_dir():
        raise ConfigurationError(f"the kept selections {folder} are not a folder", hint)
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as error:
        raise ConfigurationError(f"the kept selections {folder} cannot be read: "
                                 f"{error.strerror or error}", hint) from None
    found = []
    for entry in entries:
        if entry.name.startswith(".selection-"):
            continue  # a writer's temporary
        path = folder / entry.name
        record: Any = None
        try:
            if entry.is_file(follow_symlinks=False) and SELECTION_NAME.fullmatch(entry.name) \
                    and entry.stat(follow_symlinks=False).st_size <= SELECTION_MAX:
                data = path.read_bytes()
                record = parse_json(data)
        except (OSError, ValueError, RecursionError):
            record = None
        if not isinstance(record, dict) or record.get("format") != SELECTION_FORMAT or \
                record.get("key") != entry.name[:-len(".json")] or \
                not isinstance(record.get("observed"), dict) or not record["observed"]:
            raise ConfigurationError(f"{path} is not a selection the launcher kept", hint)
        found.append((entry.name, data))
    if not found:
        raise ConfigurationError(f"the kept selections {folder} hold none", hint)
    return found


@dataclass(frozen=True)
class JitCacheArtifact:
    """A packed JIT cache artifact.

    Attributes:
        wheel: the ``sglang-sm120-jit-caches`` wheel.
        manifest: its :data:`MANIFEST` (the key the launcher checks).
        kernels: per framework, the build's records (failed ones included), when built here.
    """

    wheel: Path
    manifest: dict[str, Any]
    kernels: dict[str, list[dict[str, Any]]]

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"wheel": str(self.wheel), "manifest": self.manifest,
                "failed": {name: [k for k in records if not k.get("ok", not k.get("error"))]
                           for name, records in self.kernels.items()}}


def cache_entries(folder: Path, depth: int) -> list[str]:
    """The entries of a cache folder: the folders exactly ``depth`` levels down.

    A symlink is never an entry nor walked through (the artifact holds real files only);
    files at a shallower level (a framework's manifest, a lock) are no entries.

    Args:
        folder: the cache folder (``TRITON_CACHE_DIR``'s or ``TILELANG_CACHE_DIR``'s layout).
        depth: :data:`FRAMEWORKS`' entry depth.

    Returns:
        Their paths relative to ``folder``, POSIX, sorted.
    """
    level = [folder]
    for _ in range(depth):
        level = [child for parent in level for child in sorted(parent.iterdir())
                 if child.is_dir() and not child.is_symlink()]
    return [entry.relative_to(folder).as_posix() for entry in level]


def _regular_files(root: Path) -> list[Path]:
    """The regular files under ``root``, sorted; symlinks (to files or folders) skipped."""
    found = []
    for parent, folders, names in os.walk(root, followlinks=False):
        folders[:] = sorted(f for f in folders if not os.path.islink(os.path.join(parent, f)))
        found += [Path(parent, n) for n in sorted(names)
                  if not os.path.islink(os.path.join(parent, n))
                  and os.path.isfile(os.path.join(parent, n))]
    return found


def _framework(name: str, folder: Path) -> tuple[dict[str, Any], list[tuple[str, Path]]]:
    """The manifest record and files (arcname below the framework, path) of one cache."""
    own, version_key, depth = FRAMEWORKS[name]
    hint = (f"give the folder build_{name}_cache wrote (it holds {own})")
    try:
        data = parse_json((folder / own).read_bytes())
        built_with = data["built_with"]
        version, arch = built_with[version_key], built_with["arch"]
        if not isinstance(version, str) or not isinstance(arch, str):
            raise TypeError("version or arch is no string")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigurationError(f"{folder} is not a {name} cache built ahead: {own} "
                                 f"({error})", hint) from None
    entries = cache_entries(folder, depth)
    files = [(path.relative_to(folder).as_posix(), path)
             for entry in entries for path in _regular_files(folder / entry)]
    record = {"version": version, "arch": arch, "capability": triton_cache.capability(arch),
              "entry_depth": depth, "entries": len(entries),
              "built_with": {k: v for k, v in built_with.items() if k != "cache_dir"}}
    if name == "triton" and isinstance(built_with.get("python"), str):
        record["python"] = built_with["python"]  # the launcher compares it with its own
    return record, files


def _is_group(path: Path) -> bool:
    """Whether ``path`` is a Triton group file (``__grp__<kernel>.json``)."""
    return path.name.startswith("__grp__") and path.suffix == ".json"


def portable_group(data: bytes) -> bytes:
    """A Triton group file (``__grp__<kernel>.json``) with its ``child_paths`` reduced to
    file names.

    Triton writes the absolute paths of the entry's files there and, on a lookup, drops
    every child whose path does not exist, so a group naming the build machine's folder is
    a miss at the server (``FileCacheManager.put_group``/``get_group`` and ``compile``,
    triton 3.6 and 3.9). The shipped group names no machine's folder; the launcher points
    it at the folder it restores the entry to (``_point_triton_groups``).

    Args:
        data: the group file's bytes.

    Returns:
        The rewritten bytes; ``data`` itself when it is not such a group.
    """
    try:
        group = json.loads(data)
        group["child_paths"] = {child: os.path.basename(where)
                                for child, where in group["child_paths"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return data
    return json.dumps(group, sort_keys=True).encode()


def _inductor_part(inductor: InductorCapture, manifest: dict[str, Any]
                   ) -> list[tuple[str, bytes, int]]:
    """The wheel's files of an Inductor capture; its record added to ``manifest``.

    Raises:
        ConfigurationError: no FX graph entry, or captured under another Python than the
            Triton cache in ``manifest`` was built under.
    """
    found = inductor_files(inductor.folder)
    built = manifest["frameworks"].get("triton", {}).get("python")
    if built and built != inductor.python:
        raise ConfigurationError(
            f"the Inductor cache was captured under Python {inductor.python}, the Triton "
            f"cache built under {built}: one server runs one Python",
            "build the Triton cache with the server's Python")
    manifest["frameworks"][INDUCTOR] = {
        "version": inductor.torch, "arch": inductor.arch,
        "capability": triton_cache.capability(inductor.arch), "python": inductor.python,
        "entry_depth": 0, "entries": len(found), "captured": "a server run on the GPU"}
    files = []
    for arcname, path in found:
        data = path.read_bytes()
        if _is_group(path):
            data = portable_group(data)  # Inductor's own Triton cache: no machine's path
        files.append((f"{PACKAGE}/{INDUCTOR}/{arcname}", data, 0o644))
    return files


def pack_jit_caches(caches: dict[str, Path], *, target: str, release: str, version: str,
                    epoch: int, out_dir: Path, machine: str | None = None,
                    inductor: InductorCapture | None = None,
                    selections: Path | None = None) -> JitCacheArtifact:
    """Pack built-ahead cache folders into the ``sglang-sm120-jit-caches`` wheel.

    Args:
        caches: ``{"triton": folder, "tilelang": folder}`` (either or both): folders
            :func:`~builder.kernels.triton_cache.build_triton_cache` /
            :func:`~builder.kernels.tilelang_cache.build_tilelang_cache` wrote, each with
            its own manifest (``sm120-triton-cache.json``, ``sm120-tilelang-cache.json``).
        target: the target's name (``sglang-0.5.23``), recorded in the manifest.
        release: the sglang release the caches were built with (``0.5.23``).
        version: the wheel's version (the target's, ``0.5.23+sm120.1``).
        epoch: SOURCE_DATE_EPOCH for the zip and RECORD timestamps (reproducible).
        out_dir: where the wheel is written (created).
        machine: the CPU architecture (default: this machine's). With TileLang, whose
            entries hold a host ``executable.so``, the wheel is tagged for it
            (``manylinux_2_28_<machine>``); Triton's cubins alone give ``none-any``. A
            Triton cache's Python is the wheel's Python tag (``cp312-none-any``): Triton's
            key hashes ``libtriton``, built per Python, so the cache misses on any other.
        inductor: Inductor's cache of a GPU run, carried as it is (:class:`InductorCapture`).
        selections: the launcher's kept selections of that run (:func:`selection_files`),
            shipped as ``selection/`` (the manifest's ``selection.entries``).

    Returns:
        The :class:`JitCacheArtifact`.

    Raises:
        ConfigurationError: no cache given, an unknown framework, a folder without its
            framework's manifest, an Inductor folder without an FX graph entry, an Inductor
            capture of another Python than the Triton cache's, a selection folder holding
            another file than a kept selection, or a wheel path in
            ``out_dir`` that is a link, a folder or another non-file (exit 2; nothing
            written).
        BuildError: a cache holds no entry (nothing was built).
    """
    unknown = sorted(set(caches) - set(FRAMEWORKS))
    if not (caches or inductor) or unknown:
        raise ConfigurationError(f"no JIT cache to pack ({', '.join(unknown) or 'none given'})",
                                 f"give one of {', '.join(FRAMEWORKS)}")
    machine = machine or platform.machine()
    manifest: dict[str, Any] = {
        "format": FORMAT, "target": target, "release": release, "version": version,
        "platform": f"{platform.system().lower()}-{machine}", "frameworks": {}}
    files: list[tuple[str, bytes, int]] = []
    for name in sorted(caches):
        record, found = _framework(name, caches[name])
        if not record["entries"]:
            raise BuildError(f"the {name} cache {caches[name]} holds no kernel",
                             "see its manifest for what failed to compile")
        manifest["frameworks"][name] = record
        for arcname, path in found:
            mode = 0o755 if os.access(path, os.X_OK) else 0o644
            data = path.read_bytes()
            if name == "triton" and _is_group(path):
                data = portable_group(data)
            files.append((f"{PACKAGE}/{name}/{arcname}", data, mode))
    if inductor is not None:
        files += _inductor_part(inductor, manifest)
    if selections is not None:
        kept = selection_files(selections)
        manifest[SELECTION] = {"entries": len(kept),
                               "recorded": "the launcher's kernel check of a recorded run"}
        files += [(f"{PACKAGE}/{SELECTION}/{name}", data, 0o644) for name, data in kept]
    files[:0] = [
        (f"{PACKAGE}/__init__.py", _INIT.format(target=target, manifest=MANIFEST).encode(),
         0o644),
        (f"{PACKAGE}/{MANIFEST}", (json.dumps(manifest, indent=1, sort_keys=True)
                                   + "\n").encode(), 0o644)]
    tag = wheel_tag(machine) if "tilelang" in caches else "py3-none-any"
    python = manifest["frameworks"].get("triton", manifest["frameworks"].get(
        INDUCTOR, {})).get("python")
    if python:  # Triton's key hashes libtriton, built per Python: pip installs it there only
        tag = f"cp{python.replace('.', '')}" + tag[len("py3"):]
    info = f"{PACKAGE}-{version}.dist-info"
    summary = ", ".join(f"{n} {r['version']} for {r['arch']}"
                        for n, r in manifest["frameworks"].items())
    files.append((f"{info}/METADATA", (
        f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {version}\n"
        f"Summary: JIT caches built ahead for {target} ({summary})\n").encode(), 0o644))
    purelib = "false" if "tilelang" in caches else "true"
    files.append((f"{info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: sglang-sm120-builder\n"
                                    f"Root-Is-Purelib: {purelib}\nTag: {tag}\n").encode(),
                  0o644))
    wheel = out_dir / f"{PACKAGE}-{version}-{tag}.whl"
    replaceable(wheel)  # a link, folder or pipe there is refused before anything is written
    # Written beside, then copied whole (atomic_copy, as the kernel wheels reach --dist): a
    # stopped run leaves no half wheel, and nothing is written through a link.
    with tempfile.TemporaryDirectory(prefix="sm120-jit-caches-") as tmp:
        atomic_copy(write_wheel(Path(tmp) / wheel.name, files, epoch), wheel)
    return JitCacheArtifact(wheel, manifest, {})


def artifact_version(target_version: str, arch: str, target_archs: tuple[str, ...]) -> str:
    """The artifact's version: the target's, plus the arch in its local label when the arch
    is not one of the target's own (``0.5.16+sm120.1.sm90a``), as the kernel wheels label
    theirs, so that two archs' wheels never share a name in one folder or index.

    Args:
        target_version: the target's version (``0.5.23+sm120.1``).
        arch: the arch built for (``12.0f``, ``sm_120f``, ``sm_90a``).
        target_archs: the target's ``arch_list``.

    Raises:
        ConfigurationError: ``arch`` is not a CUDA arch.
    """
    def code(text: str) -> tuple[int, int, str]:
        try:
            return parse_arch(text)
        except ValueError as error:
            raise ConfigurationError(str(error), "give an arch such as sm_120a or 12.0f"
                                     ) from error

    major, minor, suffix = code(arch)
    if any(code(own) == (major, minor, suffix) for own in target_archs):
        return target_version
    return f"{target_version}.sm{major}{minor}{suffix}"


def read_specs(path: Path) -> list[str]:
    """Triton specialization records from the user's file or folder.

    Accepted: what ``data/triton_watch.py`` writes (a folder of ``*.jsonl``, or one such
    file: a JSON object per line, ``{"spec": "..."}`` taken, ``{"compile": ...}`` skipped),
    or one JSON list of the records (strings, as Triton's ``jit_cache_hook`` hands them
    over, triton 3.9 ``serialize_specialization_data``).

    Args:
        path: the file or folder.

    Returns:
        The records, duplicates dropped, in their first order.

    Raises:
        ConfigurationError: it cannot be read, is neither form, or holds no record.
    """
    hint = ("give the folder SGLANG_SM120_TRITON_WATCH wrote on the GPU, one of its .jsonl "
            "files, or a JSON list of specialization_data strings")
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise ConfigurationError(f"{path} holds no .jsonl file of triton_watch", hint)
    else:
        files = [path]
    specs: list[str] = []
    for file in files:
        text = read_input(file, "the Triton specs file", hint).decode("utf-8", "replace")
        try:
            whole = parse_json(text)
        except ValueError:
            whole = None
        if isinstance(whole, list):
            bad = [i for i, s in enumerate(whole) if not isinstance(s, str)]
            if bad:
                raise ConfigurationError(f"{file}: item {bad[0]} of the list is no string",
                                         hint)
            specs += whole
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = parse_json(line)
            except ValueError as error:
                raise ConfigurationError(f"{file} line {number} is not JSON ({error})",
                                         hint) from None
            if not isinstance(record, dict) or not ("spec" in record or "compile" in record):
                raise ConfigurationError(f"{file} line {number} is no triton_watch record",
                                         hint)
            if "spec" in record:
                if not isinstance(record["spec"], str):
                    raise ConfigurationError(f"{file} line {number}: spec is no string", hint)
                specs.append(record["spec"])
    if not specs:
        raise ConfigurationError(f"{path} holds no specialization record (only compile "
                                 "events, or nothing)", hint)
    return list(dict.fromkeys(specs))


def _recorded_extras(specs_path: Path) -> tuple[Path | None, Path | None]:
    """A watch folder's ``inductor/`` and ``selection/`` (None where it has none), each
    checked before minutes of fetching and compiling.

    Raises:
        ConfigurationError: :func:`inductor_files`' or :func:`selection_files`' refusals.
    """
    found: list[Path | None] = []
    for name in (INDUCTOR, SELECTION):
        folder = specs_path / name if specs_path.is_dir() else None
        if folder is not None and not (folder.exists() or folder.is_symlink()):
            folder = None  # a run without it: the Triton kernels alone
        found.append(folder)
    if found[0] is not None:
        inductor_files(found[0])
    if found[1] is not None:
        selection_files(found[1])
    return found[0], found[1]


def run_kernels_jit_cache(options: Options, specs_path: Path, arch: str) -> JitCacheArtifact:
    """``kernels jit-cache``: build the target's Triton cache ahead and pack the artifact.

    The specs are read and the arch checked first; then the target's wheel is fetched,
    its series applied (so the kernels are the patched wheel's: a patch that changes a
    kernel changes its key), the triton its server runs found from the release's torch pin
    (:func:`~builder.kernels.serving_triton.serving_triton`: the cache is keyed by the
    triton that compiles it) and installed, and its behaviour environment made (the
    release's own sglang and dependencies);
    :func:`~builder.kernels.triton_cache.build_triton_cache` compiles with that triton, on
    this CPU, and :func:`pack_jit_caches` writes the wheel into ``options.dist_dir``.

    Args:
        options: the run's options (target, cache, ``dist_dir``, reporter).
        specs_path: the specs (:func:`read_specs`). A folder of them may hold
            ``inductor/``: Inductor's cache of that GPU run (its ``TORCHINDUCTOR_CACHE_DIR``,
            copied there once the server stopped), carried in the artifact too
            (:class:`InductorCapture`; its torch is the release's pin); and
            ``selection/``: the selections the image's launcher kept there in that run
            (:func:`selection_files`), shipped too.
        arch: the target arch (``12.0f``, ``sm_120a``; ``sm_90a`` to try it on a Hopper).

    Returns:
        The artifact, with the build's records.

    Raises:
        ConfigurationError: bad specs or arch, an ``inductor/`` that is no server's
            Inductor cache, a ``selection/`` holding another file than a kept selection, or
            a target that pins no wheel for this Python.
        BuildError: Triton's compile did not finish, no spec compiled, or the server's
            triton did not install.
        SourceError: the wheel cannot be fetched, or the triton its server runs cannot be
            found (no exact torch pin, no such torch wheel, no triton requirement).
        PatchError: the series does not apply.
    """
    from builder.behaviour.env import behaviour_env
    from builder.behaviour.run import wheel_for_interpreter
    from builder.kernels.pins import read_pins
    from builder.kernels.serving_triton import install_triton, serving_triton
    from builder.patching.apply import apply_series, read_series
    from builder.patching.series import select_series
    from builder.source.fetch import fetch_pin

    specs = read_specs(specs_path)
    triton_cache.capability(arch)
    inductor, selections = _recorded_extras(specs_path)
    target = select_target(options)
    version = artifact_version(target.version, arch, target.arch_list)
    # the output path is checked before minutes of compiling, not after
    dist = options.dist_dir
    if (dist.exists() or dist.is_symlink()) and not dist.is_dir():
        raise ConfigurationError(f"DIST {dist} is not a folder (nor a link to one)",
                                 "give a folder for the wheel (created when missing)")
    replaceable(dist / f"{PACKAGE}-{version}-cp{sys.version_info[0]}{sys.version_info[1]}"
                       "-none-any.whl")  # the behaviour environment runs this Python
    series = select_series(options, target)
    read_series(series)
    pin = wheel_for_interpreter(target)
    reporter = options.reporter
    source = fetch_pin(pin, target.upstream_version, cache=options.cache,
                       index_url=options.index_url, reporter=reporter)
    assert source.archive is not None  # a wheel pin always has its file
    patched = apply_series(source, series, cache=options.cache)
    release = str(target.upstream_version)
    serving = serving_triton(read_pins(source).torch, cache=options.cache,
                             index_url=options.index_url)
    env = behaviour_env(source.archive, release, cache=options.cache, reporter=reporter)
    triton = install_triton(serving.version, env.python, cache=options.cache,
                            reporter=reporter)
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or source.source_date_epoch)
    with tempfile.TemporaryDirectory(prefix="sm120-triton-") as tmp:
        with reporter.working(f"Triton kernels for {arch} ({len(specs)} specializations)"):
            built = triton_cache.build_triton_cache(env, specs, arch, Path(tmp) / "triton",
                                                    overlay=patched.tree, triton=triton)
        if built.built_with.get("triton") != serving.version:
            raise BuildError(f"the Triton cache was compiled with triton "
                             f"{built.built_with.get('triton')}, not the server's "
                             f"{serving.version} (torch {serving.torch}: {serving.requirement})",
                             f"check the install under {triton}")
        if len(built.failed) == len(built.kernels):
            first = built.failed[0].get("error", "") if built.failed else ""
            raise BuildError(f"none of the {len(built.kernels)} Triton specializations "
                             f"compiled for {arch}: {str(first)[:300]}",
                             "were they recorded with this target's sglang release?")
        python = "{}.{}".format(*sys.version_info[:2])  # the behaviour env's: this one
        captured = None if inductor is None else InductorCapture(inductor, serving.torch,
                                                                  python, arch)
        artifact = pack_jit_caches({"triton": built.folder}, target=target.name,
                                   release=release, version=version, epoch=epoch,
                                   out_dir=options.dist_dir, inductor=captured,
                                   selections=selections)
    return JitCacheArtifact(artifact.wheel, artifact.manifest, {"triton": built.kernels})
