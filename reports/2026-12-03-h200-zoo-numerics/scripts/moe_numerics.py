"""FlashInfer's CUTLASS fused MoE (bf16) with and without the SwiGLU clamp, against PyTorch.

The clamp parameters are made by SGLang 0.5.23's own ``materialize_swiglu_params_for_cutlass``
(``sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py``): its function source is read from
the release file and executed alone, on a runner config holding only the fields it reads.
They are passed to ``flashinfer.fused_moe.cutlass_fused_moe`` as SGLang 0.5.23's
``_run_flashinfer_cutlass`` passes them (``swiglu_alpha`` / ``swiglu_beta`` / ``swiglu_limit``,
fp32 per local expert), which makes the kernel run its ``SwigluBias`` activation
(``flashinfer_cutlass_fused_moe_binding.cu``, FlashInfer 0.6.14):
``g = min(gate, limit); u = clamp(up, -limit, limit); act = g * sigmoid(alpha * g) * (u + beta)``.
Without them (what SGLang 0.5.16 / 0.5.20 pass on their CUTLASS NVFP4 path) it runs plain
``silu(gate) * up``. Layout (same file, ``doActivationKernel``): the first half of each expert's
fc1 rows is the linear (up) half, the second half the gate.

Writes one JSON with, for every (form, tokens): the clamped kernel and the unclamped kernel
each against the clamped and the unclamped PyTorch reference.
"""

from __future__ import annotations
import __future__

import argparse
import ast
import json
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch

# Forms: the MoeRunnerConfig fields materialize_swiglu_params_for_cutlass reads.
# GPT-OSS: SGLang's gpt_oss model sets gemm1_alpha 1.702 and gemm1_clamp_limit 7.0
# (config.json swiglu_limit 7.0). "limit only": a clamp without alpha (beta then 0).
GPT_OSS = {"activation": "silu", "gemm1_clamp_limit": 7.0, "swiglu_limit": None,
           "gemm1_alpha": 1.702, "gemm1_beta": None}
LIMIT_ONLY = {"activation": "silu", "gemm1_clamp_limit": None, "swiglu_limit": 7.0,
              "gemm1_alpha": None, "gemm1_beta": None}
FORMS = {"gpt_oss": GPT_OSS, "limit_only": LIMIT_ONLY}
# Activation std of about 5 in fc1's output, so that a good part of it exceeds the limit 7.
INPUT_SCALE = 5.0
MAX_REL_ERR = 1e-2
MIN_COSINE = 0.999


def load_materialize(path: Path) -> Callable[..., Any]:
    """Return ``materialize_swiglu_params_for_cutlass`` executed from a release's source file.

    Args:
        path: sglang 0.5.23's ``sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py``.

    Returns:
        The function (its globals: torch and Optional only, which is all it uses).

    Raises:
        LookupError: the file has no such function.
    """
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if (isinstance(node, ast.FunctionDef)
                and node.name == "materialize_swiglu_params_for_cutlass"):
            mod = ast.Module(body=[node], type_ignores=[])
            code = compile(mod, str(path), "exec",
                           flags=__future__.annotations.compiler_flag, dont_inherit=True)
            ns: dict[str, Any] = {"torch": torch, "Optional": Optional}
            exec(code, ns)
            return ns[node.name]  # type: ignore[no-any-return]
    raise LookupError(f"no materialize_swiglu_params_for_cutlass in {path}")


