#!/usr/bin/env bash
# One device call: stash this call's carried part; on the last, check and install everything
# and start chain.sh detached; then wait up to WAIT seconds for it, and copy results to $OUT.
# Usage: PART=c1|c2|c3|kw|go|go37|go5|poll WAIT=540 bash reports/2026-12-03-h200-derived-serving/device.sh
set -uo pipefail
R=reports/2026-12-03-h200-derived-serving
mkdir -p /root/keep
case "$PART" in
  c*|kw) cp -r .cache/g36/$PART /root/keep/ && ls /root/keep; du -sh /root/keep; exit 0 ;;
  go)
    cp -r .cache/g36/k /root/keep/ || exit 1; rm -rf /root/res /root/kd /root/kc /root/m /tmp/kset-small
    for d in /root/keep/*/; do (cd $d && sha256sum -c --quiet SHA256SUMS) || { echo "SHA256 MISMATCH in $d"; exit 1; }; done
    echo "sha256 ok: $(cat /root/keep/*/SHA256SUMS | wc -l) files"
    [ -d /tmp/site/sglang ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /root/keep/c*/*.whl /root/keep/k/sglang*.whl || exit 1
    PYTHONPATH=/tmp/site python3 -c 'import sglang, flashinfer; print("sglang", sglang.__version__, "flashinfer", flashinfer.__version__)' || exit 1
    setsid nohup bash $R/chain.sh > /root/chain.out 2>&1 < /dev/null &
    sleep 2 ;;
  go37)  # issue 37, run 4: chain37.sh (c1-c3 and kw carried before; k now)
    cp -r .cache/g36/k /root/keep/ || exit 1; rm -rf /root/res
    for d in /root/keep/*/; do (cd $d && sha256sum -c --quiet SHA256SUMS) || { echo "SHA256 MISMATCH in $d"; exit 1; }; done
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /root/keep/c*/*.whl /root/keep/k/sglang*.whl || exit 1
    setsid nohup bash $R/chain37.sh > /root/chain.out 2>&1 < /dev/null &
    sleep 2 ;;
  go5)  # issue 37, run 5 (CHAIN=chain5b.sh: run 5b): chain5.sh (c1-c3 and kw carried before; k and up, upstream's wheel, now)
    cp -r .cache/g36/k .cache/g36/up /root/keep/ || exit 1; rm -rf /root/res
    for d in /root/keep/*/; do (cd $d && sha256sum -c --quiet SHA256SUMS) || { echo "SHA256 MISMATCH in $d"; exit 1; }; done
    echo "sha256 ok: $(cat /root/keep/*/SHA256SUMS | wc -l) files"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /root/keep/c*/*.whl /root/keep/k/sglang*.whl || exit 1
    setsid nohup bash $R/${CHAIN:-chain5.sh} > /root/chain.out 2>&1 < /dev/null &
    sleep 2 ;;
  poll) ;;
esac
end=$(( $(date +%s) + ${WAIT:-540} ))
while [ "$(cat /root/res/state 2>/dev/null)" = running ] && [ $(date +%s) -lt $end ]; do sleep 5; done
# run 4 stops waiting once the shipped start is done when STOP=shipped
while [ "${STOP:-}" != shipped ] && [ "$(cat /root/res/state 2>/dev/null)" = shipped ] && [ $(date +%s) -lt $end ]; do sleep 5; done
while [ "${STOP:-}" != upstream ] && [ "$(cat /root/res/state 2>/dev/null)" = upstream ] && [ $(date +%s) -lt $end ]; do sleep 5; done
echo "state: $(cat /root/res/state 2>/dev/null)"; cat /root/res/chain.log 2>/dev/null
tail -3 /root/chain.out
cp /root/res/refusal*.json /root/res/dense*.json /root/res/moe*.json /root/res/jit-cache.json $OUT/ 2>/dev/null
cp /root/res/cold-*.json /root/res/shipped-*.json /root/res/upstream-*.json /root/res/warm-*.json /root/res/*.txt $OUT/ 2>/dev/null
tar czf $OUT/small.tgz -C /root/res . 2>/dev/null
ls -la $OUT
