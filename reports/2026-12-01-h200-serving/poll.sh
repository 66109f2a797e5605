# Device: wait up to $1 seconds (default 540) for the detached benchmark, then copy what it
# wrote to $OUT. Exit 0 when it has finished, 3 while it still runs.
W=${1:-540}; end=$(( $(date +%s) + W ))
while [ $(date +%s) -lt $end ] && pgrep -f "[b]enchmarks/bench_serving.py" > /dev/null; do sleep 5; done
mkdir -p $OUT/bench && cp /root/bench/results.json /root/bench/key.json /root/bench/warm-cache.json $OUT/bench/ 2>/dev/null; tar -czf $OUT/bench/logs.tgz -C /root/bench logs 2>/dev/null
cp /root/bench.log $OUT/ 2>/dev/null; tail -c 1500 /root/bench.log
if pgrep -f "[b]enchmarks/bench_serving.py" > /dev/null; then echo "STILL RUNNING"; exit 3; fi
echo "FINISHED"
