#!/usr/bin/env bash
# Issue 36: make the carry folder .cache/prune (ignored) for device.sh, here on the CPU, from
# the checkout root (whose builder runs; the folder: the first argument, else ./.cache/prune). Needs the test cache (SGLANG_SM120_TEST_CACHE: the behaviour
# environments of 0.5.16 and 0.5.23, FlashInfer 0.7.2's wheel) and pip's ordinary index for
# five pure-Python wheels. Writes SHA256SUMS; refuses a folder over 60 MiB.
set -euo pipefail
PY=${PY:-python3}
T=${SGLANG_SM120_TEST_CACHE:-/root/.cache/sglang-sm120-tests}; K=$T/builder-cache
C=${1:-$PWD/.cache/prune}; W=$(mktemp -d); trap 'rm -rf $W' EXIT
rm -rf $C; mkdir -p $C/req $C/whl $C/fi0614
# The requests: (a) derived from the zoo's Qwen3-30B-A3B NVFP4 (mixed) form, its shrunk head
# dim 32 set back to the real model's 128; (b) the default set; (c) fused_moe_sm90 of
# 0.5.16's FlashInfer pruned to bf16 x bf16, for the H200.
$PY -c "from pathlib import Path; from builder.behaviour.run import zoo_forms; z = zoo_forms(); z.write(z.BY_NAME['qwen3-30b-a3b-nvfp4-mixed'], Path('$W'))"
$PY -m builder --cache-dir $K kernels plan --target sglang-0.5.23 \
  --model $W/qwen3-30b-a3b-nvfp4-mixed --output $W/a.json 2>&1 | tail -4
$PY - $W/a.json $C/req/a-nvfp4-pruned.json <<'PYEOF'
import json, sys
data = json.load(open(sys.argv[1]))
assert data["moe_variants"] == ["nvfp4 x nvfp4"] and data["head_dims"] == [32], data
data["head_dims"] = [128]  # Qwen3-30B-A3B's head dim (the zoo form's is shrunk)
data["derived"]["note"] = "head_dims set to 128 (the real checkpoint's) by prepare.sh"
json.dump(data, open(sys.argv[2], "w"), indent=2)
PYEOF
$PY -m builder --cache-dir $K kernels plan --target sglang-0.5.23 \
  --output $C/req/b-default.json 2>&1 | tail -1
# (c) through the API: the command line prunes only a --model set (no flag).
$PY - $C/req/c-sm90-bf16-pruned.json $K <<'PYEOF'
import json, sys
from pathlib import Path
from builder.core.options import Options
from builder.kernels.request import KernelOptions, kernel_request
options = Options(targets_file=Path("targets.toml"), target="sglang-0.5.16",
                  cache_dir=Path(sys.argv[2]))
request = kernel_request(options, KernelOptions(
    lane="13.0", arch_list=("9.0a",), groups=("fused_moe_sm90",),
    moe_variants=("bf16 x bf16",)))
json.dump(request.describe(), open(sys.argv[1], "w"), indent=2)
print(request.version, request.groups, request.moe_variants)
PYEOF
# FlashInfer 0.7.2 (65 MB as a wheel): its tree less what no JIT spec of the builder's groups
# reads (experimental/, moe_ep/, the cuDNN frost MoE's Python backend), xz-compressed.
FI72=$(ls $K/wheelhouse/*/flashinfer_python-0.7.2-py3-none-any.whl 2>/dev/null | head -1 || true)
if [ -z "$FI72" ]; then  # no kernel build has cached it yet: PyPI's copy
  $PY -m pip download -q --no-deps --only-binary=:all: -d $W flashinfer-python==0.7.2
  FI72=$W/flashinfer_python-0.7.2-py3-none-any.whl
fi
mkdir $W/fi && (cd $W/fi && $PY -m zipfile -e $FI72 . && rm -rf flashinfer/experimental \
  flashinfer/moe_ep flashinfer/fused_moe/backends/cudnn_frost && \
  tar cf - flashinfer flashinfer_python-0.7.2.dist-info | xz -6 -T2 > $C/fi072.tar.xz)
# FlashInfer 0.6.14 and apache-tvm-ffi 0.1.11 (both FlashInfers accept it; cp312 abi3).
$PY -m pip download -q --no-deps --only-binary=:all: -d $C/fi0614 flashinfer-python==0.6.14
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 -d $C/whl apache-tvm-ffi==0.1.11
# The builder's own dependencies the H200 image lacks (pure Python).
$PY -m pip download -q --no-deps --only-binary=:all: -d $C/whl gitpython gitdb smmap \
  unidiff tomlkit
# cuBLAS/cuRAND headers (the preflight checks them; the fused MoE includes cublasLt.h), from
# a CUDA 13 kernel environment's nvidia/cu13/include.
H=$(ls -d $K/kernel-env/*/venv/lib/python3*/site-packages/nvidia/cu13/include | head -1)
(cd $H && tar cf - cublas*.h curand*.h | xz -6 > $C/cuda-headers.tar.xz)
(cd $C && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum > SHA256SUMS)
size=$(du -sm $C | cut -f1); echo "carry folder $C: $size MiB"; cat $C/SHA256SUMS
[ "$size" -le 60 ] || { echo "over 60 MiB"; exit 1; }
