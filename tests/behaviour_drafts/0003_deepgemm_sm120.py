"""Precondition of 0003: does the release's pinned sgl-deep-gemm serve the DSA indexer on SM120?

The DSA indexer (sglang layers/attention/dsa/dsa_indexer.py and, from 0.5.2x, dsa/utils.py)
calls DeepGEMM's fp8_mqa_logits (prefill), get_paged_mqa_logits_metadata and
fp8_paged_mqa_logits (decode). DeepGEMM compiles its kernels at run time (JIT) from the headers
it ships (deep_gemm/include/deep_gemm/impls/*.cuh); the host library deep_gemm/_C.so holds the
arch dispatch. So the check reads, from the wheel itself:
  1. which deep_gemm functions the release's indexer calls (text of the given sglang tree);
  2. whether the wheel ships SM120 kernels for them (impls/sm120_*mqa_logits*.cuh);
  3. which arch majors _C.so's dispatch accepts for the paged MQA logits (its embedded
     assertion strings, e.g. "(arch_major == 12 and block_kv == 64)");
  4. cuobjdump --list-elf/--list-ptx on _C.so (device code shipped, if any).

  python 0003_deepgemm_sm120.py SGL_DEEP_GEMM_WHEEL_OR_DIR [SGLANG_PACKAGE_DIR]
  (get the wheel with: pip download --no-deps sgl-deep-gemm==0.1.4.post1 -d DIR)
Prints one JSON object; exit status 0 when SM120 is served, 1 when not.
"""
import glob, json, os, re, shutil, subprocess, sys, tempfile, zipfile

src = sys.argv[1]
sg = sys.argv[2] if len(sys.argv) > 2 else None
tmp = None
if src.endswith(".whl"):
    tmp = tempfile.mkdtemp()
    zipfile.ZipFile(src).extractall(tmp)
    root = tmp
else:
    root = src
dg = os.path.join(root, "deep_gemm")
ver = open(os.path.join(dg, "VERSION")).read().strip() if os.path.exists(os.path.join(dg, "VERSION")) else None
impls = sorted(os.path.basename(p) for p in glob.glob(os.path.join(dg, "include", "deep_gemm", "impls", "*.cuh")))
so = os.path.join(dg, "_C.so")
data = open(so, "rb").read()
strings = set(m.decode() for m in re.findall(rb"[\x20-\x7e]{8,}", data))
arch_checks = sorted(s for s in strings if "arch_major" in s and len(s) < 300)
paged_checks = [s for s in arch_checks if "block_kv" in s]
archs_paged = sorted({int(m) for s in paged_checks for m in re.findall(r"arch_major == (\d+)", s)})

cuobj = shutil.which("cuobjdump") or next(iter(glob.glob("/usr/local/cuda*/bin/cuobjdump")), None) \
    or next(iter(glob.glob("/root/.cache/**/cuobjdump", recursive=True)), None)
elf = ptx = None
if cuobj:
    elf = subprocess.run([cuobj, "--list-elf", so], capture_output=True, text=True)
    elf = (elf.stdout + elf.stderr).strip()
    ptx = subprocess.run([cuobj, "--list-ptx", so], capture_output=True, text=True)
    ptx = (ptx.stdout + ptx.stderr).strip()

calls = None
if sg:
    calls = set()
    for p in glob.glob(os.path.join(sg, "srt", "layers", "attention", "dsa", "*.py")):
        calls |= set(re.findall(r"deep_gemm\.(\w*mqa_logits\w*)", open(p).read()))
    calls = sorted(calls)

sm120_impls = [i for i in impls if i.startswith("sm120_") and "mqa_logits" in i]
served = bool(sm120_impls) and 12 in archs_paged
print(json.dumps({
    "sgl_deep_gemm": ver or os.path.basename(src),
    "release_indexer_calls": calls,
    "mqa_logits_impls": [i for i in impls if "mqa_logits" in i],
    "sm120_mqa_logits_impls": sm120_impls,
    "paged_mqa_logits_arch_checks": paged_checks,
    "paged_mqa_logits_arch_majors": archs_paged,
    "cuobjdump_list_elf": elf, "cuobjdump_list_ptx": ptx,
    "sm120_served": served,
}, indent=1))
if tmp:
    shutil.rmtree(tmp)
sys.exit(0 if served else 1)
