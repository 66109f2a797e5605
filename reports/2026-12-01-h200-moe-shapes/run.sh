# Device: issue 27 part 1 on a lent H200, from the repo root, with the four wheels of
# SHA256SUMS carried in .gpu/ (the kernel wheel is /work/shared/prebuilt's, never rebuilt).
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_DISABLE_JIT=1
R=reports/2026-12-01-h200-moe-shapes
start=$(date +%s)
(cd .gpu && sha256sum -c ../$R/SHA256SUMS) || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/*.whl || exit 1
export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm --format=csv; nproc
  python3 -c "
import importlib.metadata as m, torch
print('torch', torch.__version__, 'cuda', torch.version.cuda)
for d in ('flashinfer-python', 'flashinfer-jit-cache', 'apache-tvm-ffi'):
    print(d, m.version(d))"; } > $OUT/environment.txt 2>&1
cat $OUT/environment.txt
echo "installed in $(( $(date +%s) - start )) s"
# Three fresh processes: (1) no cache file; (2) a new cache file, tuned and written;
# (3) the same file restored: its configs are read, nothing is profiled.
C=/tmp/autotune-cache.json; rm -f $C
for i in 1 2 3; do
  extra=""; [ $i -gt 1 ] && extra="--autotune-cache $C"
  t=$(date +%s.%N)
  timeout 170 python3 benchmarks/bench_moe_shapes.py --iterations 100 --warmup 10 \
    --deadline-s 140 $extra --output $OUT/moe-shapes-$i.jsonl >> $OUT/bench.log 2>&1
  echo "pass $i rc=$? wall $(python3 -c "import time; print(round(time.time() - $t, 1))") s"
done
cp $C $OUT/autotune-cache.json
echo "total $(( $(date +%s) - start )) s"
grep -v '^{' $OUT/bench.log | grep -v 'profiling\|No tuned config\|Tuning trtllm' | tail -15
python3 - <<'PY'
import json, os
for i in (1, 2, 3):
  print("== pass", i)
  for line in open(os.environ["OUT"] + "/moe-shapes-" + str(i) + ".jsonl"):
    r = json.loads(line)
    if r["kind"] == "timing":
        print(r["name"], r["dtype"], r["tokens"], round(r["default"]["median_ms"], 4),
              round(r["tuned"]["median_ms"], 4), round(r["default_over_tuned"], 2))
    elif r["kind"] != "environment":
        print(r["kind"], r.get("shape"), r.get("dtype"), r.get("seconds"),
              r.get("tactics_profiled"), r.get("tactics_skipped"), r.get("profiles"), r.get("error", "")[:300])
PY
