#!/usr/bin/env bash
# Issue 37, run 5b, on a second fresh machine (started detached by `device.sh` PART=go5 CHAIN=chain5b.sh): the
# run-5 machine went back after its first start (cold-auto, results/run5a), so what is left,
# with the device time left. The MoE runner `auto` configuration of chain5.sh:
#   1. the Triton cache of run 5a's cold-auto recording, compiled here with the GPU hidden;
#   2. ours shipped: the machine's first start; the launcher restores that cache;
#   3. upstream defaults cold: upstream's wheel, FlashInfer JIT on, no kernel set, no launcher,
#      an empty Inductor cache (the one step 2 filled is moved aside);
#   4. if time is left: ours shipped again with step 2's Inductor cache (Inductor's term).
# Writes /root/res and /root/res/state (running | done | failed: STEP).
set -uo pipefail
R=reports/2026-12-03-h200-derived-serving
RES=/root/res; mkdir -p $RES/logs
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo running > $RES/state
t0=$(date +%s); stamp() { echo "$(( $(date +%s) - t0 ))s $*" | tee -a $RES/chain.log; }
fail() { stamp "FAILED: $*"; echo "failed: $*" > $RES/state; exit 1; }
aside() {  # Inductor's cache, moved aside and listed: the next start gets an empty one
  [ -d /tmp/torchinductor_root ] || return 0
  mv /tmp/torchinductor_root /tmp/ti-$1
  { echo "== $1: $(du -sb /tmp/ti-$1 | cut -f1) bytes"; find /tmp/ti-$1 -type f | sed "s|/tmp/ti-$1/||" | sort; } >> $RES/inductor-files.txt
  grep -rh -A4 "Topologically Sorted Source Nodes" /tmp/ti-$1 --include=*.py 2>/dev/null | head -150 > $RES/inductor-sources-$1.txt
}
{ nproc; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
  python3 -c 'import torch,sys;print(sys.version.split()[0],torch.__version__)'; } > $RES/environment.txt 2>&1
MOESET=$(ls /root/keep/kw/flashinfer_jit_cache-*moefp16fp16xbf16bf16*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kset-moe "$MOESET" || fail "install kernel set"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/up /root/keep/up/sglang-0.5.16-cp312-*.whl \
  || fail "install upstream sglang"
W="--set vocab_size=151936 --set num_hidden_layers=4 --set num_attention_heads=32 --set max_position_embeddings=8192"
python3 builder/smoke/script/tiny_model.py /root/m/moe $W --set hidden_size=2048 --set num_key_value_heads=4 \
  --set num_experts=128 --set num_experts_per_tok=8 --set moe_intermediate_size=768 --set intermediate_size=6144 \
  > $RES/model-moe.json || fail "moe model"
stamp "installed, model written"
mkdir -p /root/jc
CUDA_VISIBLE_DEVICES= PYTHONPATH=/tmp/site:$PWD python3 $R/build_jit_cache.py $R/results/run5a/triton/cold-auto sm_90a /tmp/site /root/jc \
  > $RES/jit-cache.json 2> $RES/logs/jit-cache.err || fail "Triton cache (logs/jit-cache.err)"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jc-site /root/jc/dist/*.whl || fail "jit cache install"
stamp "Triton cache built with the GPU hidden"
mkdir -p /tmp/watch; cp builder/kernels/data/triton_watch.py /tmp/watch/
printf 'try:\n    import triton_watch  # noqa\nexcept Exception as error:\n    import os, sys\n    print("triton_watch:", error, file=sys.stderr)\n' > /tmp/watch/sitecustomize.py
watch() { export SGLANG_SM120_TRITON_WATCH=$RES/triton/$1; }
COMMON="--attention-backend flashinfer --cuda-graph-max-bs 256 --skip-tokenizer-init"
S="python3 $R/serve_run.py"
watch shipped-auto; PYTHONPATH=/tmp/watch:/tmp/jc-site:/tmp/kset-moe:/tmp/site $S shipped-auto $RES /root/m/moe -- $COMMON
stamp "shipped-auto rc=$?"; aside shipped-auto
watch upstream-auto; PYTHONPATH=/tmp/watch:/tmp/up:/tmp/site $S upstream-auto $RES /root/m/moe --upstream -- $COMMON
stamp "upstream-auto rc=$?"; aside upstream-auto
echo upstream > $RES/state
cp -r /tmp/ti-shipped-auto /tmp/torchinductor_root
watch shipped-auto-again; PYTHONPATH=/tmp/watch:/tmp/jc-site:/tmp/kset-moe:/tmp/site $S shipped-auto-again $RES /root/m/moe -- $COMMON
stamp "shipped-auto-again rc=$?"
echo done > $RES/state
