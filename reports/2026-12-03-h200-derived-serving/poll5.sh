#!/usr/bin/env bash
# Run 5's poll (device, repo root): waits up to WAIT s for chain5.sh and copies its results to
# $OUT. Found in run 5's first start: Inductor's cache (/tmp/torchinductor_root, 1.2 MB) is
# filled by the server's torch.compile'd helpers; it is not shipped, so each later start gets
# an empty one: at each marker below, the folder is moved aside (before the next server
# starts compiling; a server takes over 20 s to get there). AGAIN=1, once the chain is done:
# one more start of shipped-auto with the Inductor cache its first start left (the
# Inductor term, isolated).
set -uo pipefail
RES=/root/res; R=reports/2026-12-03-h200-derived-serving
end=$(( $(date +%s) + ${WAIT:-540} ))
i=0
for marker in "Triton cache build" "shipped-auto rc=" "shipped-cutlass rc="; do
  i=$((i + 1))
  while ! grep -q "$marker" $RES/chain.log 2>/dev/null && [ $(date +%s) -lt $end ] \
        && ! grep -q -E "^(done|failed)" $RES/state 2>/dev/null; do sleep 0.5; done
  grep -q "$marker" $RES/chain.log 2>/dev/null || break
  if [ ! -e /tmp/ti-$i ]; then
    mv /tmp/torchinductor_root /tmp/ti-$i 2>/dev/null
    echo "$(date +%T) at '$marker': moved aside $(du -sb /tmp/ti-$i 2>&1 | cut -f1) bytes" >> $RES/inductor-moves.txt
  fi
done
while [ $(date +%s) -lt $end ] && ! grep -q -E "^(done|failed)" $RES/state 2>/dev/null; do sleep 2; done
if [ "${AGAIN:-}" = 1 ] && grep -q "^done" $RES/state && [ ! -e $RES/shipped-auto-again.json ]; then
  rm -rf /tmp/torchinductor_root; cp -r /tmp/ti-2 /tmp/torchinductor_root
  export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export SGLANG_SM120_TRITON_WATCH=$RES/triton/shipped-auto-again
  PYTHONPATH=/tmp/watch:/tmp/jc-site:/tmp/kset-moe:/tmp/site python3 $R/serve_run.py shipped-auto-again $RES /root/m/moe -- \
    --attention-backend flashinfer --cuda-graph-max-bs 256 --skip-tokenizer-init
fi
echo "state: $(cat $RES/state)"; cat $RES/chain.log; cat $RES/inductor-moves.txt 2>/dev/null
for d in /tmp/ti-*; do echo "== $d"; find $d -type f | sed 's|.*/||' | sort | head -40; done > $RES/inductor-files.txt 2>&1
grep -rh -A3 "Topologically Sorted Source Nodes\|Source node to ATen" /tmp/ti-* --include=*.py 2>/dev/null | head -200 > $RES/inductor-sources.txt
cp $RES/*.json $RES/*.txt $OUT/ 2>/dev/null; tar czf $OUT/small.tgz -C $RES . 2>/dev/null; ls -la $OUT | tail -n +2 | wc -l
