#!/usr/bin/env bash
# Device call for part (b), from the checkout root, with .cache/numerics/moe and
# .cache/numerics/scripts carried. Installs flashinfer-python 0.6.14, the prebuilt
# flashinfer-jit-cache (sm90a fast build, sha256 6fd714c5...) and apache-tvm-ffi 0.1.11 after
# checking SHA256SUMS; FLASHINFER_DISABLE_JIT=1 makes a missing prebuilt module an error
# instead of a compile.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_DISABLE_JIT=1
C=.cache/numerics; S=$C/scripts; t0=$(date +%s)
(cd $C/moe && sha256sum -c --quiet SHA256SUMS) || { echo "sha256 check failed"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fi \
  $C/moe/*.whl || exit 1
export PYTHONPATH=/tmp/fi
echo "sha256 ok, installed in $(( $(date +%s) - t0 )) s"
{ nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
  python3 -c "import sys,torch,flashinfer,importlib.metadata as m; print(sys.version.split()[0],'torch',torch.__version__,'flashinfer',flashinfer.__version__,'jit-cache',m.version('flashinfer-jit-cache'))"
} > $OUT/moe_environment.txt 2>&1; cat $OUT/moe_environment.txt
python3 $S/moe_numerics.py --sglang-file $C/moe/flashinfer_cutlass_0.5.23.py \
  --json $OUT/moe_results.json 2>&1 | tee $OUT/moe_run.log | tail -30
echo "rc ${PIPESTATUS[0]} at $(( $(date +%s) - t0 )) s"
