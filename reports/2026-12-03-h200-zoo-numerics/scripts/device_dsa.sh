#!/usr/bin/env bash
# Device call for part (a), from the checkout root, with .cache/numerics/dsa and
# .cache/numerics/scripts carried (prepare.py made them). Unpacks the carried site (tilelang
# 0.1.12, apache-tvm-ffi 0.1.11, z3-solver 4.15.4.0, torch-c-dlpack-ext) after checking
# SHA256SUMS, runs one process per (release, kernel file[, head count]) in parallel so that
# the TileLang compiles overlap, then compares everything with the fp32 reference.
set -uo pipefail
export PYTHONUNBUFFERED=1
C=.cache/numerics; S=$C/scripts; W=/tmp/dsa_out; LIMIT=${LIMIT:-200}
t0=$(date +%s)
(cd $C/dsa && sha256sum -c --quiet SHA256SUMS) || { echo "sha256 check failed"; exit 1; }
mkdir -p /tmp/tl && tar -xJf $C/dsa/site.tar.xz -C /tmp/tl || exit 1
export PYTHONPATH=/tmp/tl/site
echo "sha256 ok, unpacked in $(( $(date +%s) - t0 )) s"
{ nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv; nproc
  nvcc --version | tail -2
  python3 -c "import sys,torch,tilelang,tvm_ffi,z3; print(sys.version.split()[0],'torch',torch.__version__,'tilelang',tilelang.__version__,'tvm_ffi',tvm_ffi.__version__,'z3',z3.get_version_string())"
} > $OUT/dsa_environment.txt 2>&1; cat $OUT/dsa_environment.txt
for rel in 0.5.20 0.5.23; do
  K=$C/dsa/kernels/$rel
  for h in 16 32 64 128; do  # upstream: one kernel (v2) per head count
    # one TileLang cache per process: concurrent writers of one cache entry could race
    TILELANG_CACHE_DIR=/tmp/tlc/${rel}_up$h timeout $LIMIT python3 $S/dsa_numerics.py run \
      --kernel $K/upstream.py --tag $rel-upstream \
      --heads $h --out $W > /tmp/log_${rel}_upstream_h$h.txt 2>&1 &
  done
  for v in patched control_rowsplit control_scale; do  # SM12x tile: one kernel, all heads
    n=$v; [ $v = patched ] && n=sm12x
    TILELANG_CACHE_DIR=/tmp/tlc/${rel}_$n timeout $LIMIT python3 $S/dsa_numerics.py run \
      --kernel $K/$v.py --tag $rel-$n --force-sm12x \
      --out $W > /tmp/log_${rel}_$n.txt 2>&1 &
  done
done
wait
echo "runs done at $(( $(date +%s) - t0 )) s"
for f in /tmp/log_*.txt; do echo "== $f"; cat $f; done > $OUT/dsa_runs.log 2>&1
grep -h -i -B2 "error\|traceback" /tmp/log_*.txt | head -40
python3 $S/dsa_numerics.py compare --dir $W --json $OUT/dsa_results.json > $OUT/dsa_compare.log 2>&1
echo "compare rc $? at $(( $(date +%s) - t0 )) s"; tail -48 $OUT/dsa_compare.log
