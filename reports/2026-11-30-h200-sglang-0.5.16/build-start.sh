# Device call 1: install the build's Python packages, start the fast kernel build detached.
set -uo pipefail
export PYTHONUNBUFFERED=1
K=/root/keep; mkdir -p $K
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev13/whl/*.whl .dev13/bdeps/*.whl || exit 1
cp -r .dev13 $K/dev13
nproc; free -g | head -2; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv
nvcc --version | tail -2
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.device_count())"
date +%s > $K/t0
PYTHONPATH=/tmp/site setsid nohup bash -c "python3 -m builder kernels --request .dev13/req-90a-fast.json --environment current --dist $K/kdist --cache-dir $K/kcache --jobs 32 --json > $K/kernels.json 2> $K/kernels.log; echo \$? > $K/rc; date +%s > $K/t1" > /dev/null 2>&1 &
sleep 45; tail -5 $K/kernels.log
