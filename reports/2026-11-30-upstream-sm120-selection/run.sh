#!/bin/bash
# Behavioural check of the SM12x selection patches on the lent GPU machine (not SM120).
set -u
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" trees
{ date -u; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))'; sha256sum upstream.whl patched.whl selection.py; } > "$OUT/environment.txt" 2>&1
for w in upstream patched; do
  rm -rf trees/$w && mkdir -p trees/$w && python3 -m zipfile -e $w.whl trees/$w
  for cap in 12.0 10.0 9.0; do
    python3 selection.py --sglang-root trees/$w --capability $cap --json > "$OUT/$w-cap$cap.json" 2> "$OUT/$w-cap$cap.stderr"
    echo "$w cap $cap rc=$?"
  done
done
cat "$OUT/environment.txt"
for f in "$OUT"/*.json; do python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["results"]; print(sys.argv[1].rsplit("/",1)[1], d["real"].get("device"), d["real"].get("capability"), "moe:", r["moe"].get("resolved"), r["moe"].get("enable_flashinfer_cutlass_moe"), "dsa:", r["dsa"].get("kv_cache_dtype"), r["dsa"].get("prefill"), r["dsa"].get("decode"))' "$f"; done
