#!/usr/bin/env bash
# On the CPU machine, from the repo root: gather what the device calls carry into .cache/g36/
# (c1..c3: SGLang 0.5.16's dependencies and the builder's, from PyPI, checked against deps.sums
# and bdeps.sums, plus our patched sglang wheel; k: sglang-kernel 0.4.5 without the libraries
# these runs never load (slim_sgl_kernel.py); kw: the derived kernel wheels built here).
# Needs: PY (a python with the builder installed), SGLANG_WHEEL (our cp312 sglang-0.5.16 wheel,
# `python -m builder wheel --target sglang-0.5.16`), SGK (sglang_kernel-0.4.5-cp310-abi3-
# manylinux2014_x86_64.whl), KERNEL_WHEELS (space-separated: the wheels of `kernels build
# --request request-dense.json` and `--request request-moe-bf16.json`, built here; without
# the first the device builds it, which took over 9 minutes there).
set -euo pipefail
R=reports/2026-12-03-h200-derived-serving
G=.cache/g36; rm -rf $G/c1 $G/c2 $G/c3 $G/k $G/kw; mkdir -p $G/w $G/c1 $G/c2 $G/c3 $G/k $G/kw
cat $R/deps.sums $R/bdeps.sums | sort -u -k2 > $G/w/want.sums
awk '{print $2}' $G/w/want.sums | sed -E 's/^([^-]+)-([^-]+)-.*/\1==\2/' > $G/w/reqs.txt
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_26_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_5_x86_64 \
  -d $G/w -r $G/w/reqs.txt
(cd $G/w && sha256sum -c --quiet want.sums)
# three parts of about 41 MB (a call carries at most 64 MiB with the working tree)
cp "$SGLANG_WHEEL" $G/c3/
"$PY" - "$G" <<'PY'
import shutil, sys
from pathlib import Path
g = Path(sys.argv[1]); bins = {f"c{i}": sum(p.stat().st_size for p in (g / f"c{i}").glob("*.whl"))
                               for i in (1, 2, 3)}
for wheel in sorted((g / "w").glob("*.whl"), key=lambda p: -p.stat().st_size):
    least = min(bins, key=bins.get)  # largest first, into the lightest part
    shutil.copy(wheel, g / least); bins[least] += wheel.stat().st_size
print(bins)
PY
"$PY" $R/slim_sgl_kernel.py "$SGK" $G/k
for wheel in ${KERNEL_WHEELS:-}; do cp "$wheel" $G/kw/; done
for d in c1 c2 c3 k kw; do ls $G/$d/*.whl >/dev/null 2>&1 || continue; (cd $G/$d && sha256sum *.whl > SHA256SUMS); du -sh $G/$d; done
