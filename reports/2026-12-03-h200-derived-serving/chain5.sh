#!/usr/bin/env bash
# Issue 37, run 5 (first machine; it went back mid-chain, after its first start: results/run5a).
# Run 5b is chain5b.sh. On a fresh machine (started detached by `device.sh` PART=go5): the bf16
# MoE at Qwen3-30B-A3B's widths (4 layers), in two configurations: MoE runner `auto`
# (SGLang's Triton fused MoE, SM120's default for bf16) and `flashinfer_cutlass` (tuned by
# FlashInfer's autotuner at start). Attention is `flashinfer`, SM120's default for this model
# (on Hopper the default would be FA3). In order:
#   0. every shared library the servers can load read once, timed (the page cache: the
#      suspect for a fresh machine's slow first graph capture, runs 3-4);
#   1. ours cold, both configurations: our wheel and kernel set, JIT off, nothing else shipped;
#      Triton's launches recorded (triton_watch), the cutlass start's autotune file kept;
#   2. what is shipped, built here: the autotune file captured by `warm-cache capture`; the
#      Triton cache of both recordings compiled with the GPU hidden (build_jit_cache.py);
#   3. ours shipped, both configurations: the launcher restores the Triton cache and (cutlass)
#      the autotune file into the start's fresh TRITON_CACHE_DIR and SGLANG_CACHE_DIR;
#   4. upstream defaults cold, MoE runner `auto`: upstream's own sglang 0.5.16 wheel, FlashInfer
#      JIT on (its default), no kernel set, no launcher.
# Writes /root/res (results, logs) and /root/res/state (running | shipped | done | failed: STEP).
set -uo pipefail
R=reports/2026-12-03-h200-derived-serving
RES=/root/res; mkdir -p $RES/logs
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo running > $RES/state
t0=$(date +%s); stamp() { echo "$(( $(date +%s) - t0 ))s $*" | tee -a $RES/chain.log; }
fail() { stamp "FAILED: $*"; echo "failed: $*" > $RES/state; exit 1; }
caches() {  # the per-machine caches a start may fill: CUDA's PTX cache, Inductor's, Triton's default
  echo "$1: $(du -sb ${CUDA_CACHE_PATH:-$HOME/.nv/ComputeCache} /tmp/torchinductor_$(whoami) $HOME/.triton 2>&1 | tr '\n' ' ')" >> $RES/caches.txt
}

