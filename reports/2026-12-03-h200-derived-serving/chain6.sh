#!/usr/bin/env bash
# Issue 37, run 6 (prepared in the session of 21:06, NOT RUN YET): the first start with
# everything shipped, on one fresh machine (`device.sh` PART=go5 CHAIN=chain6.sh, after the
# c1-c3 and kw calls, back to back: a machine goes back 30 s after a call). Run 5 showed
# that neither the page cache nor the CUDA cache is a first start's term, so one machine can
# serve as the GPU run that is captured and as the server that gets it:
#   1. cold-auto: ours cold, MoE runner auto; triton_watch records the launches and hashes,
#      Inductor's cache goes to a folder of its own;
#   2. the Triton cache of those records compiled with the GPU hidden (all 38 since the
#      fused-MoE fix) and Inductor's cache of step 1, packed into one artifact
#      (INDUCTOR=DIR build_jit_cache.py);
#   3. shipped-auto: fresh TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR, the launcher restores
#      both: the goal is 0 Triton compiles and 0 Inductor compiles;
#   4. cold-cutlass, its autotune file captured (`warm-cache capture`), then shipped-cutlass
#      with SGLANG_SM120_WARM_CACHE: the goal is 0 autotune phases profiled;
#   5. upstream defaults cold on the same machine (as run 5b), when the rest is done.
# Each run's Inductor folder is listed after it (inductor-files.txt): a file the restore did
# not write is one Inductor made at that start.
source reports/2026-12-03-h200-derived-serving/chain-lib.sh
CUT="--moe-runner-backend flashinfer_cutlass"
OURS=/tmp/watch:/tmp/kset-moe:/tmp/site
{ nproc; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
  python3 -c 'import torch,sys;print(sys.version.split()[0],torch.__version__)'; } > $RES/environment.txt 2>&1
listing() {  # NAME DIR: the Inductor folder's files after a start
  { echo "== $1: $(du -sb $2 2>/dev/null | cut -f1) bytes"; find $2 -type f 2>/dev/null | sed "s|$2/||" | sort; } >> $RES/inductor-files.txt
}

# 1
watch cold-auto; TORCHINDUCTOR_CACHE_DIR=/root/ind-cold PYTHONPATH=$OURS $S cold-auto $RES /root/m/moe -- $COMMON
stamp "cold-auto rc=$?"; listing cold-auto /root/ind-cold
# 2 (with run 3's records of the CUTLASS configuration, for step 4)
mkdir -p /root/jc /root/watch-all
for f in $RES/triton/cold-auto/*.jsonl; do cp "$f" /root/watch-all/auto-$(basename $f); done
for f in $R/results/run3/triton/moe-bf16/*.jsonl; do cp "$f" /root/watch-all/cutlass-$(basename $f); done
CUDA_VISIBLE_DEVICES= INDUCTOR=/root/ind-cold PYTHONPATH=/tmp/site:$PWD python3 $R/build_jit_cache.py \
  /root/watch-all sm_90a /tmp/site /root/jc > $RES/jit-cache.json 2> $RES/logs/jit-cache.err \
  || stamp "JIT cache build failed (logs/jit-cache.err): the shipped starts run without it"
mkdir -p /tmp/jc-site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jc-site /root/jc/dist/*.whl \
  || stamp "jit cache install failed"
stamp "JIT cache built: $(python3 -c 'import json,sys;r=json.load(open(sys.argv[1]));print(r["kernels"],"kernels,",len(r["failed"]),"failed")' $RES/jit-cache.json)"
# 3
watch shipped-auto; TORCHINDUCTOR_CACHE_DIR=/root/ind-shipped PYTHONPATH=/tmp/watch:/tmp/jc-site:/tmp/kset-moe:/tmp/site \
  $S shipped-auto $RES /root/m/moe -- $COMMON
stamp "shipped-auto rc=$?"; listing shipped-auto /root/ind-shipped
echo shipped > $RES/state
# 4
watch cold-cutlass; TORCHINDUCTOR_CACHE_DIR=/root/ind-cutlass PYTHONPATH=$OURS $S cold-cutlass $RES /root/m/moe -- $CUT $COMMON
stamp "cold-cutlass rc=$?"; listing cold-cutlass /root/ind-cutlass
TUNED=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["sglang_cache_dir"])' $RES/cold-cutlass.json)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
FI=$(PYTHONPATH=/tmp/site python3 -c 'import importlib.metadata as m;print(m.version("flashinfer-python"))')
printf '{"gpu_name": "%s", "compute_capability": "9.0", "flashinfer_version": "%s", "release": "sglang-0.5.16", "hidden": 2048, "experts": 128, "top_k": 8, "intermediate": 768, "tp": 1, "dtype": "bf16"}\n' \
  "$GPU" "$FI" > $RES/warm-key.json
PYTHONPATH=/tmp/site:$PWD python3 -m builder --json warm-cache capture --sglang-cache-dir "$TUNED" \
  --key $RES/warm-key.json --output $RES/warm-cache.json > $RES/warm-capture.json 2> $RES/logs/warm-capture.err \
  || stamp "autotune capture failed (logs/warm-capture.err)"
watch shipped-cutlass; TORCHINDUCTOR_CACHE_DIR=/root/ind-cutlass-shipped SGLANG_SM120_WARM_CACHE=$RES/warm-cache.json \
  PYTHONPATH=/tmp/watch:/tmp/jc-site:/tmp/kset-moe:/tmp/site $S shipped-cutlass $RES /root/m/moe -- $CUT $COMMON
stamp "shipped-cutlass rc=$?"; listing shipped-cutlass /root/ind-cutlass-shipped
# 5
echo upstream > $RES/state
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/up /root/keep/up/sglang-0.5.16-cp312-*.whl \
  || fail "install upstream sglang"
watch upstream-auto; TORCHINDUCTOR_CACHE_DIR=/root/ind-upstream PYTHONPATH=/tmp/watch:/tmp/up:/tmp/site \
  $S upstream-auto $RES /root/m/moe --upstream -- $COMMON
stamp "upstream-auto rc=$?"; listing upstream-auto /root/ind-upstream
echo done > $RES/state
