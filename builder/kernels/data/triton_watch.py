"""Record Triton's compiles and launch specializations in a running server (on the GPU).

Imported at interpreter start in every process of the server (a ``.pth`` line ``import
triton_watch`` in site-packages, this file beside it) when ``SGLANG_SM120_TRITON_WATCH``
names a folder: each process appends JSON lines to ``<folder>/<pid>.jsonl``:

* ``{"compile": kernel, "cache_hit": bool, "us": total, "hash": key}`` for every ``triton.compile``
  (``knobs.compilation.listener``, triton 3.9): ``cache_hit`` false is a compilation;
* ``{"spec": specialization_data}`` for every new launch specialization
  (``knobs.runtime.jit_cache_hook``): the input of
  :func:`builder.kernels.triton_cache.build_triton_cache`.

The hook returns None, so the server compiles and runs as without it. Standard library and
triton only.
"""

from __future__ import annotations

import json
import os
from typing import Any


def _install(folder: str) -> None:
    import triton

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{os.getpid()}.jsonl")

    def write(record: dict[str, Any]) -> None:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

    def listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any,
                 cache_hit: bool) -> None:
        write({"compile": src.name, "cache_hit": cache_hit, "us": times.total,
               "hash": metadata["hash"]})  # the cache entry: a build ahead can be compared

    def hook(**kwargs: Any) -> None:
        write({"spec": kwargs["compile"]["specialization_data"]})

    triton.knobs.compilation.listener = listener
    triton.knobs.runtime.jit_cache_hook = hook


if os.environ.get("SGLANG_SM120_TRITON_WATCH"):
    _install(os.environ["SGLANG_SM120_TRITON_WATCH"])
