"""Kernel fit on SM120: the DSA TileLang kernels a release's dispatch chooses, lowered for sm_120.

Runs the release's OWN `sglang.kernels.ops.attention.dsa.tilelang_kernel.tilelang_sparse_fwd`
(upstream, or a patched copy first on PYTHONPATH) with the device reported as SM120 (the
harness stand-ins), for each heads-per-GPU count and KV dtype. Every @tilelang.jit factory of
the module is wrapped by a recorder: the dispatch's own choice (factory, arguments) is recorded
and a stand-in kernel returns outputs of the shapes the kernel's TIR declares (checking the
inputs' shapes and dtypes against them). Each recorded configuration is then lowered by
TileLang for {"kind": "cuda", "arch": "sm_120"} (no GPU needed) and its generated CUDA source
compiled with `nvcc -arch=sm_120a -cubin -Xptxas -v` for registers and static shared memory.

Verdict per kernel against SM120/SM121: dynamic + static shared memory <= 101,376 B (opt-in per
block), registers x threads <= 65,536, threads <= 1,024.

  PYTHONPATH=[PATCHED:]STANDINS:TILELANG_DIR SM120_STANDINS=sgl_kernel=0.4.5 \\
      VENV/bin/python kernel_fit.py [--heads 128,64,32,16] [--kv bf16,fp8] [--tokens 1,64,1024]
      [--no-nvcc] [--check-semantics]

TILELANG_DIR holds the release's pinned tilelang (0.1.11 for 0.5.15-0.5.18, 0.1.12 after) and
what it needs that the release venv lacks (ml_dtypes, z3, torch_c_dlpack_ext). Prints one JSON
line per (dispatch call) and per lowered kernel; exit status 1 when any kernel does not fit.
--check-semantics additionally runs the bf16 dispatch on CPU with a torch stand-in for the
sparse-attention kernels' declared semantics and compares with a reference over all heads
(proves how the dispatch splits and reassembles heads, not the kernel's numerics).
"""
import argparse, json, os, re, subprocess, sys, tempfile

SMEM_OPTIN = 101_376
REGS_PER_BLOCK = 65_536
MAX_THREADS = 1_024

ap = argparse.ArgumentParser()
ap.add_argument("--heads", default="128,64,32,16")
ap.add_argument("--kv", default="bf16,fp8")
ap.add_argument("--tokens", default="1,64,1024")
ap.add_argument("--no-nvcc", action="store_true")
ap.add_argument("--check-semantics", action="store_true")
args = ap.parse_args()

import torch  # noqa: E402
import tilelang  # noqa: E402
from tilelang.jit import JITImpl  # noqa: E402
import sglang.kernels.ops.attention.dsa.tilelang_kernel as tk  # noqa: E402

try:
    from importlib.metadata import version as _v
    _sg = _v("sglang")
except Exception:
    _sg = "?"
print(json.dumps({"module": tk.__file__, "sglang": _sg, "tilelang": tilelang.__version__,
                  "capability": list(torch.cuda.get_device_capability())}), flush=True)

_TDT = {"bfloat16": torch.bfloat16, "float32": torch.float32, "int32": torch.int32,
        "float8_e4m3fn": torch.float8_e4m3fn, "float8_e4m3fnuz": torch.float8_e4m3fnuz,
        "uint8": torch.uint8, "float16": torch.float16, "bool": torch.bool}

RECORDED = {}   # key -> (name, fn, args, kwargs)
CALLS = []      # per dispatch call: list of keys
EMULATE = {}    # factory name -> callable(inputs, fargs, fkw) -> outputs (semantics check)


def _key(name, a, k):
    return name + "(" + ", ".join([repr(x) for x in a] + [f"{kk}={k[kk]!r}" for kk in sorted(k)]) + ")"


class _Recorder:
    def __init__(self, name, fn):
        self.name, self.fn = name, fn

    def __call__(self, *a, **k):
        key = _key(self.name, a, k)
        RECORDED.setdefault(key, (self.name, self.fn, a, k))
        CALLS[-1].append(key)
        tir = self.fn.get_tir(*a, **k)
        return _StandinKernel(self.name, key, tir, self.fn.out_idx, a, k)


