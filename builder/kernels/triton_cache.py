"""Triton's JIT cache built ahead, on a machine without a GPU, for a target arch.

SGLang's Triton kernels compile at their first launch into ``TRITON_CACHE_DIR`` (SGLang
0.5.23 points it at ``$SGLANG_CACHE_DIR/triton``: ``third_party_cache_defaults`` in
``sglang/srt/environ.py``). :func:`build_triton_cache` compiles the launches a server makes
(Triton's own specialization records, see below) in the release's behaviour environment with
``data/triton_aot.py``: Triton's driver reports the target GPU, and the kernel's own
``JITFunction.preload`` computes the key and runs every stage, ptxas included, on the CPU.

**Why the cache is found at the GPU** (triton 3.9.0, ``triton/compiler/compiler.py``
``compile`` and ``get_cache_key``; ``triton/runtime/cache.py`` ``triton_key``): a kernel's
folder is the SHA-256 of ``triton_key()`` (the hashes of triton's own Python sources and of
``libtriton``'s bytes: the same wheel), the source hash (the kernel's code and what it calls,
the signature, constexprs and attributes: the same sglang wheel and the same launch), the
backend hash (``ptxas --version`` of the ptxas triton bundles, and the arch), the options
hash (``extern_libs`` by file content, not path) and the cache-invalidating environment
variables that are set (``triton._C.libtriton.get_cache_invalidating_env_vars``). The key
names no machine or path, but two things tie a cache to where it was built and are handled
where it is shipped (:mod:`builder.kernels.jit_caches` and the launcher): ``libtriton``'s
bytes differ between a triton's wheels for two Pythons (cp311's and cp312's 3.6.0 do), so
the manifest records the Python and a server on another one restores nothing; and each
entry's group file (``__grp__<kernel>.json``) lists its files by absolute path, which
Triton requires to exist (``FileCacheManager.get_group``), so the shipped group lists file
names and the launcher points them at the folder it restores to. A launch whose key differs
(another triton, Python, ptxas, arch, launch, or such a variable set) misses and compiles
as without the cache: a mismatch costs the compile, never a wrong kernel.

**Where the specializations come from.** A launch's specialization depends on its
arguments (dtypes, integer and pointer divisibility, constexprs such as block sizes that
SGLang picks per device), so the list is recorded from a server run: Triton hands each new
one to ``knobs.runtime.jit_cache_hook`` as ``specialization_data`` (``data/triton_watch.py``
records them, and every compile with its cache hit, on the GPU). A list recorded on another
arch is retargeted; where SGLang picks launch parameters by the device (the fused MoE's
per-device configs), such a list holds the other device's choices and the target's launches
miss.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.behaviour.env import BehaviourEnv
from builder.core.arch import parse_arch
from builder.core.errors import BuildError, ConfigurationError

SCRIPT = Path(__file__).parent / "data" / "triton_aot.py"
#: Folder of the behaviour scripts' ``standins.py`` (the compiled packages a CPU cannot load).
STANDINS = Path(__file__).resolve().parent.parent / "behaviour" / "script"
#: Written into the cache folder: what the cache was built with and for.
MANIFEST = "sm120-triton-cache.json"


@dataclass(frozen=True)
class TritonCache:
    """A Triton cache built ahead.

    Attributes:
        folder: the cache folder (``TRITON_CACHE_DIR``'s layout: one folder per kernel key).
        kernels: one record per specialization: ``kernel``, ``ok``, ``retargeted``, the
            compile ``events`` (``cache_hit``, ``hash``) or the ``error``.
        built_with: triton's version, the ptxas versions, the arch, the cache-invalidating
            environment variables that were set.
    """

    folder: Path
    kernels: list[dict[str, Any]]
    built_with: dict[str, Any]

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The specializations that did not compile."""
        return [k for k in self.kernels if not k["ok"]]


def capability(arch: str) -> int:
    """Triton's ``GPUTarget`` arch for ``arch`` (``sm_90a`` -> 90, ``12.0f`` -> 120).

    Raises:
        ConfigurationError: not a CUDA arch.
    """
    try:
        major, minor, _ = parse_arch(arch)
    except ValueError as error:
        raise ConfigurationError(str(error), "give an arch such as sm_120a or 12.0f") from error
    return major * 10 + minor


def run_script(env: BehaviourEnv, request: dict[str, Any], cache_dir: Path, *,
               overlay: Path | None = None, triton: Path | None = None, timeout: int = 3600
               ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run ``data/triton_aot.py`` in ``env`` with ``TRITON_CACHE_DIR=cache_dir``.

    Args:
        env: the release's behaviour environment (its pinned triton and sglang).
        request: the script's input (its module docstring); ``standins`` and
            ``standins_path`` are added.
        cache_dir: Triton's cache folder for the run.
        overlay: the patched release's tree, put before the installed sglang (a patch that
            changes a kernel, or what it calls, changes its key).
        triton: a folder holding another ``triton`` package, put first (before the
            overlay and the environment's own triton):
            :func:`builder.kernels.serving_triton.install_triton`'s, the server's triton.
        timeout: seconds.

    Returns:
        ``(records, done)``: one record per spec or launch, and the closing record.

    Raises:
        BuildError: the script did not finish (its last lines in the message).
    """
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "TRITON_"))}
    environ["TRITON_CACHE_DIR"] = str(cache_dir)
    path = [str(p) for p in (triton, overlay) if p is not None]
    if path:
        environ["PYTHONPATH"] = os.pathsep.join(path)
        environ["PYTHONDONTWRITEBYTECODE"] = "1"  # both are cache entries
    full = {**request, "standins": env.standins, "standins_path": str(STANDINS)}
    return run_aot(env.python, SCRIPT, full, environ, framework="Triton", timeout=timeout)


def run_aot(python: Path, script: Path, request: dict[str, Any], environ: dict[str, str], *,
            framework: str, timeout: int = 3600) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run an ahead-of-time compile script of ``data/`` (``triton_aot.py``,
    ``tilelang_aot.py``) with ``python`` and read what it printed: one line
    ``<FRAMEWORK>AOT {json}`` per record and a closing ``<FRAMEWORK>AOT-DONE {json}``.

    Args:
        python: the behaviour environment's interpreter.
        script: the script.
        request: its input (JSON on stdin).
        environ: its environment.
        framework: ``Triton`` or ``TileLang`` (the lines' prefix, upper-cased; the message).
        timeout: seconds.

    Returns:
        ``(records, done)``: the records and the closing record.

    Raises:
        BuildError: the script did not finish (its last lines in the message).
    """
    prefix, closing_prefix = f"{framework.upper()}AOT ", f"{framework.upper()}AOT-DONE "
    done = subprocess.run([str(python), str(script)], input=json.dumps(request),
                          capture_output=True, text=True, env=environ, check=False,
                          timeout=timeout)
    lines = done.stdout.splitlines()
    records = [json.loads(line[len(prefix):]) for line in lines if line.startswith(prefix)]
    closing = [json.loads(line[len(closing_prefix):]) for line in lines
               if line.startswith(closing_prefix)]
    if done.returncode != 0 or not closing:
        tail = "\n".join(done.stderr.strip().splitlines()[-12:])
        raise BuildError(f"{framework}'s ahead-of-time compile stopped (exit "
                         f"{done.returncode}):\n{tail}", f"run builder/kernels/data/"
                         f"{script.name} by hand in the behaviour environment to see why")
    return records, closing[0]


def build_triton_cache(env: BehaviourEnv, specs: list[str], arch: str, dest: Path, *,
                       overlay: Path | None = None, triton: Path | None = None
                       ) -> TritonCache:
    """Compile ``specs`` for ``arch`` into Triton's cache layout under ``dest``, no GPU.

    Args:
        env: the release's behaviour environment
            (``builder.behaviour.env.behaviour_env``): the triton and sglang the server
            runs, so that the keys are the server's.
        specs: Triton's specialization records (``specialization_data`` as
            ``knobs.runtime.jit_cache_hook`` gets it, triton 3.9), one per launch; duplicates
            are compiled once.
        arch: the target, e.g. ``sm_90a`` or ``12.0f`` (Triton targets the capability:
            ``sm_120a`` for 12.0).
        dest: the cache folder to write (created; existing kernels are kept). Ship it as
            ``$SGLANG_CACHE_DIR/triton`` (or ``TRITON_CACHE_DIR``) of the server.
        overlay: the patched release's tree (:func:`builder.patching.apply.apply_series`'s
            ``tree``), so that the kernels are the patched wheel's.
        triton: the server's triton (:func:`builder.kernels.serving_triton.install_triton`),
            imported instead of the environment's: the cache is keyed by the triton that
            compiles it. ``None``: the environment's own (the newest triton, which xgrammar
            pulls in: 3.9.0 on 2026-12-03), right only for a release whose torch requires
            that one.

    Returns:
        What was built (:class:`TritonCache`); :data:`MANIFEST` in ``dest`` says the same.

    Raises:
        ConfigurationError: ``arch`` is not a CUDA arch or one the ptxas of this triton
            does not know (nothing compiled), or a spec is not Triton's JSON.
        BuildError: the script did not finish.
    """
    target = capability(arch)
    unique = list(dict.fromkeys(specs))
    for spec in unique:
        try:
            if not isinstance(json.loads(spec).get("name"), str):
                raise ValueError("no kernel name")
        except (ValueError, AttributeError) as error:
            raise ConfigurationError(f"not a Triton specialization record: {spec[:80]!r} "
                                     f"({error})", "give the specialization_data strings "
                                     "Triton's jit_cache_hook records") from error
    dest.mkdir(parents=True, exist_ok=True)
    records, built_with = run_script(env, {"mode": "build", "arch": target, "specs": unique},
                                     dest, overlay=overlay, triton=triton)
    refused = built_with.get("unknown_arch")
    if refused:
        raise ConfigurationError(
            f"triton {built_with.get('triton')} compiles {arch} as {refused['arch']}, which "
            f"its ptxas does not know", f"give one of {', '.join(refused['known'])} (as 12.0f, "
            "sm_120a or sm_90a)")
    built_with = {**built_with, "arch": arch, "release": env.release}
    manifest = {"built_with": built_with, "kernels": records}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return TritonCache(dest, records, built_with)
