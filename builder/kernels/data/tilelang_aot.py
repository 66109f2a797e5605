"""Compile the TileLang kernels a release's dispatch picks into TileLang's on-disk cache.

Runs inside a release's behaviour environment with the release's pinned tilelang on
``PYTHONPATH`` (a patched ``sglang`` first, for the patched code) and the behaviour scripts'
folder (``kernel_fit``, ``sm120_device``, ``standins``): standard library, torch, tilelang
and sglang only. No GPU: ``sm120_device`` reports the device with the capability in
``SM120_CAPABILITY`` (``9.0`` for an sm_90a build, ``12.0`` for SM120), so TileLang's own
target detection (``tilelang/cuda/target.py``, ``_detect_torch_cuda_arch``: ``sm_90a``,
``sm_120a``) gives the target a server on that GPU gives, and the key with it.

The kernels are those the kernel-fit check records (``kernel_fit.py``: the release's own
dispatch called on meta tensors, every ``@tilelang.jit`` factory it picks, with the
arguments it picks). Each is then called for real, through the factory (``JITImpl``) as
the server calls it: TileLang computes its key (``KernelCache._generate_key``, tilelang
0.1.12), finds the kernel in ``TILELANG_CACHE_DIR`` or lowers, compiles it with nvcc and
writes it there.

Input (stdin, JSON): ``{"fits": [{"id", "module", "function", "heads", "kv", "tokens"}],
"standins": {...}}``. Output: ``TILELANGAOT {json}`` per kernel: ``{"fit", "kernel",
"factory", "seconds", "new_entries", "error"}`` (``new_entries`` 0: the kernel was in the
cache already), and ``TILELANGAOT-DONE {json}`` (tilelang's version, the target).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
from typing import Any

import kernel_fit
import sm120_device
import standins

_PREFIX = "TILELANGAOT "


def _emit(record: dict[str, Any], prefix: str = _PREFIX) -> None:
    print(prefix + json.dumps(record, sort_keys=True), flush=True)


def _entries(root: str) -> int:
    """Kernel folders under TileLang's cache (``<version>/<platform>-<machine>/kernels``)."""
    import glob
    return len(glob.glob(os.path.join(glob.escape(root), "*", "*", "kernels", "*")))


def _recorded(fit: dict[str, Any], dtypes: dict[str, Any]
              ) -> list[tuple[str, str, Any, tuple[Any, ...], dict[str, Any]]]:
    """The factories the dispatch of ``fit`` picks, with their arguments (as kernel_fit)."""
    import torch

    module = importlib.import_module(fit["module"])
    with kernel_fit.recording(module, dtypes) as (recorded, _picked):
        dispatch = getattr(module, fit["function"])
        for kv in fit["kv"]:
            for heads in fit["heads"]:
                for tokens in fit["tokens"]:
                    # a refused case (FP8 KV on some releases) picks nothing
                    with contextlib.suppress(Exception):
                        dispatch(*kernel_fit.dispatch_inputs(torch, kv, heads, tokens),
                                 sm_scale=kernel_fit._D_QK ** -0.5, d_v=kernel_fit._D_V)
    return [(key, *value) for key, value in recorded.items()]


def main() -> int:
    """Read the request; record each dispatch's kernels, then compile each into the cache."""
    request = json.loads(sys.stdin.read())
    sm120_device.install()
    standins.install(request.get("standins", {}))
    import tilelang
    import torch

    dtypes = kernel_fit.torch_dtypes(torch)
    root = os.environ["TILELANG_CACHE_DIR"]
    failed = 0
    for fit in request["fits"]:
        for key, name, factory, args, kwargs in _recorded(fit, dtypes):
            before, start = _entries(root), time.monotonic()
            error = None
            try:
                factory(*args, **kwargs)
            except Exception as exc:  # reported; the other kernels are still built
                error = f"{type(exc).__name__}: {exc}"[:400]
                failed += 1
            _emit({"fit": fit["id"], "kernel": key, "factory": name, "error": error,
                   "seconds": round(time.monotonic() - start, 2),
                   "new_entries": _entries(root) - before})
    try:  # tilelang 0.1.12's detection (the target a server on this GPU compiles for)
        from tilelang.cuda.target import _detect_torch_cuda_arch
        arch = _detect_torch_cuda_arch()
    except ImportError:
        arch = None
    _emit({"tilelang": tilelang.__version__, "target_arch": arch, "failed": failed},
          "TILELANGAOT-DONE ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
