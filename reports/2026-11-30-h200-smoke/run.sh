# Device run for issue 6 (H200, sm_90): kernel wheel for 9.0a + host-mode smoke.
set -uo pipefail
export PYTHONUNBUFFERED=1
K=/root/keep
W=$K/flashinfer_cubin-0.6.3-py3-none-any.whl
cat $K/part-aa $K/part-ab .dev/cubin/part-ac > $W
echo "64ecd1e3084c78bfc958e90132d5dffcaf9d2cb4d52bfecde4c1b040e5b024d6  $W" | sha256sum -c || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/whl/*.whl .dev/extra/*.whl $W || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv | tee $OUT/nvidia-smi.txt
python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'flashinfer', flashinfer.__version__)" | tee -a $OUT/nvidia-smi.txt
nvcc --version | tail -2 | tee -a $OUT/nvidia-smi.txt
start=$(date +%s)
python3 -m builder kernels --request .dev/req-90a.json --environment current --dist /tmp/kdist --cache-dir /tmp/kcache --json > $OUT/kernels.json 2> $OUT/kernels.log
rc=$?; echo "kernels rc=$rc in $(( $(date +%s) - start )) s"
[ $rc = 0 ] || { tail -40 $OUT/kernels.log; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/kdist/flashinfer_jit_cache-*.whl || exit 1
cp /tmp/kdist/flashinfer_jit_cache-*.whl $OUT/
start=$(date +%s)
python3 -m builder smoke --mode host --sglang-wheel .dev/whl/sglang-0.5.9+sm120.1-py3-none-any.whl --output $OUT/smoke-report.json > $OUT/smoke.log 2>&1
echo "smoke rc=$? in $(( $(date +%s) - start )) s"
cat $OUT/smoke.log
