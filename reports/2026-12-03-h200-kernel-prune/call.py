"""Part (c) on the H200: FlashInfer 0.6.14's ``cutlass_fused_moe`` on a pruned ``fused_moe_90``.

The module comes from the kernel wheel built by ``chain.sh`` (pruned to ``bf16 x bf16``:
``moe_gemm_kernels_bf16_bf16.cu`` and ``_fp16_fp16.cu`` kept, the other 12 units stubs),
installed as ``flashinfer_jit_cache``; ``FLASHINFER_DISABLE_JIT=1`` makes FlashInfer load it
or fail, never compile. Kept dtypes (bf16, fp16) are compared with an fp32 torch reference
of the same MoE (SwiGLU, top-k routing); pruned ones (fp8 x fp8, bf16 x fp8 weights) must
fail with the stub's message. Writes one JSON object to ``--json``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

import torch

PRUNED = "was pruned from this FlashInfer fused MoE module"


def inputs(dtype: torch.dtype, tokens: int, hidden: int, inter: int, experts: int, topk: int
           ) -> tuple[torch.Tensor, ...]:
    """Random MoE inputs on the GPU: x, w13 (up rows then gate rows), w2, ids, weights."""
    g = torch.Generator().manual_seed(tokens * 31 + hidden)
    x = (torch.randn(tokens, hidden, generator=g) * 0.5).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5).to(dtype)
    ids = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(tokens)])
    w = torch.softmax(torch.randn(tokens, topk, generator=g), dim=-1)
    return tuple(t.cuda() for t in (x, w13, w2, ids.to(torch.int32), w.float()))


def reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
              w: torch.Tensor) -> torch.Tensor:
    """The MoE in fp32: sum_k w[t,k] * w2_e(silu(gate) * up), e = ids[t,k]."""
    inter = w2.shape[2]
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        t, k = torch.nonzero(ids == e, as_tuple=True)
        if t.numel():
            h = x[t].float() @ w13[e].float().T
            a = torch.nn.functional.silu(h[:, inter:]) * h[:, :inter]
            out.index_add_(0, t, (a @ w2[e].float().T) * w[t, k, None])
    return out


def main() -> None:
    """Load, call, compare; write the JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--so", type=Path, required=True, help="the installed fused_moe_90.so")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(),
                           "disable_jit": os.environ.get("FLASHINFER_DISABLE_JIT"),
                           "so": str(a.so), "cases": {}}
    import flashinfer
    import flashinfer_jit_cache
    from flashinfer.fused_moe import cutlass_fused_moe
    from flashinfer.fused_moe.core import ActivationType

    res["flashinfer"] = flashinfer.__version__
    res["jit_cache"] = flashinfer_jit_cache.__version__
    manifest = flashinfer_jit_cache.manifest()
    res["manifest_moe_variants"] = manifest.get("moe_variants")
    res["manifest_pruned"] = [m.get("pruned") for m in manifest["modules"]
                              if m["name"] == "fused_moe_90"]
    try:  # every symbol resolved at load (tvm_ffi's and torch's libraries loaded first)
        import tvm_ffi  # noqa: F401

        ctypes.CDLL(str(a.so), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        res["dlopen_rtld_now"] = "ok"
    except OSError as error:
        res["dlopen_rtld_now"] = str(error)
    hidden, inter, experts, topk = 1024, 512, 8, 2
    for name, dtype in (("bf16 x bf16", torch.bfloat16), ("fp16 x fp16", torch.float16)):
        for tokens in (1, 256):
            x, w13, w2, ids, w = inputs(dtype, tokens, hidden, inter, experts, topk)
            row: dict[str, Any] = {}
            try:
                t0 = time.time()
                out = cutlass_fused_moe(input=x, token_selected_experts=ids,
                                        token_final_scales=w, fc1_expert_weights=w13,
                                        fc2_expert_weights=w2, output_dtype=dtype,
                                        quant_scales=None,
                                        activation_type=ActivationType.Swiglu)[0]
                torch.cuda.synchronize()
                ref = reference(x, w13, w2, ids, w)
                err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
                cos = torch.nn.functional.cosine_similarity(out.float().flatten(),
                                                            ref.flatten(), dim=0).item()
                row = {"ok": True, "seconds": round(time.time() - t0, 3),
                       "max_rel_err": err, "cosine": cos, "pass": err < 2e-2 and cos > 0.999}
            except Exception as error:  # recorded, the run goes on
                row = {"ok": False, "error": f"{type(error).__name__}: {error}"[-600:],
                       "trace": traceback.format_exc()[-1500:]}
            res["cases"][f"{name} t{tokens}"] = row
            print(name, tokens, row, flush=True)
    x, w13, w2, ids, w = inputs(torch.bfloat16, 16, hidden, inter, experts, topk)
    one = torch.ones(experts, device="cuda", dtype=torch.float32)
    pruned_calls = {
        "fp8 x fp8": dict(input=x.to(torch.float8_e4m3fn), fc1_expert_weights=w13.to(
            torch.float8_e4m3fn), fc2_expert_weights=w2.to(torch.float8_e4m3fn),
            quant_scales=[one, one[:1], one, one[:1]]),
        "bf16 x fp8 weights": dict(input=x, fc1_expert_weights=w13.to(torch.float8_e4m3fn),
                                   fc2_expert_weights=w2.to(torch.float8_e4m3fn),
                                   quant_scales=None),
    }
    for name, kwargs in pruned_calls.items():
        try:
            cutlass_fused_moe(token_selected_experts=ids, token_final_scales=w,
                              output_dtype=torch.bfloat16,
                              activation_type=ActivationType.Swiglu, **kwargs)
            torch.cuda.synchronize()
            row = {"ok": True, "pruned_message": False}
        except Exception as error:  # the point: it must fail, loudly
            message = f"{type(error).__name__}: {error}"
            row = {"ok": False, "pruned_message": PRUNED in message,
                   "error": message[-800:]}
        res["cases"][f"pruned {name}"] = row
        print(name, row, flush=True)
    kept = [v for k, v in res["cases"].items() if not k.startswith("pruned")]
    gone = [v for k, v in res["cases"].items() if k.startswith("pruned")]
    res["pass"] = all(v.get("pass") for v in kept) and all(v["pruned_message"] for v in gone)
    a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