class _StandinKernel:
    """Checks inputs against the TIR's declared buffers; returns outputs of declared shapes."""

    def __init__(self, name, key, tir, out_idx, fargs, fkw):
        self.name, self.key, self.tir, self.fargs, self.fkw = name, key, tir, fargs, fkw
        n = len(tir.params)
        oi = out_idx if isinstance(out_idx, (list, tuple)) else [out_idx]
        self.out_pos = sorted((i + n) % n for i in oi)

    def __call__(self, *inputs):
        bufs = [self.tir.buffer_map[p] for p in self.tir.params]
        in_bufs = [b for i, b in enumerate(bufs) if i not in self.out_pos]
        assert len(in_bufs) == len(inputs), (self.key, len(in_bufs), len(inputs))
        env = {}
        for b, t in zip(in_bufs, inputs):
            if _TDT[str(b.dtype)] != t.dtype:
                raise TypeError(f"{self.name}: buffer {b.name} is {b.dtype}, got {t.dtype}")
            if len(b.shape) != t.dim():
                raise TypeError(f"{self.name}: buffer {b.name} rank {len(b.shape)}, got {tuple(t.shape)}")
            for dim, size in zip(b.shape, t.shape):
                if hasattr(dim, "value"):
                    if int(dim.value) != size:
                        raise TypeError(f"{self.name}: buffer {b.name} shape {list(b.shape)}, got {tuple(t.shape)}")
                else:
                    env.setdefault(str(dim), size)
                    if env[str(dim)] != size:
                        raise TypeError(f"{self.name}: {dim} bound to {env[str(dim)]} and {size}")
        if self.name in EMULATE and inputs[0].device.type == "cpu":
            return EMULATE[self.name](inputs, self.fargs, self.fkw)
        outs = []
        for i in self.out_pos:
            b = bufs[i]
            shape = [int(d.value) if hasattr(d, "value") else env[str(d)] for d in b.shape]
            outs.append(torch.zeros(shape, dtype=_TDT[str(b.dtype)], device=inputs[0].device))
        return outs[0] if len(outs) == 1 else tuple(outs)


for name in dir(tk):
    obj = getattr(tk, name)
    if isinstance(obj, JITImpl):
        setattr(tk, name, _Recorder(name, obj))


def dispatch(tokens, heads, kv_dtype, device="meta"):
    d_v, dim, topk, pages = 512, 576, 2048, 4096
    q = torch.empty(tokens, heads, dim, dtype=torch.bfloat16, device=device)
    kv = torch.empty(pages, 1, dim, dtype=torch.bfloat16 if kv_dtype == "bf16" else torch.float8_e4m3fn, device=device)
    idx = torch.empty(tokens, 1, topk, dtype=torch.int32, device=device)
    CALLS.append([])
    rec = {"call": "tilelang_sparse_fwd", "tokens": tokens, "heads_per_gpu": heads, "kv": kv_dtype}
    try:
        out = tk.tilelang_sparse_fwd(q, kv, idx, sm_scale=dim ** -0.5, d_v=d_v)
        rec.update(out_shape=list(out.shape), kernels=CALLS[-1])
    except Exception as e:  # the dispatch refuses, or a chosen kernel rejects its inputs
        rec.update(error=f"{type(e).__name__}: {e}"[:300], kernels=CALLS[-1])
    print(json.dumps(rec), flush=True)


heads_list = [int(x) for x in args.heads.split(",")]
for kvd in args.kv.split(","):
    for h in heads_list:
        for t in [int(x) for x in args.tokens.split(",")]:
            dispatch(t, h, kvd)

# --- semantics of the bf16 dispatch's head split (CPU, torch stand-in for the kernel) ---
if args.check_semantics:
    def _ref(q, kv, idx, sm_scale, d_v):  # q [b,s,H,D] kv [b,N,1,D] idx [b,s,1,K]
        b, s, H, D = q.shape
        i = idx[:, :, 0, :].long()
        valid = i >= 0
        g = kv[0, i.clamp(min=0)[0], 0, :].float()          # [s, K, D]
        sc = torch.einsum("shd,skd->shk", q[0].float(), g) * sm_scale
        sc = sc.masked_fill(~valid[0][:, None, :], float("-inf"))
        p = torch.softmax(sc, dim=-1)
        return torch.einsum("shk,skd->shd", p, g[..., :d_v]).to(torch.bfloat16)[None]

    def _emul(inputs, fargs, fkw):
        q, kv, idx = inputs
        sm = fkw.get("sm_scale")
        return _ref(q, kv, idx, sm, fargs[1])

    EMULATE["sparse_attention_fwd_kernel_v1"] = _emul
    EMULATE["sparse_attention_fwd_kernel_v2"] = _emul
    torch.manual_seed(0)
    for h in heads_list:
        s, N, K, D, dv = 3, 4096, 2048, 576, 512
        q = torch.randn(s, h, D, dtype=torch.bfloat16)
        kv = torch.randn(N, 1, D, dtype=torch.bfloat16)
        idx = torch.stack([torch.randperm(N)[:K] for _ in range(s)]).int()[:, None, :]
        idx[1, 0, 1500:] = -1
        CALLS.append([])
        out = tk.tilelang_sparse_fwd(q, kv, idx, sm_scale=D ** -0.5, d_v=dv)
        ref = _ref(q[None], kv[None], idx[None], D ** -0.5, dv)
        err = (out.float() - ref.float()).abs().max().item()
        print(json.dumps({"semantics": "head split vs all-heads reference", "heads_per_gpu": h,
                          "kernels": CALLS[-1], "out_shape": list(out.shape), "max_abs_err": err,
                          "ok": list(out.shape) == list(ref.shape) and err == 0.0}), flush=True)

