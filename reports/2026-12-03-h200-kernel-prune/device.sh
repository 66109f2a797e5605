#!/usr/bin/env bash
# Issue 36, pruned fused MoE modules, on the lent H200 (16 cores): run from the checkout root
# with .cache/prune carried (prepare.sh made it). The first call checks SHA256SUMS, installs
# the carried packages and starts chain.sh detached; every call (the first too) waits up to
# WAIT seconds (default 540) for it, then copies what is there to $OUT. Call again with the
# same command until it prints "done".
set -uo pipefail
export PYTHONUNBUFFERED=1
H=$(cd "$(dirname "$0")" && pwd); C=$PWD/.cache/prune; R=/root/prune; mkdir -p $R
if [ ! -f $R/started ]; then
  (cd $C && sha256sum -c --quiet SHA256SUMS) || { echo "sha256 check failed"; exit 1; }
  touch $R/started
  setsid nohup bash $H/chain.sh "$C" "$R" "$PWD" > $R/chain.log 2>&1 < /dev/null &
  echo "chain started"
fi
end=$(( $(date +%s) + ${WAIT:-540} ))
while [ ! -f $R/done ] && [ $(date +%s) -lt $end ]; do sleep 5; done
# the summary of what is there so far (the chain writes the final one when done)
[ -f $R/done ] && cp $R/results.json $OUT/ || python3 $H/summarize.py $R > $OUT/results.json 2>/dev/null
for s in a b c; do [ -f $R/$s.json ] && cp $R/$s.json $OUT/build-$s.json; done
(cd $R && tar czf $OUT/small.tgz --ignore-failed-read machine.txt chain.log *.err *.log \
   *.time costs-*.json call-c.json nm-*.txt 2>/dev/null)
echo "$( [ -f $R/done ] && echo done || echo running ): $(cat $R/progress 2>/dev/null)"
tail -3 $R/chain.log
