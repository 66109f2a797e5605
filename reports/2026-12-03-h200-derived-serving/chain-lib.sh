# Sourced by a device chain (from chain6.sh on; the earlier chains carry this inline, as
# they ran): the environment, the state file, `stamp`, `fail`, the MoE kernel set and model
# (Qwen3-30B-A3B's widths, 4 layers, random weights), Triton's watch and `watch NAME`.
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
S="python3 $R/serve_run.py"
