# Device, call 10 (after calls 1-9 copied .cache/dev516/c1..c9 into /root/keep; this call
# carries c10): install the carried wheels (checked by sha256), write the model, and start
# benchmarks/bench_serving.py detached (it outlives this call; poll.sh reads it).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=reports/2026-12-01-h200-serving; K=/root/keep; cp -r .cache/dev516/c10 $K/
t=$(date +%s)
bash $R/install.sh $K /tmp/site16 > $OUT/install.log 2>&1 || { tail -20 $OUT/install.log; exit 1; }
mkdir -p /tmp/bd && cp $K/c*/bdeps/*.whl /tmp/bd/ && (cd /tmp/bd && sha256sum -c --quiet "$OLDPWD/$R/BDEPS.sums") || { echo "bdeps sha256 failed"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/bd/*.whl || exit 1
echo "install $(( $(date +%s) - t )) s"; tail -2 $OUT/install.log
export PYTHONPATH=/tmp/site16:/tmp/site
{ nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv; nproc; nvcc --version | tail -1
  python3 -c "
import importlib.metadata as m, torch
print('torch', torch.__version__, 'cuda', torch.version.cuda)
for d in ('sglang', 'flashinfer-python', 'flashinfer-jit-cache', 'sglang-kernel', 'transformers', 'triton'):
    print(d, m.version(d))"; } > $OUT/environment.txt 2>&1; cat $OUT/environment.txt
python3 -m builder serve-command --gpu rtx-pro-6000 --tp 1 --target sglang-0.5.16 --model /root/q3 || exit 1
# Qwen3-30B-A3B's widths (hidden 2048, 128 experts, top-8, MoE intermediate 768, 32 heads, 4 KV
# heads, its vocabulary) with 4 of its 48 layers, random bf16 weights, a word-level tokenizer.
t=$(date +%s)
python3 builder/smoke/script/tiny_model.py /root/q3 --tokenizer --set vocab_size=151936 \
  --set hidden_size=2048 --set num_hidden_layers=4 --set num_attention_heads=32 \
  --set num_key_value_heads=4 --set head_dim=128 --set num_experts=128 \
  --set num_experts_per_tok=8 --set moe_intermediate_size=768 --set intermediate_size=6144 \
  --set max_position_embeddings=8192 > $OUT/model.json 2> $OUT/model.err || { cat $OUT/model.err; exit 1; }
echo "model $(( $(date +%s) - t )) s"; cat $OUT/model.json
mkdir -p /root/bench
setsid nohup python3 benchmarks/bench_serving.py --model /root/q3 --out /root/bench \
  --target sglang-0.5.16 --gpu rtx-pro-6000 --tp 1 --concurrency 1,16,256 --repeat 2 \
  --configs ${CONFIGS:-profile-no-autotune,profile,profile-restored,defaults} \
  > /root/bench.log 2>&1 < /dev/null &
echo "bench started, pid $!"
bash $R/poll.sh 420
