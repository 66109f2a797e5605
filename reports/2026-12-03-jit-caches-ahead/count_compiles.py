"""Count what one server start compiled and tuned (issue 37's GPU proof). NOT RUN YET.

    python3 count_compiles.py WATCH_DIR SGLANG_CACHE_DIR SERVER_LOG

WATCH_DIR: the folder SGLANG_SM120_TRITON_WATCH named for that start (builder/kernels/data/
triton_watch.py, imported by a sitecustomize.py on the server's PYTHONPATH: `import
triton_watch`). Prints one JSON object: Triton compiles (cache_hit false) and hits, with the
compile time; the specializations seen (the input of build_triton_cache); TileLang kernel
entries in SGLANG_CACHE_DIR/tilelang (a start with a shipped cache should add none: compare
with the count before the start); CuTe DSL file-cache entries under /tmp; FlashInfer JIT
builds and autotune 'Tuning' lines in the server log.
"""

import glob
import json
import os
import re
import sys

watch, cache, log = sys.argv[1:4]
compiles, hits, specs, us = [], 0, set(), 0
for path in glob.glob(os.path.join(watch, "*.jsonl")):
    for line in open(path, encoding="utf-8"):
        record = json.loads(line)
        if "spec" in record:
            specs.add(record["spec"])
        elif record["cache_hit"]:
            hits += 1
        else:
            compiles.append(record["compile"])
            us += record["us"]
text = open(log, encoding="utf-8", errors="replace").read()
print(json.dumps({
    "triton_compiles": len(compiles), "triton_compile_s": round(us / 1e6, 1),
    "triton_hits": hits, "triton_kernels_compiled": sorted(set(compiles)),
    "triton_specs_seen": len(specs),
    "tilelang_entries": len(glob.glob(os.path.join(cache, "tilelang", "*", "*", "kernels", "*"))),
    "cute_dsl_cache_files": len(glob.glob("/tmp/cute_dsl_python_cache_*/**", recursive=True)),
    "flashinfer_jit_lines": len(re.findall(r"Loading JIT ops|ninja|Building .*\.so", text)),
    "autotune_tuning_lines": len(re.findall(r"\bTuning\b", text)),
}, sort_keys=True))
with open(os.path.join(watch, "specs.json"), "w", encoding="utf-8") as out:
    json.dump(sorted(specs), out)  # carry back: build_triton_cache(env, specs, "sm_90a", dest)