def make_inputs(tokens: int, hidden: int, inter: int, experts: int, topk: int, seed: int,
                scale: float = INPUT_SCALE
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Build bf16 MoE inputs on the CPU, deterministically.

    Args:
        tokens: tokens.
        hidden: hidden size.
        inter: expert intermediate size.
        experts: experts.
        topk: experts per token.
        seed: seed.
        scale: std of x; weights have std 1/sqrt(fan-in), so fc1 outputs have std about scale.

    Returns:
        x [T, hidden], w13 [E, 2*inter, hidden] (up rows, then gate rows), w2 [E, hidden, inter],
        expert ids [T, topk] int32 (distinct per token), routing weights [T, topk] fp32.
    """
    g = torch.Generator().manual_seed(seed * 7919 + tokens)
    x = (torch.randn(tokens, hidden, generator=g) * scale).to(torch.bfloat16)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5).to(torch.bfloat16)
    w2 = (torch.randn(experts, hidden, inter, generator=g) / inter**0.5).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(tokens)])
    w = torch.softmax(torch.randn(tokens, topk, generator=g), dim=-1)
    return x, w13, w2, ids.to(torch.int32), w.float()


def swiglu(h: torch.Tensor, inter: int, form: dict[str, Any] | None) -> torch.Tensor:
    """The gated activation in fp32, as the kernel defines it.

    Args:
        h: fc1 output [..., 2*inter] (up half first, gate half second).
        inter: intermediate size.
        form: runner-config fields; None = plain SwiGLU (no clamp parameters).

    Returns:
        [..., inter].
    """
    up, gate = h[..., :inter], h[..., inter:]
    if form is None:
        return torch.nn.functional.silu(gate) * up
    limit = form["gemm1_clamp_limit"] or form["swiglu_limit"]
    alpha = form["gemm1_alpha"] if form["gemm1_alpha"] is not None else 1.0
    beta = form["gemm1_beta"]
    if beta is None:
        beta = 1.0 if form["gemm1_alpha"] is not None else 0.0
    g = gate.clamp(max=limit)
    u = up.clamp(-limit, limit)
    return g * torch.sigmoid(alpha * g) * (u + beta)


def reference_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
                  w: torch.Tensor, form: dict[str, Any] | None) -> torch.Tensor:
    """MoE forward in fp32: sum_k w[t,k] * fc2_e(act(fc1_e(x_t))), e = ids[t,k].

    Args:
        x: [T, hidden].
        w13: [E, 2*inter, hidden], up rows then gate rows.
        w2: [E, hidden, inter].
        ids: [T, topk] expert ids.
        w: [T, topk] routing weights.
        form: clamp fields, or None for plain SwiGLU.

    Returns:
        [T, hidden] fp32.
    """
    inter = w2.shape[2]
    xf, w13f, w2f = x.float(), w13.float(), w2.float()
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        t, k = torch.nonzero(ids == e, as_tuple=True)
        if t.numel() == 0:
            continue
        a = swiglu(xf[t] @ w13f[e].T, inter, form)
        out.index_add_(0, t, (a @ w2f[e].T) * w[t, k, None])
    return out


def clamp_hit_fraction(x: torch.Tensor, w13: torch.Tensor, ids: torch.Tensor,
                       form: dict[str, Any]) -> float:
    """Fraction of routed fc1 outputs (up and gate) the clamp changes.

    Args:
        x: [T, hidden].
        w13: [E, 2*inter, hidden].
        ids: [T, topk].
        form: clamp fields.

    Returns:
        The fraction in [0, 1].
    """
    limit = form["gemm1_clamp_limit"] or form["swiglu_limit"]
    inter = w13.shape[1] // 2
    hit = tot = 0
    for e in range(w13.shape[0]):
        t, _ = torch.nonzero(ids == e, as_tuple=True)
        h = x[t].float() @ w13[e].float().T
        hit += int((h[:, :inter].abs() > limit).sum() + (h[:, inter:] > limit).sum())
        tot += h.numel()
    return hit / max(tot, 1)


def metrics(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """max_abs_err, max_rel_err (max|out-ref| / max|ref|), rel_l2, cosine, nonfinite."""
    o, r = out.float(), ref.float()
    nonfinite = int((~torch.isfinite(o)).sum())
    o = torch.nan_to_num(o, nan=0.0, posinf=0.0, neginf=0.0)
    d = o - r
    return {
        "max_abs_err": float(d.abs().max()),
        "max_rel_err": float(d.abs().max() / r.abs().max()),
        "rel_l2": float(d.norm() / r.norm()),
        "cosine": float(torch.nn.functional.cosine_similarity(o.flatten(), r.flatten(), dim=0)),
        "nonfinite": nonfinite,
        "ref_max_abs": float(r.abs().max()),
    }


def passes(m: dict[str, float]) -> bool:
    """Return whether a comparison is within the stated bf16 bound."""
    return (m["nonfinite"] == 0 and m["max_rel_err"] <= MAX_REL_ERR
            and m["cosine"] >= MIN_COSINE)


def main() -> None:
    """Run the kernel over every form and token count; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-file", type=Path, required=True,
                    help="0.5.23's sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py")
    ap.add_argument("--tokens", default="1,64,512")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()

    import flashinfer
    from flashinfer.fused_moe import cutlass_fused_moe
    from flashinfer.fused_moe.core import ActivationType

    materialize = load_materialize(a.sglang_file)
    torch.backends.cuda.matmul.allow_tf32 = False  # an fp32 reference, not TF32
    dev = torch.device("cuda")
    res: dict[str, Any] = {
        "bound": {"max_rel_err": MAX_REL_ERR, "min_cosine": MIN_COSINE,
                  "max_rel_err_definition": "max|out - ref| / max|ref| over the case's tensor"},
        "setup": {k: getattr(a, k) for k in ("tokens", "hidden", "inter", "experts", "topk",
                                             "seed")} | {"input_scale": INPUT_SCALE},
        "flashinfer": flashinfer.__version__,
        "device": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(),
        "cases": {},
    }
    try:
        import flashinfer_jit_cache

        res["flashinfer_jit_cache"] = getattr(flashinfer_jit_cache, "__version__", "?")
    except ImportError:
        res["flashinfer_jit_cache"] = None
    for fname, form in FORMS.items():
        cfg = types.SimpleNamespace(**form)
        for tokens in (int(t) for t in a.tokens.split(",")):
            x, w13, w2, ids, w = make_inputs(tokens, a.hidden, a.inter, a.experts, a.topk,
                                             a.seed)
            alpha, beta, limit = materialize(cfg, a.experts, dev)
            params = {"alpha": alpha.tolist()[:1], "beta": beta.tolist()[:1],
                      "limit": limit.tolist()[:1]}
            xd, w13d, w2d, idsd, wd = (t.to(dev) for t in (x, w13, w2, ids, w))
            outs = {}
            for label, kw in (("kernel_with_clamp", {"swiglu_alpha": alpha,
                                                     "swiglu_beta": beta,
                                                     "swiglu_limit": limit}),
                              ("kernel_without_clamp", {})):
                t0 = time.time()
                out = cutlass_fused_moe(
                    input=xd, token_selected_experts=idsd, token_final_scales=wd,
                    fc1_expert_weights=w13d, fc2_expert_weights=w2d,
                    output_dtype=torch.bfloat16, quant_scales=None,
                    activation_type=ActivationType.Swiglu, **kw,
                )[0]
                torch.cuda.synchronize()
                outs[label] = (out.cpu(), round(time.time() - t0, 3))
            ref_c = reference_moe(xd, w13d, w2d, idsd, wd, form).cpu()
            ref_n = reference_moe(xd, w13d, w2d, idsd, wd, None).cpu()
            row: dict[str, Any] = {"params_per_expert_first": params,
                                   "clamp_hit_fraction": clamp_hit_fraction(x, w13, ids, form)}
            for label, (out, secs) in outs.items():
                for rname, ref in (("ref_with_clamp", ref_c), ("ref_without_clamp", ref_n)):
                    m = metrics(out, ref)
                    row[f"{label}__vs__{rname}"] = {**m, "pass": passes(m)}
                row[f"{label}_seconds"] = secs
            res["cases"][f"{fname}_t{tokens}"] = row
            print(fname, tokens, {k: (v["pass"], round(v["max_rel_err"], 5), round(v["cosine"], 6))
                                  for k, v in row.items() if isinstance(v, dict) and "pass" in v},
                  flush=True)
    a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
