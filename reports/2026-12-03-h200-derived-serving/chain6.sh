#!/usr/bin/env bash
# Issue 37, run 6 (prepared in the session of 21:06, NOT RUN YET): the first start with
# everything shipped, on one fresh machine (`device.sh` PART=go5 CHAIN=chain6.sh, after the
# c1-c3 and kw calls, back to back: a machine goes back 30 s after a call). Run 5 showed
# that neither the page cache nor the CUDA cache is a first start's term, so one machine can
# serve as the GPU run that is captured and as the server that gets it:
#   1. cold-auto: ours cold, MoE runner auto; triton_watch records the launches and hashes,
#      Inductor's cache goes to a folder of its own;
#   2. the Triton cache of those records compiled with the GPU hidden (all 38 since the
#      fused-MoE fix) and Inductor's cache of step 1, packed into one artifact
#      (INDUCTOR=DIR build_jit_cache.py);
#   3. shipped-auto: fresh TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR, the launcher restores
#      both: the goal is 0 Triton compiles and 0 Inductor compiles;
#   4. cold-cutlass, its autotune file captured (`warm-cache capture`), then shipped-cutlass
#      with SGLANG_SM120_WARM_CACHE: the goal is 0 autotune phases profiled.
set -uo pipefail
R=reports/2026-12-03-h200-derived-serving
RES=/root/res; mkdir -p $RES/logs
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo running > $RES/state
t0=$(date +%s); stamp() { echo "$(( $(date +%s) - t0 ))s $*" | tee -a $RES/chain.log; }
fail() { stamp "FAILED: $*"; echo "failed: $*" > $RES/state; exit 1; }
MOESET=$(ls /root/keep/kw/flashinfer_jit_cache-*moefp16fp16xbf16bf16*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kset-moe "$MOESET" || fail "install kernel set"
W="--set vocab_size=151936 --set num_hidden_layers=4 --set num_attention_heads=32 --set max_position_embeddings=8192"
python3 builder/smoke/script/tiny_model.py /root/m/moe $W --set hidden_size=2048 --set num_key_value_heads=4 \
  --set num_experts=128 --set num_experts_per_tok=8 --set moe_intermediate_size=768 --set intermediate_size=6144 \
  > $RES/model-moe.json || fail "moe model"
stamp "installed, model written"
mkdir -p /tmp/watch; cp builder/kernels/data/triton_watch.py /tmp/watch/
printf 'try:\n    import triton_watch  # noqa\nexcept Exception as error:\n    import os, sys\n    print("triton_watch:", error, file=sys.stderr)\n' > /tmp/watch/sitecustomize.py
watch() { export SGLANG_SM120_TRITON_WATCH=$RES/triton/$1; }
COMMON="--attention-backend flashinfer --cuda-graph-max-bs 256 --skip-tokenizer-init"
CUT="--moe-runner-backend flashinfer_cutlass"
S="python3 $R/serve_run.py"
OURS=/tmp/watch:/tmp/kset-moe:/tmp/site

# 1
watch cold-auto; TORCHINDUCTOR_CACHE_DIR=/root/ind-cold PYTHONPATH=$OURS $S cold-auto $RES /root/m/moe -- $COMMON
stamp "cold-auto rc=$?"
# 2 (with run 3's records of the CUTLASS configuration, for step 4)
mkdir -p /root/jc /root/watch-all
for f in $RES/triton/cold-auto/*.jsonl; do cp "$f" /root/watch-all/auto-$(basename $f); done
for f in $R/results/run3/triton/moe-bf16/*.jsonl; do cp "$f" /root/watch-all/cutlass-$(basename $f); done
CUDA_VISIBLE_DEVICES= INDUCTOR=/root/ind-cold PYTHONPATH=/tmp/site:$PWD python3 $R/build_jit_cache.py \
  /root/watch-all sm_90a /tmp/site /root/jc > $RES/jit-cache.json 2> $RES/logs/jit-cache.err \
  || fail "JIT cache (logs/jit-cache.err)"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jc-site /root/jc/dist/*.whl || fail "jit cache install"
stamp "JIT cache built: $(python3 -c 'import json,sys;r=json.load(open(sys.argv[1]));print(r["kernels"],"kernels,",len(r["failed"]),"failed")' $RES/jit-cache.json)"
# 3
watch shipped-auto; TORCHINDUCTOR_CACHE_DIR=/root/ind-shipped PYTHONPATH=/tmp/watch:/tmp/jc-site:/tmp/kset-moe:/tmp/site \
  $S shipped-auto $RES /root/m/moe -- $COMMON
stamp "shipped-auto rc=$?"
echo shipped > $RES/state
# 4
watch cold-cutlass; TORCHINDUCTOR_CACHE_DIR=/root/ind-cutlass PYTHONPATH=$OURS $S cold-cutlass $RES /root/m/moe -- $CUT $COMMON
stamp "cold-cutlass rc=$?"
TUNED=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["sglang_cache_dir"])' $RES/cold-cutlass.json)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
FI=$(PYTHONPATH=/tmp/site python3 -c 'import importlib.metadata as m;print(m.version("flashinfer-python"))')
printf '{"gpu_name": "%s", "compute_capability": "9.0", "flashinfer_version": "%s", "release": "sglang-0.5.16", "hidden": 2048, "experts": 128, "top_k": 8, "intermediate": 768, "tp": 1, "dtype": "bf16"}\n' \
  "$GPU" "$FI" > $RES/warm-key.json
PYTHONPATH=/tmp/site:$PWD python3 -m builder --json warm-cache capture --sglang-cache-dir "$TUNED" \
  --key $RES/warm-key.json --output $RES/warm-cache.json > $RES/warm-capture.json 2> $RES/logs/warm-capture.err \
  || stamp "autotune capture failed (logs/warm-capture.err)"
watch shipped-cutlass; TORCHINDUCTOR_CACHE_DIR=/root/ind-cutlass-shipped SGLANG_SM120_WARM_CACHE=$RES/warm-cache.json \
  PYTHONPATH=/tmp/watch:/tmp/jc-site:/tmp/kset-moe:/tmp/site $S shipped-cutlass $RES /root/m/moe -- $CUT $COMMON
stamp "shipped-cutlass rc=$?"
echo done > $RES/state
