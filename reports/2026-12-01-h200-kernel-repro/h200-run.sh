#!/bin/bash
# Issue 29: the norm request for sglang-0.5.9 (12.0a) built on the lent machine.
cd "$(dirname "$0")"; H=$PWD; R=$OUT/r; mkdir -p $R
NVCC=$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")
{ echo "nvcc=$NVCC"; $NVCC --version; c++ --version | head -1; gcc --version | head -1; nproc; python3 --version; command -v python3; ninja --version; ldd --version | head -1; head -2 /etc/os-release; uname -r; cat $(dirname $NVCC)/../version.json | head -40; sha256sum $(dirname $NVCC)/../include/cuda_runtime_api.h $(dirname $NVCC)/../include/crt/host_config.h $(dirname $NVCC)/../include/cuda.h; c++ -print-file-name=libstdc++.so; python3 -c "import torch; print(torch.__version__, torch._C._GLIBCXX_USE_CXX11_ABI)"; } > $R/env.txt 2>&1
python3 -m pip install -q --no-index --no-deps $H/whl/*.whl > $R/pip.txt 2>&1
P=$(python3 -c "import sysconfig;print(sysconfig.get_paths()['purelib'])"); ls -d $P/nvidia/*/include >> $R/pip.txt; ls $P/nvidia/*/include/cublas_v2.h $P/nvidia/*/include/curand.h $(dirname $NVCC)/../include/cublas_v2.h $(dirname $NVCC)/../include/curand.h >> $R/pip.txt 2>&1
mkdir -p $P/nvidia/cu13/include && cp -n $H/hdr/* $P/nvidia/cu13/include/
python3 -m pip list 2>/dev/null | grep -i "flashinfer\|tvm\|tomlkit\|ninja\|torch " >> $R/pip.txt
cd $H/repo
for j in 16 1; do
  s=$(date +%s)
  PYTHONPATH=$PWD timeout $([ $j = 16 ] && echo 200 || echo 140) python3 -m builder kernels --request $H/request.json --environment current --mode host --nvcc $NVCC --jobs $j --cache-dir /tmp/c$j --dist /tmp/d$j --json > $R/build$j.json 2> $R/build$j.err
  echo "jobs $j rc $? seconds $(( $(date +%s) - s ))" | tee -a $R/env.txt
  cp /tmp/c$j/logs/*.log $R/ 2>/dev/null; L=$(python3 -c "import json;print(json.load(open('$R/build$j.json')).get('log',''))" 2>/dev/null); [ -f "$L" ] && cp "$L" $R/log$j.txt
  cp /tmp/d$j/*.whl $R/ 2>/dev/null && mkdir -p $R/w$j && cp /tmp/d$j/*.whl $R/w$j/
  sha256sum /tmp/d$j/*.whl | tee -a $R/env.txt
  [ $(( $(date +%s) - s )) -gt 150 ] && break
done
cd $OUT && tar czf dev.tgz r && rm -rf r; ls -la $OUT
