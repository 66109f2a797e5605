# Wait up to $1 seconds for the detached kernel build; report; ship the wheel when done.
K=/root/keep; end=$(( $(date +%s) + ${1:-540} ))
while [ ! -f $K/rc ] && [ $(date +%s) -lt $end ]; do sleep 10; done
echo "elapsed $(( $(date +%s) - $(cat $K/t0) )) s"; grep -c "cuda_compile\|\[.*/.*\]" $K/kernels.log; tail -3 $K/kernels.log | cut -c1-300
uptime
if [ -f $K/rc ]; then echo "rc=$(cat $K/rc) in $(( $(cat $K/t1) - $(cat $K/t0) )) s"; cp $K/kernels.json $OUT/; tail -c 200000 $K/kernels.log > $OUT/kernels.log
  ls -la $K/kdist; for w in $K/kdist/*.whl; do sha256sum $w; n=$(basename $w | tr + _); split -b 15M $w $OUT/$n.part-; done; fi
