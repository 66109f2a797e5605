# Device: the smoke test with check 7 (parallel) on one H200, from the wheels setup.sh
# installed; then SGLang's benchmark's missing packages (EXTRA.sums) and the benchmark,
# detached. Issue 28's TP 1 run: TP 2 legs are not run on one GPU, so the report fails.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=reports/2026-12-01-h200-serving; K=/root/keep
export PYTHONPATH=/tmp/site16:/tmp/site
SW=$(ls $K/c*/sglang-0.5.16+sm120.2-cp312-*.whl | head -1); sha256sum "$SW"
t=$(date +%s)
timeout 400 python3 -m builder smoke --mode host --moe --tiny-model --parallel --sglang-wheel "$SW" \
  --server-arg=--attention-backend=triton --server-arg=--disable-cuda-graph \
  --timeout 300 --server-timeout 300 --output $OUT/smoke-report.json > $OUT/smoke.txt 2>&1
echo "smoke rc=$? in $(( $(date +%s) - t )) s"; tail -25 $OUT/smoke.txt
cp -r .cache/dev516/c11 $K/ && (cd $K/c11 && sha256sum -c --quiet "$OLDPWD/$R/EXTRA.sums") || { echo "extra sha256 failed"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $K/c11/*.whl || exit 1
python3 -c "import sglang.benchmark.serving" 2>&1 | tail -3 || exit 1
rm -rf /root/bench && mkdir -p /root/bench
setsid nohup python3 benchmarks/bench_serving.py --model /root/q3 --out /root/bench \
  --target sglang-0.5.16 --gpu rtx-pro-6000 --tp 1 --concurrency 1,16,256 --repeat 2 \
  --configs ${CONFIGS:-profile-no-autotune,profile,profile-restored,defaults} \
  > /root/bench.log 2>&1 < /dev/null &
echo "bench started"; sleep 20; tail -5 /root/bench.log
