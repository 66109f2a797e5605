"""TileLang's kernel cache built ahead, on a machine without a GPU, for a target arch.

The DSA kernels patch 0003 selects on SM12x are TileLang kernels compiled at first use into
``TILELANG_CACHE_DIR`` (SGLang 0.5.23 points it at ``$SGLANG_CACHE_DIR/tilelang``:
``third_party_cache_defaults`` in ``sglang/srt/environ.py``). :func:`build_tilelang_cache`
runs the kernel-fit check's recording (the release's own dispatch on meta tensors, for each
``[[kernel_fit]]`` of the series that applies: ``builder.behaviour.fit``), then calls
each recorded ``@tilelang.jit`` factory for real with the device reported as the target
(``data/tilelang_aot.py``), so TileLang computes its own key and writes the compiled kernel
where a server on that GPU looks.

**Why it is found at the GPU** (tilelang 0.1.12, ``tilelang/cache/kernel_cache.py``
``KernelCache._generate_key`` and ``_get_cache_namespace``): the key is a SHA-256 over the
kernel's TIR script, ``out_idx``, the arguments' ``repr``, ``str(target)``, the execution
backend, pass configs, compile flags and tilelang's version; entries live under
``<version>/<platform>-<machine>/kernels/<key>/`` (the device code, the host wrapper
``executable.so`` and ``params.pkl``). The target is the one TileLang detects from the
device (``tilelang/cuda/target.py``: ``{"kind": "cuda", "arch": "sm_120a"}`` for
capability 12.0), which the reported device gives on the CPU too. Nothing names the GPU
otherwise; a mismatch (another tilelang, arch, or kernel code) is a miss that compiles as
without the cache. The host wrapper is a shared object built here: the serving machine
needs the same platform (``linux-x86_64``, part of the path) and a compatible C++ runtime.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from builder.behaviour.env import BehaviourEnv
from builder.behaviour.fit import find_nvcc, fits_of, tilelang_dir, tilelang_pin
from builder.core.cache import Cache
from builder.core.progress import Reporter
from builder.kernels.triton_cache import capability, run_aot
from builder.patching.series import Series

SCRIPT = Path(__file__).parent / "data" / "tilelang_aot.py"
#: The behaviour scripts' folder (``kernel_fit``, ``sm120_device``, ``standins``).
SCRIPTS = Path(__file__).resolve().parent.parent / "behaviour" / "script"
#: Written into the cache folder: what the cache was built with and for.
MANIFEST = "sm120-tilelang-cache.json"


@dataclass(frozen=True)
class TileLangCache:
    """A TileLang cache built ahead.

    Attributes:
        folder: the cache folder (``TILELANG_CACHE_DIR``'s layout).
        kernels: one record per kernel: ``fit``, ``kernel`` (factory and arguments),
            ``seconds``, ``new_entries`` (0: it was in the cache already), ``error``.
        built_with: tilelang's version, the target arch TileLang detected, the release.
    """

    folder: Path
    kernels: list[dict[str, Any]]
    built_with: dict[str, Any]

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The kernels that did not compile."""
        return [k for k in self.kernels if k["error"]]


def build_tilelang_cache(env: BehaviourEnv, wheel: Path, series: Series, arch: str,
                         dest: Path, *, cache: Cache, overlay: Path | None = None,
                         reporter: Reporter | None = None) -> TileLangCache:
    """Compile the TileLang kernels the release's dispatch picks, for ``arch``, into ``dest``.

    Args:
        env: the release's behaviour environment (``builder.behaviour.env.behaviour_env``).
        wheel: the release's wheel (its ``tilelang==X`` pin is installed beside ``env``,
            as the kernel-fit check does: ``builder.behaviour.fit.tilelang_dir``).
        series: the patch series; the ``[[kernel_fit]]`` declarations of the patches that
            apply to ``env.release`` name the dispatches and shapes.
        arch: the target, e.g. ``sm_90a`` or ``12.0f`` (TileLang targets ``sm_<cc>a``).
        dest: the cache folder to write (created; existing kernels are kept). Ship it as
            ``$SGLANG_CACHE_DIR/tilelang`` (or ``TILELANG_CACHE_DIR``) of the server.
        cache: the builder cache (the tilelang install).
        overlay: the patched release's tree (:func:`builder.patching.apply.apply_series`'s
            ``tree``): patch 0003's dispatch is the patched code's.
        reporter: progress.

    Returns:
        What was built (:class:`TileLangCache`); :data:`MANIFEST` in ``dest`` says the same.

    Raises:
        ConfigurationError: ``arch`` is not a CUDA arch.
        MissingToolError: no nvcc (TileLang compiles with it).
        PatchError: the wheel pins no tilelang.
        BuildError: the script did not finish.
    """
    reporter = reporter or Reporter(quiet=True)
    target = capability(arch)
    fits = [{"id": i, "module": f.module, "function": f.function, "heads": list(f.heads),
             "kv": list(f.kv), "tokens": list(f.tokens)}
            for i, (_entry, f) in enumerate(fits_of(series, Version(env.release)))]
    dest.mkdir(parents=True, exist_ok=True)
    site, _ = tilelang_dir(env, tilelang_pin(wheel), cache=cache, reporter=reporter)
    nvcc = find_nvcc()
    # the release's interpreter, not ours; TileLang's own settings left out (its key)
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "TILELANG_"))}
    environ.update({
        "SM120_CAPABILITY": f"{target // 10}.{target % 10}", "TILELANG_CACHE_DIR": str(dest),
        "PYTHONDONTWRITEBYTECODE": "1",  # the overlay is a cache entry
        "PATH": os.pathsep.join([str(nvcc.parent), environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join([*([str(overlay)] if overlay else []), str(site),
                                       str(SCRIPTS)])})
    request = {"fits": fits, "standins": env.standins}
    with reporter.working(f"TileLang kernels for {arch} ({len(fits)} dispatches)"):
        records, closing = run_aot(env.python, SCRIPT, request, environ,
                                   framework="TileLang")
    built_with = {**closing, "arch": arch, "release": env.release}
    (dest / MANIFEST).write_text(json.dumps({"built_with": built_with, "kernels": records},
                                            indent=1, sort_keys=True) + "\n")
    return TileLangCache(dest, records, built_with)