{ nproc; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
  nvcc --version | tail -2; python3 -c 'import torch,sys;print(sys.version.split()[0],torch.__version__)'
  env | grep -E '^CUDA_(MODULE_LOADING|CACHE)' ; free -g | head -2
} > $RES/environment.txt 2>&1
MOESET=$(ls /root/keep/kw/flashinfer_jit_cache-*moefp16fp16xbf16bf16*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kset-moe "$MOESET" || fail "install kernel set"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/up /root/keep/up/sglang-0.5.16-cp312-*.whl \
  || fail "install upstream sglang"
W="--set vocab_size=151936 --set num_hidden_layers=4 --set num_attention_heads=32 --set max_position_embeddings=8192"
python3 builder/smoke/script/tiny_model.py /root/m/moe $W --set hidden_size=2048 --set num_key_value_heads=4 \
  --set num_experts=128 --set num_experts_per_tok=8 --set moe_intermediate_size=768 --set intermediate_size=6144 \
  > $RES/model-moe.json || fail "moe model"
cmp <(python3 -c 'import json,sys;print(json.dumps(json.load(open("/root/m/moe/config.json")),sort_keys=True))') \
    <(python3 -c 'import json,sys;print(json.dumps(json.load(open(sys.argv[1])),sort_keys=True))' $R/config-moe.json) \
  || fail "the MoE config differs from the one the requests were derived for"
stamp "installed, model written"

# 0. the page cache
caches "before any start"
SITE=$(python3 -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
grep -E '^(Cached|MemFree)' /proc/meminfo > $RES/preread.txt
s0=$(date +%s.%N)
find "$SITE" /tmp/site /tmp/kset-moe /tmp/up -type f -name '*.so*' -print0 > /tmp/libs.list
xargs -0 cat < /tmp/libs.list > /dev/null
s1=$(date +%s.%N)
python3 - "$s0" "$s1" >> $RES/preread.txt <<'PY'
import os, sys
paths = open("/tmp/libs.list", "rb").read().split(b"\0")[:-1]
print({"files": len(paths), "bytes": sum(os.path.getsize(p) for p in paths),
       "seconds": round(float(sys.argv[2]) - float(sys.argv[1]), 1)})
PY
grep -E '^(Cached|MemFree)' /proc/meminfo >> $RES/preread.txt
stamp "libraries read once: $(tail -3 $RES/preread.txt | head -1)"

mkdir -p /tmp/watch; cp builder/kernels/data/triton_watch.py /tmp/watch/
printf 'try:\n    import triton_watch  # noqa\nexcept Exception as error:\n    import os, sys\n    print("triton_watch:", error, file=sys.stderr)\n' > /tmp/watch/sitecustomize.py
watch() { export SGLANG_SM120_TRITON_WATCH=$RES/triton/$1; }
COMMON="--attention-backend flashinfer --cuda-graph-max-bs 256 --skip-tokenizer-init"
CUT="--moe-runner-backend flashinfer_cutlass"
S="python3 $R/serve_run.py"
OURS=/tmp/watch:/tmp/kset-moe:/tmp/site

# 1. ours cold
watch cold-auto; PYTHONPATH=$OURS $S cold-auto $RES /root/m/moe -- $COMMON; stamp "cold-auto rc=$?"
caches "after the first start"
watch cold-cutlass; PYTHONPATH=$OURS $S cold-cutlass $RES /root/m/moe -- $CUT $COMMON; stamp "cold-cutlass rc=$?"
caches "after the second start"

# 2. what is shipped
TUNED=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["sglang_cache_dir"])' $RES/cold-cutlass.json)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
FI=$(PYTHONPATH=/tmp/site python3 -c 'import importlib.metadata as m;print(m.version("flashinfer-python"))')
printf '{"gpu_name": "%s", "compute_capability": "9.0", "flashinfer_version": "%s", "release": "sglang-0.5.16", "hidden": 2048, "experts": 128, "top_k": 8, "intermediate": 768, "tp": 1, "dtype": "bf16"}\n' \
  "$GPU" "$FI" > $RES/warm-key.json
PYTHONPATH=/tmp/site:$PWD python3 -m builder --json warm-cache capture --sglang-cache-dir "$TUNED" \
  --key $RES/warm-key.json --output $RES/warm-cache.json > $RES/warm-capture.json 2> $RES/logs/warm-capture.err \
  && stamp "autotune captured: $(cat $RES/warm-capture.json | tr -d '\n' | cut -c1-300)" \
  || stamp "autotune capture failed (logs/warm-capture.err)"
mkdir -p /root/watch-all /root/jc
for d in cold-auto cold-cutlass; do for f in $RES/triton/$d/*.jsonl; do cp "$f" /root/watch-all/$d-$(basename $f); done; done
if CUDA_VISIBLE_DEVICES= PYTHONPATH=/tmp/site:$PWD python3 $R/build_jit_cache.py /root/watch-all sm_90a /tmp/site /root/jc \
     > $RES/jit-cache.json 2> $RES/logs/jit-cache.err; then
  stamp "Triton cache built with the GPU hidden"
else
  stamp "Triton cache build failed (logs/jit-cache.err)"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jc-site /root/jc/dist/*.whl || stamp "jit cache install failed"

# 3. ours shipped
watch shipped-auto; PYTHONPATH=/tmp/watch:/tmp/jc-site:/tmp/kset-moe:/tmp/site $S shipped-auto $RES /root/m/moe -- $COMMON
stamp "shipped-auto rc=$?"
watch shipped-cutlass; SGLANG_SM120_WARM_CACHE=$RES/warm-cache.json PYTHONPATH=/tmp/watch:/tmp/jc-site:/tmp/kset-moe:/tmp/site \
  $S shipped-cutlass $RES /root/m/moe -- $CUT $COMMON
stamp "shipped-cutlass rc=$?"
caches "after the shipped starts"
echo shipped > $RES/state

# 4. upstream defaults cold (FlashInfer JIT on; its workspace and Triton's cache fresh)
watch upstream-auto; PYTHONPATH=/tmp/watch:/tmp/up:/tmp/site $S upstream-auto $RES /root/m/moe --upstream -- $COMMON
stamp "upstream-auto rc=$?"
caches "at the end"
echo done > $RES/state
