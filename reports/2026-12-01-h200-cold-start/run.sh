# Device: install the carried wheels, then time SGLang 0.5.16's start for each case (cold_start.py),
# then one FlashInfer JIT module compiled at start. Run from the repo root after calls 1-8 filled /root/keep.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
C=.cache/i27-start; K=/root/keep; cp -r $C/c9 $K/
t=$(date +%s); [ -d /tmp/site16/sglang ] || bash $C/cs/install.sh $K /tmp/site16 > $OUT/install.log 2>&1 || { tail -20 $OUT/install.log; exit 1; }
echo "install $(( $(date +%s) - t )) s"; tail -2 $OUT/install.log
export PYTHONPATH=/tmp/site16
{ nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv; nproc; nvcc --version | tail -1
  python3 -c "
import importlib.metadata as m, torch
print('torch', torch.__version__, 'cuda', torch.version.cuda)
for d in ('sglang', 'flashinfer-python', 'flashinfer-jit-cache', 'sglang-kernel', 'transformers', 'triton'):
    print(d, m.version(d))"; } > $OUT/environment.txt 2>&1; cat $OUT/environment.txt
[ -f /root/tiny/config.json ] || python3 builder/smoke/script/tiny_model.py /root/tiny > $OUT/tiny.log 2>&1 || { cat $OUT/tiny.log; exit 1; }
timeout 470 python3 $C/cs/cold_start.py $OUT /root/tiny ${CASES:-a-cold:empty:empty b-restored:restore:empty c-restored-triton:restore:keep d-cold:empty:empty} > $OUT/results.jsonl 2> $OUT/cold_start.err
echo "cold_start rc=$?"; cat $OUT/results.jsonl; tail -5 $OUT/cold_start.err
[ -n "${SKIPJIT:-}" ] && exit 0; rm -rf /tmp/fi-ws; t=$(date +%s)
FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 timeout 100 python3 -c "
import time; from flashinfer.jit.norm import gen_norm_module
s = gen_norm_module(); t = time.monotonic(); s.build(verbose=False)
print('jit norm build s', round(time.monotonic() - t, 1), 'sources', len(s.sources))" > $OUT/jit.log 2>&1
echo "jit rc=$? in $(( $(date +%s) - t )) s"; tail -3 $OUT/jit.log
