# Device run for issue 17 (nvidia-h200-x2 as a build machine): the default SM120 kernel set,
# unsharded, --jobs 32, step costs recorded. Detached; each call polls and copies results.
set -uo pipefail
export PYTHONUNBUFFERED=1
D=$PWD/.dev-scale; R=/root/scale; mkdir -p $R
if [ ! -f $R/started ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $D/whl/*.whl || exit 1
  touch $R/started
  { nproc; free -g | head -2; nvcc --version | tail -2; PYTHONPATH=/tmp/site python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'flashinfer', flashinfer.__version__)"; } > $R/machine.txt 2>&1
  setsid nohup bash -c "cd $D; head -1 /proc/stat > $R/stat0; date +%s > $R/t0; PYTHONPATH=$D:/tmp/site python3 -m builder kernels --request $D/request-sm120.json --environment current --jobs 32 --dist /tmp/kdist --cache-dir /tmp/kcache --json > $R/kernels.json 2> $R/kernels.log; echo \$? > $R/rc; date +%s > $R/t1; head -1 /proc/stat > $R/stat1" > /dev/null 2>&1 < /dev/null &
fi
end=$(( $(date +%s) + ${WAIT:-540} ))
while [ ! -f $R/rc ] && [ $(date +%s) -lt $end ]; do sleep 5; done
cp $R/kernels.json $OUT/ 2>/dev/null
cp /tmp/kcache/kernel-costs/*.json $OUT/step-costs.json 2>/dev/null
gzip -c $R/kernels.log > $OUT/kernels.log.gz
tar czf $OUT/small.tgz -C $R machine.txt $(cd $R && ls stat0 stat1 t0 t1 rc 2>/dev/null)
echo "rc=$(cat $R/rc 2>/dev/null || echo running) elapsed=$(( $(date +%s) - $(cat $R/t0) ))"
tail -5 $R/kernels.log
