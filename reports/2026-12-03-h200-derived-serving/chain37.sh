#!/usr/bin/env bash
# Issue 37 on a fresh machine (run 4), started detached by `device.sh` PART=go37: the dense
# server's Triton launches recorded in run 3 (results/run3/triton/dense) compiled ahead with
# the GPU hidden under this Python, packed as the JIT cache wheel, restored by the launcher
# into the fresh TRITON_CACHE_DIR of the machine's first dense start (like run 3's first
# dense start, which compiled them); then, if time is left, a start without it.
set -uo pipefail
R=reports/2026-12-03-h200-derived-serving
RES=/root/res; mkdir -p $RES/logs
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo running > $RES/state
t0=$(date +%s); stamp() { echo "$(( $(date +%s) - t0 ))s $*" | tee -a $RES/chain.log; }
fail() { stamp "FAILED: $*"; echo "failed: $*" > $RES/state; exit 1; }
SMALL=$(ls /root/keep/*/flashinfer_jit_cache-0.6.14+sm120.1.cu130.sm90a-py3-*.whl | head -1)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kset-small "$SMALL" || fail "install small set"
W="--set vocab_size=151936 --set num_hidden_layers=4 --set num_attention_heads=32 --set max_position_embeddings=8192"
python3 builder/smoke/script/tiny_model.py /root/m/dense --dense $W --set hidden_size=4096 --set num_key_value_heads=8 \
  --set intermediate_size=12288 > $RES/model-dense.json || fail "dense model"
stamp "model written"
mkdir -p /root/jc
if CUDA_VISIBLE_DEVICES= PYTHONPATH=/tmp/site:$PWD python3 $R/build_jit_cache.py $R/results/run3/triton/dense sm_90a /tmp/site /root/jc \
     > $RES/jit-cache.json 2> $RES/logs/jit-cache.err; then
  stamp "jit cache built with the GPU hidden"
else
  fail "jit cache (logs/jit-cache.err)"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jc-site /root/jc/dist/*.whl || fail "jit cache install"
mkdir -p /tmp/watch; cp builder/kernels/data/triton_watch.py /tmp/watch/
printf 'try:\n    import triton_watch  # noqa\nexcept Exception as error:\n    import os, sys\n    print("triton_watch:", error, file=sys.stderr)\n' > /tmp/watch/sitecustomize.py
COMMON="--attention-backend flashinfer --cuda-graph-max-bs 256 --skip-tokenizer-init"
S="python3 $R/serve_run.py"
export SGLANG_SM120_TRITON_WATCH=$RES/triton/dense-shipped
PYTHONPATH=/tmp/watch:/tmp/jc-site:/tmp/kset-small:/tmp/site $S dense-shipped $RES /root/m/dense -- $COMMON
stamp "dense-shipped rc=$?"
echo shipped > $RES/state
export SGLANG_SM120_TRITON_WATCH=$RES/triton/dense-again
PYTHONPATH=/tmp/watch:/tmp/kset-small:/tmp/site $S dense-again $RES /root/m/dense -- $COMMON
stamp "dense-again rc=$?"
echo done > $RES/state
