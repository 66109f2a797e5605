#!/usr/bin/env bash
# The whole GPU run, started detached by device.sh once every carried part is on the machine.
# Writes /root/res (results, logs) and /root/res/state (running | done | failed: STEP).
set -uo pipefail
R=reports/2026-12-03-h200-derived-serving
RES=/root/res; mkdir -p $RES/logs
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo running > $RES/state
t0=$(date +%s); stamp() { echo "$(( $(date +%s) - t0 ))s $*" | tee -a $RES/chain.log; }
fail() { stamp "FAILED: $*"; echo "failed: $*" > $RES/state; exit 1; }

{ nproc; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
  nvcc --version | tail -2; python3 -c 'import torch,sys;print(sys.version.split()[0],torch.__version__)'
  python3 -m pip list 2>/dev/null | grep -i -E '^(sglang|sglang-kernel|flashinfer|triton|transformers|torch) '
} > $RES/environment.txt 2>&1
stamp "environment written"

# 1. the dense / FP8 derived set: carried when built on the CPU machine (its version ends in
# "sm90a", no MoE label), else built here (16 cores) from request-dense.json, with FlashInfer
# put into this Python's own site-packages, where `kernels build --environment current` reads it
SMALL=$(ls /root/keep/*/flashinfer_jit_cache-0.6.14+sm120.1.cu130.sm90a-py3-*.whl 2>/dev/null | head -1)
if [ -n "$SMALL" ]; then
  mkdir -p /root/kd && cp "$SMALL" /root/kd/ && echo 0 > $RES/build.rc
  ( exit 0 ) & BUILD=$!
  stamp "small set carried: $(basename $SMALL)"
else
  PYTHONPATH= python3 -m pip install -q --no-index --no-deps /root/keep/c*/flashinfer_python-*.whl /root/keep/c*/apache_tvm_ffi-*.whl || fail "flashinfer install"
  mkdir -p /root/kd /root/kc
  ( PYTHONPATH=/tmp/site:$PWD /usr/bin/time -v python3 -m builder --cache-dir /root/kc --json kernels build \
      --request $R/request-dense.json --environment current --jobs 16 --dist /root/kd \
      > $RES/build-small.json 2> $RES/logs/build-small.err; echo $? > $RES/build.rc ) &
  BUILD=$!
  stamp "build of request-dense.json started"
fi

# 2. the models (random weights, real widths, 4 layers)
W="--set vocab_size=151936 --set num_hidden_layers=4 --set num_attention_heads=32 --set max_position_embeddings=8192"
python3 builder/smoke/script/tiny_model.py /root/m/moe $W --set hidden_size=2048 --set num_key_value_heads=4 \
  --set num_experts=128 --set num_experts_per_tok=8 --set moe_intermediate_size=768 --set intermediate_size=6144 \
  > $RES/model-moe.json || fail "moe model"
python3 builder/smoke/script/tiny_model.py /root/m/dense --dense $W --set hidden_size=4096 --set num_key_value_heads=8 \
  --set intermediate_size=12288 > $RES/model-dense.json || fail "dense model"
cmp <(python3 -c 'import json,sys;print(json.dumps(json.load(open("/root/m/moe/config.json")),sort_keys=True))') \
    <(python3 -c 'import json,sys;print(json.dumps(json.load(open(sys.argv[1])),sort_keys=True))' $R/config-moe.json) \
  || fail "the MoE config differs from the one the requests were derived for"
cmp <(python3 -c 'import json,sys;print(json.dumps(json.load(open("/root/m/dense/config.json")),sort_keys=True))') \
    <(python3 -c 'import json,sys;print(json.dumps(json.load(open(sys.argv[1])),sort_keys=True))' $R/config-dense.json) \
  || fail "the dense config differs from the one the requests were derived for"
stamp "models written"

# Triton's launch specializations and compiles in each server (issue 37's input: the
# builder's triton_watch.py, imported at start by a sitecustomize that cannot break a start)
mkdir -p /tmp/watch; cp builder/kernels/data/triton_watch.py /tmp/watch/
printf 'try:\n    import triton_watch  # noqa\nexcept Exception as error:\n    import os, sys\n    print("triton_watch:", error, file=sys.stderr)\n' > /tmp/watch/sitecustomize.py
watch() { export SGLANG_SM120_TRITON_WATCH=$RES/triton/$1; }

# 3. the servers: the refusal and the dense and FP8 MoE configurations on the small set
wait $BUILD; stamp "build rc=$(cat $RES/build.rc)"
[ "$(cat $RES/build.rc)" = 0 ] || fail "build"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kset-small /root/kd/flashinfer_jit_cache-*.whl \
  || fail "install small set"
COMMON="--attention-backend flashinfer --cuda-graph-max-bs 256 --skip-tokenizer-init"
S="python3 $R/serve_run.py"
PYTHONPATH=/tmp/kset-small:/tmp/site $S refusal-moe-bf16-on-small-set $RES /root/m/moe --expect-refusal -- \
  --moe-runner-backend flashinfer_cutlass $COMMON; stamp "refusal rc=$?"
watch dense; PYTHONPATH=/tmp/watch:/tmp/kset-small:/tmp/site $S dense $RES /root/m/dense -- $COMMON; stamp "dense rc=$?"
watch moe-fp8; PYTHONPATH=/tmp/watch:/tmp/kset-small:/tmp/site $S moe-fp8 $RES /root/m/moe -- --quantization fp8 $COMMON; stamp "moe-fp8 rc=$?"

# 4. the bf16 MoE configuration (CUTLASS fused MoE) on its own derived set, built on the CPU
# machine from request-moe-bf16.json and carried; without it, the bf16 MoE with SGLang's
# default MoE runner (Triton) on the small set
if ls /root/keep/*/flashinfer_jit_cache-*moefp16fp16xbf16bf16*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kset-moe \
    /root/keep/*/flashinfer_jit_cache-*moefp16fp16xbf16bf16*.whl || fail "install moe set"
  watch moe-bf16; PYTHONPATH=/tmp/watch:/tmp/kset-moe:/tmp/site $S moe-bf16 $RES /root/m/moe -- \
    --moe-runner-backend flashinfer_cutlass $COMMON
  stamp "moe-bf16 rc=$?"
else
  watch moe-bf16-triton; PYTHONPATH=/tmp/watch:/tmp/kset-small:/tmp/site $S moe-bf16-triton $RES /root/m/moe -- $COMMON
  stamp "moe-bf16-triton rc=$?"
fi

# 5. issue 37: the dense server's Triton launches (recorded in step 3) compiled ahead with the
# GPU hidden, under this Python (Triton's key hashes libtriton, built per Python; the CPU
# machine has only 3.11), packed as the JIT cache wheel, and restored by the launcher into
# the fresh TRITON_CACHE_DIR of a second dense start; then a third start without it (cold
# Triton, warm page cache: the like-for-like baseline).
stamp "jit cache build"
mkdir -p /root/jc
if CUDA_VISIBLE_DEVICES= PYTHONPATH=/tmp/site:$PWD python3 $R/build_jit_cache.py $RES/triton/dense sm_90a /tmp/site /root/jc \
     > $RES/jit-cache.json 2> $RES/logs/jit-cache.err; then
  stamp "jit cache built with the GPU hidden"
else
  stamp "jit cache with the GPU hidden failed (logs/jit-cache.err); again with it visible"
  rm -rf /root/jc; mkdir -p /root/jc
  PYTHONPATH=/tmp/site:$PWD python3 $R/build_jit_cache.py $RES/triton/dense sm_90a /tmp/site /root/jc \
     > $RES/jit-cache.json 2> $RES/logs/jit-cache-visible.err || { stamp "jit cache failed"; echo done > $RES/state; exit 0; }
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jc-site /root/jc/dist/*.whl \
  || { stamp "jit cache install failed"; echo done > $RES/state; exit 0; }
watch dense-shipped; PYTHONPATH=/tmp/watch:/tmp/jc-site:/tmp/kset-small:/tmp/site $S dense-shipped $RES /root/m/dense -- $COMMON
stamp "dense-shipped rc=$?"
watch dense-again; PYTHONPATH=/tmp/watch:/tmp/kset-small:/tmp/site $S dense-again $RES /root/m/dense -- $COMMON
stamp "dense-again rc=$?"
echo done > $RES/state
