"""Issue 37 on the device: the Triton cache of one served configuration, built ahead with
the GPU hidden and packed as the JIT cache wheel, with the builder's own functions.

Usage (device, repo root; PYTHONPATH = SGLang's site, then the repo):
    CUDA_VISIBLE_DEVICES= [INDUCTOR=DIR] python3 build_jit_cache.py WATCH_DIR ARCH SITE OUT [PYTHON]

``INDUCTOR``: Inductor's cache folder a server run on this GPU left, carried in the wheel
too (:class:`builder.kernels.jit_caches.InductorCapture`, with this Python's torch).
``SELECTION`` (run 7): the launcher's kept selections of that run (its watch folder's
``selection/``), shipped in ``OUT/dist``'s wheel; ``OUT/dist-nosel`` gets the same wheel
without them, for the start to compare with.

``WATCH_DIR`` is what ``triton_watch.py`` recorded in a server run (its ``*.jsonl``).
The compile is :func:`builder.kernels.triton_cache.build_triton_cache` (Triton's driver
replaced by one reporting ARCH: no GPU is touched) in an environment made of this Python
and ``SITE`` (the served sglang 0.5.16 and triton 3.6.0; ``PYTHON``, when given, runs the
compile instead: a behaviour environment's, to try this on the CPU machine), then
:func:`builder.kernels.jit_caches.pack_jit_caches` writes the wheel into ``OUT/dist``.

Why here and not on the CPU machine: Triton's key hashes ``libtriton``, whose bytes differ
per Python, and the server runs Python 3.12; the CPU machine has only 3.11 (no 3.12 is
reachable there). ``kernels jit-cache`` does the same steps in a behaviour environment.
Prints one JSON object: the kernels built, the failures, the wheel and its manifest.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from builder.behaviour.env import BehaviourEnv
from builder.kernels.jit_caches import InductorCapture, pack_jit_caches, read_specs
from builder.kernels.triton_cache import build_triton_cache


def main(argv: list[str]) -> int:
    watch, arch, site, out = argv[:4]
    python = Path(argv[4]) if len(argv) > 4 else Path(sys.executable)
    specs = read_specs(Path(watch))
    env = BehaviourEnv(python=python, release="0.5.16", standins={},
                       not_installed=())
    start = time.monotonic()
    built = build_triton_cache(env, specs, arch, Path(out) / "triton", triton=Path(site))
    seconds = round(time.monotonic() - start, 1)
    inductor = None
    if os.environ.get("INDUCTOR"):
        from importlib.metadata import version
        inductor = InductorCapture(Path(os.environ["INDUCTOR"]),
                                   version("torch").split("+")[0],
                                   "{}.{}".format(*sys.version_info[:2]), arch)
    selections = Path(os.environ["SELECTION"]) if os.environ.get("SELECTION") else None
    args = dict(target="sglang-0.5.16", release="0.5.16", version="0.5.16+sm120.1.sm90a",
                epoch=1_700_000_000, inductor=inductor)
    artifact = pack_jit_caches({"triton": built.folder}, out_dir=Path(out) / "dist",
                               selections=selections, **args)
    if selections is not None:
        pack_jit_caches({"triton": built.folder}, out_dir=Path(out) / "dist-nosel", **args)
    print(json.dumps({"specs": len(specs), "kernels": len(built.kernels),
                      "failed": [{"kernel": k.get("kernel"), "error": str(k.get("error"))[:300]}
                                 for k in built.failed],
                      "seconds": seconds, "wheel": str(artifact.wheel),
                      "manifest": artifact.manifest}, indent=1))
    return 0 if len(built.failed) < len(built.kernels) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