# --- lower every recorded configuration for sm_120 ---
from tvm.target import Target  # noqa: E402
import tvm  # noqa: E402

TL_DIR = os.path.dirname(tilelang.__file__)
INCS = [os.path.join(TL_DIR, "src"), os.path.join(TL_DIR, "3rdparty", "cutlass", "include")]
target = Target({"kind": "cuda", "arch": "sm_120"})
all_fit = True


def _nvcc(src, flags):
    with tempfile.TemporaryDirectory() as d:
        cu = os.path.join(d, "k.cu")
        open(cu, "w").write(src)
        keep = [f for f in (flags or []) if f.startswith(("-U", "-D", "--expt"))]
        ptx = [f.split("=", 1)[1] for f in (flags or []) if f.startswith("--ptxas-options=")]
        cmd = ["nvcc", "-arch=sm_120a", "-cubin", "-O3", "-std=c++17", "-DENABLE_BF16", "-w",
               "--expt-relaxed-constexpr", "--expt-extended-lambda",
               "-Xptxas", ",".join(["-v"] + [p for p in ptx if p != "-v"]).replace("-v,-v", "-v"),
               *[f"-I{i}" for i in INCS], *keep, "-o", os.path.join(d, "k.cubin"), cu]
        r = subprocess.run(cmd, capture_output=True, text=True)
        res, cur = {}, None
        for line in r.stderr.splitlines():
            m = re.search(r"Compiling entry function '(\w+)' for '(\w+)'", line)
            if m:
                cur = m.group(1); res[cur] = {"registers": None, "static_smem": 0, "spill_stores": 0}
            if cur is None:
                continue
            m = re.search(r"Used (\d+) registers", line)
            if m:
                res[cur]["registers"] = int(m.group(1))
            m = re.search(r"(\d+) bytes smem", line)
            if m:
                res[cur]["static_smem"] = int(m.group(1))
            m = re.search(r"(\d+) bytes spill stores", line)
            if m:
                res[cur]["spill_stores"] = int(m.group(1))
        if r.returncode != 0:
            res["_error"] = r.stderr[-600:]
        return res


for key, (name, fn, a, k) in RECORDED.items():
    tir = fn.get_tir(*a, **k)
    with tvm.transform.PassContext(config=dict(fn.pass_configs or {})), target:
        art = tilelang.lower(tir, target=target)
    res = _nvcc(art.kernel_source, fn.compile_flags) if not args.no_nvcc else {}
    for gv, f in art.device_mod.functions.items():
        at = f.attrs
        dyn = int(at["dyn_shared_memory_buf"]) if "dyn_shared_memory_buf" in at else 0
        te = {str(kk): int(vv) for kk, vv in dict(at["thread_extent"]).items()
              if str(kk).startswith("threadIdx")} if "thread_extent" in at else {}
        threads = te.get("threadIdx.x", 1) * te.get("threadIdx.y", 1) * te.get("threadIdx.z", 1)
        fname = str(gv.name_hint)
        nv = res.get(fname) or (next(iter(v for kk, v in res.items() if kk != "_error"), None) if len(res) - ("_error" in res) == 1 else None)
        regs = nv["registers"] if nv else None
        static = nv["static_smem"] if nv else None
        checks = {"smem": dyn + (static or 0) <= SMEM_OPTIN, "threads": threads <= MAX_THREADS}
        if regs is not None:
            checks["registers"] = regs * threads <= REGS_PER_BLOCK
        fits = all(checks.values())
        all_fit &= fits
        print(json.dumps({"kernel": key, "device_function": fname, "dynamic_smem": dyn,
                          "static_smem": static, "registers_per_thread": regs, "threads": threads,
                          "spill_stores": nv["spill_stores"] if nv else None,
                          "limits": {"smem_optin": SMEM_OPTIN, "regs_per_block": REGS_PER_BLOCK, "threads": MAX_THREADS},
                          "checks": checks, "fits_sm120": fits,
                          "nvcc_error": res.get("_error")}), flush=True)

print(json.dumps({"all_fit_sm120": all_fit, "kernels": len(RECORDED)}), flush=True)
sys.exit(0 if all_fit else 1)
