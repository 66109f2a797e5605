#!/usr/bin/env bash
# Issue 37, run 7 (session of 23:44): the launcher's kept selection, shipped. Run 6 left
# the launcher's kernel check (its backend selection, a Python process importing sglang)
# as the largest term of a shipped start the builder adds (about 35 s of 101 s). One
# machine (`device.sh` PART=go5 CHAIN=chain7.sh after c1-c3 and kw, back to back):
#   1. cold-auto: ours cold, recorded (triton_watch, Inductor's folder); the launcher keeps
#      its selection in the watch folder (SGLANG_SM120_TRITON_WATCH/selection/);
#   2. the JIT cache wheel built there with the GPU hidden, twice packed: with the kept
#      selection (dist/) and without (dist-nosel/);
#   3. shipped-nosel: run 6's shipped start (the selection runs);
#   4. shipped-sel: the same with the selection shipped (the goal: it is taken, not run).
source reports/2026-12-03-h200-derived-serving/chain-lib.sh
OURS=/tmp/watch:/tmp/kset-moe:/tmp/site
{ nproc; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
  python3 -c 'import torch,sys;print(sys.version.split()[0],torch.__version__)'; } > $RES/environment.txt 2>&1
# 1
watch cold-auto; TORCHINDUCTOR_CACHE_DIR=/root/ind-cold PYTHONPATH=$OURS $S cold-auto $RES /root/m/moe -- $COMMON
stamp "cold-auto rc=$?; kept: $(ls $RES/triton/cold-auto/selection 2>&1)"
# 2
mkdir -p /root/jc /root/watch-all
for f in $RES/triton/cold-auto/*.jsonl; do cp "$f" /root/watch-all/; done
CUDA_VISIBLE_DEVICES= INDUCTOR=/root/ind-cold SELECTION=$RES/triton/cold-auto/selection PYTHONPATH=/tmp/site:$PWD \
  python3 $R/build_jit_cache.py /root/watch-all sm_90a /tmp/site /root/jc > $RES/jit-cache.json 2> $RES/logs/jit-cache.err \
  || fail "JIT cache build (logs/jit-cache.err)"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jc-site /root/jc/dist/*.whl || fail "install"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jc-nosel /root/jc/dist-nosel/*.whl || fail "install"
stamp "JIT cache built: $(python3 -c 'import json,sys;r=json.load(open(sys.argv[1]));print(r["kernels"],"kernels,",len(r["failed"]),"failed; selection",r["manifest"].get("selection"))' $RES/jit-cache.json)"
# 3
watch shipped-nosel; TORCHINDUCTOR_CACHE_DIR=/root/ind-nosel PYTHONPATH=/tmp/watch:/tmp/jc-nosel:/tmp/kset-moe:/tmp/site \
  $S shipped-nosel $RES /root/m/moe -- $COMMON
stamp "shipped-nosel rc=$?"
echo shipped > $RES/state
# 4
watch shipped-sel; TORCHINDUCTOR_CACHE_DIR=/root/ind-sel PYTHONPATH=/tmp/watch:/tmp/jc-site:/tmp/kset-moe:/tmp/site \
  $S shipped-sel $RES /root/m/moe -- $COMMON
stamp "shipped-sel rc=$?"
echo done > $RES/state
