#!/usr/bin/env bash
# Detached by device.sh, in this order: (a) the NVFP4 MoE serving set for sglang-0.5.23 at
# 12.0f, pruned, cold; (c) a pruned sm_90a fused MoE module of 0.5.16's FlashInfer 0.6.14
# (bf16 x bf16 kept), loaded and called on the H200 (call.py); (b) the default set for 0.5.23,
# cold.
set -uo pipefail
C=$1; R=$2; REPO=$3; H=$REPO/reports/2026-12-03-h200-kernel-prune
P=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
step() { echo "$*" > $R/progress; echo "== $(date -u +%T) $*"; }
step install
tar xJf $C/fi072.tar.xz -C $P || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir $C/whl/*.whl || exit 1
mkdir -p $P/nvidia/cu13/include && tar xJf $C/cuda-headers.tar.xz -C $P/nvidia/cu13/include
{ nproc; free -g | head -2; nvcc --version | tail -2; echo "CC=${CC:-} CXX=${CXX:-}"; command -v nm
  nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
  python3 -c "import sys, torch, flashinfer.version as v; print(sys.version.split()[0], 'torch', torch.__version__, 'flashinfer', v.__version__)" 2>&1 | tail -1
} > $R/machine.txt 2>&1
build() {  # name request: cold (fresh cache and dist), timed, with /proc/stat around it
  local n=$1; step "build $n"
  head -1 /proc/stat > $R/$n.stat0; local t0=$(date +%s.%N)
  (cd $REPO && PYTHONPATH=$REPO python3 -m builder kernels build --request $C/req/$2 \
     --environment current --jobs 16 --dist /tmp/kd-$n --cache-dir /tmp/kc-$n --json \
     > $R/$n.json 2> $R/$n.err)
  local rc=$?; local t1=$(date +%s.%N); head -1 /proc/stat > $R/$n.stat1
  echo "{\"rc\": $rc, \"seconds\": $(python3 -c "print(round($t1-$t0,1))")}" > $R/$n.time
  cp /tmp/kc-$n/kernel-costs/*.json $R/costs-$n.json 2>/dev/null
  cp /tmp/kc-$n/logs/*.log $R/$n-kept.log 2>/dev/null
  return $rc
}
nm_of() {  # the fused MoE library's undefined TensorRT-LLM symbols
  mkdir -p $R/so-$1 && (cd $R/so-$1 && python3 -m zipfile -e /tmp/kd-$1/flashinfer_jit_cache_sm120f-*.whl . )
  f=$(find $R/so-$1 -name fused_moe_120.so | head -1)
  nm -D -C --undefined-only "$f" | grep "tensorrt_llm::" > $R/nm-$1.txt
}
# ONLY="b" (or "a c", ...): run those builds alone (a later session's missing figure);
# SKIP_B=1 leaves (b) out.
want() { case " ${ONLY:-a c b} " in *" $1 "*) return 0;; *) return 1;; esac; }
if want a; then
  build a a-nvfp4-pruned.json
  step "nm a"; nm_of a
fi
if want c; then
  step "switch to FlashInfer 0.6.14"
  rm -rf $P/flashinfer $P/flashinfer_python-0.7.2.dist-info
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir $C/fi0614/*.whl || exit 1
  build c c-sm90-bf16-pruned.json
  step "call c"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir /tmp/kd-c/*.whl
  f=$(python3 -c "import flashinfer_jit_cache as j, os; print(os.path.join(j.get_jit_cache_dir(), 'fused_moe_90', 'fused_moe_90.so'))")
  nm -D -C --undefined-only "$f" | grep "tensorrt_llm::" > $R/nm-c.txt
  FLASHINFER_DISABLE_JIT=1 python3 $H/call.py --json $R/call-c.json --so "$f" > $R/call-c.log 2>&1
  step "switch back to FlashInfer 0.7.2"
  python3 -m pip uninstall -q -y flashinfer-python flashinfer-jit-cache
  tar xJf $C/fi072.tar.xz -C $P || exit 1
fi
# (b) last: the default set is the comparison figure, (c) the proof that a pruned module is
# loaded and called; a call that runs out of device time loses (b) only.
if want b && [ -z "${SKIP_B:-}" ]; then
  build b b-default.json
  step "nm b"; nm_of b
fi
step "summary"
python3 $H/summarize.py $R > $R/results.json 2> $R/summarize.err
touch $R/done
