# Device: checks 1-6 with SGLang 0.5.16 (our cp312 wheel), FlashInfer 0.6.14 and our 9.0a
# fast-build kernel wheel, on an H200. Run after the carry calls filled /root/keep.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
K=/root/keep
start=$(date +%s)
bash $K/dev16/install.sh $K /tmp/site16 > $OUT/install.log 2>&1 || { tail -20 $OUT/install.log; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $K/bdeps/*.whl || exit 1
W="$K/kdist/flashinfer_jit_cache-0.6.14+sm120.1.cu130.sm90a.fastbuild-py3-none-manylinux_2_28_x86_64.whl"
echo "b62dc07552c014a5b448d73edd9cb94557d0e9ddf15b0c825219f1a10f351f2d  $W" | sha256sum -c || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site16 "$W" || exit 1
export PYTHONPATH=/tmp/site16:/tmp/site
echo "installed in $(( $(date +%s) - start )) s"
{ nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv; nproc
  nvcc --version | tail -2
  python3 -c "
import importlib.metadata as m, torch
print('torch', torch.__version__, 'cuda', torch.version.cuda)
for d in ('sglang', 'flashinfer-python', 'flashinfer-jit-cache', 'sglang-kernel', 'transformers', 'apache-tvm-ffi', 'triton'):
    print(d, m.version(d))"; } > $OUT/environment.txt 2>&1
cat $OUT/environment.txt
python3 -c "import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler, sglang.srt.models.qwen3_moe, sglang.srt.layers.moe.moe_runner.flashinfer_cutlass" > $OUT/imports.log 2>&1 || { tail -40 $OUT/imports.log; exit 1; }
echo "imports ok at $(( $(date +%s) - start )) s"
SW=$(ls $K/c*/sglang-0.5.16+sm120.1-cp312-*.whl | head -1); sha256sum "$SW"
t=$(date +%s)
timeout 480 python3 -m builder smoke --mode host --moe --tiny-model --sglang-wheel "$SW" \
  --server-arg=--attention-backend=triton --server-arg=--disable-cuda-graph \
  --timeout 300 --server-timeout 400 --output $OUT/smoke-report.json > $OUT/smoke.txt 2>&1
echo "smoke rc=$? in $(( $(date +%s) - t )) s (total $(( $(date +%s) - start )) s)"
tail -60 $OUT/smoke.txt
f=$(find / -path /proc -prune -o -path '*flashinfer/autotune*' -name 'rank_tp0_pp0_dp0*.json' -print 2>/dev/null | head -1)
[ -n "$f" ] && { echo "autotune cache: $f"; cp "$f" $OUT/sglang-autotune-cache.json; head -c 600 "$f"; }
