"""Patch 0003's SM12x DSA tile against upstream's TileLang kernel and an fp32 reference.

Two sub-commands, so that the TileLang compiles of the kernels can run in parallel processes:

``run``: load one copy of ``sglang/kernels/ops/attention/dsa/tilelang_kernel.py`` standalone
(only its two sglang-internal imports are stubbed: ``is_fp8_fnuz``, ``is_hip``,
``is_gfx95_supported``, all False as on any CUDA GPU), call its ``tilelang_sparse_fwd`` (the
entry SGLang's DSA backend calls) on bf16 q/kv for every case, and save the outputs.
``--force-sm12x`` replaces the module's ``_is_sm12x_cuda`` with one that answers True, so the
patched file takes its SM12x branch (``_tilelang_sparse_fwd_sm12x``: sparse_attention_fwd_kernel_v1,
block_I=32, num_stages=1, threads=128, rows of 16 heads) on this sm_90 GPU; without it, the
upstream file takes upstream's bf16 path (sparse_attention_fwd_kernel_v2, block_I=64, 384
threads, since the tail dim is 64).

``compare``: rebuild every case's inputs from its seed, compute the fp32 reference in PyTorch
and compare each saved output with it (and the SM12x outputs with upstream's), then write JSON.

Case = (heads, tokens, invalid fraction): q [tokens, heads, 576], kv [kv_len, 1, 576]
(d_v 512 + rope tail 64, DeepSeek-V3.2's MLA widths), indices [tokens, 1, topk] int32,
each row a random permutation prefix of [0, kv_len); with invalid fraction f the last
f * topk entries of each row are -1 (the DSA indexer pads its top-k with -1).
sm_scale = 192 ** -0.5 (qk_nope 128 + rope 64).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

import torch

D_V, D_TAIL = 512, 64
SM_SCALE = 192**-0.5
# bf16 keeps 8 significant bits (unit roundoff 2**-8 = 0.39 %); the kernels round P and the
# output to bf16. Pass: max|out - ref| / max|ref| <= 1 % and cosine(out, ref) >= 0.999.
MAX_REL_ERR = 1e-2
MIN_COSINE = 0.999


def stub_sglang() -> None:
    """Register the two sglang-internal modules the kernel file imports, with CUDA answers.

    ``sglang.kernels.ops.quantization.fp8_kernel.is_fp8_fnuz`` is False off ROCm gfx94 and
    ``sglang.srt.utils.is_hip`` / ``is_gfx95_supported`` are False on CUDA (sglang 0.5.20 and
    0.5.23, the files named).
    """
    names = ["sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.quantization",
             "sglang.kernels.ops.quantization.fp8_kernel", "sglang.srt", "sglang.srt.utils"]
    for n in names:
        sys.modules.setdefault(n, types.ModuleType(n))
    fp8 = sys.modules["sglang.kernels.ops.quantization.fp8_kernel"]
    fp8.is_fp8_fnuz = lambda: False  # type: ignore[attr-defined]
    utils = sys.modules["sglang.srt.utils"]
    utils.is_hip = lambda: False  # type: ignore[attr-defined]
    utils.is_gfx95_supported = lambda: False  # type: ignore[attr-defined]


def load_kernel_file(path: Path, name: str) -> types.ModuleType:
    """Import a tilelang_kernel.py copy as a standalone module.

    Args:
        path: the .py file.
        name: module name to register it under.

    Returns:
        The module.
    """
    stub_sglang()
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def parse_list(text: str, kind: type) -> list[Any]:
    """Parse "a,b,c" into a list of ``kind``.

    Args:
        text: comma-separated values.
        kind: int or float.

    Returns:
        The values.
    """
    return [kind(x) for x in text.split(",") if x]


def case_name(heads: int, tokens: int, invalid: float) -> str:
    """Return the file stem of one case."""
    return f"h{heads}_t{tokens}_inv{round(invalid * 100)}"


def make_inputs(heads: int, tokens: int, invalid: float, topk: int, kv_len: int,
                seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Build one case's inputs on the CPU, deterministically from the seed.

    Args:
        heads: query heads.
        tokens: query tokens.
        invalid: fraction of each index row set to -1 (at the end of the row).
        topk: indices per token.
        kv_len: rows in the KV cache.
        seed: base seed (mixed with the case's shape).

    Returns:
        q [tokens, heads, 576] bf16, kv [kv_len, 1, 576] bf16, indices [tokens, 1, topk] int32.
    """
    g = torch.Generator().manual_seed(seed * 1000003 + heads * 1009 + tokens * 13
                                      + int(invalid * 100))
    q = torch.randn(tokens, heads, D_V + D_TAIL, generator=g).to(torch.bfloat16)
    kv = torch.randn(kv_len, 1, D_V + D_TAIL, generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(kv_len, generator=g)[:topk] for _ in range(tokens)])
    n_bad = round(invalid * topk)
    if n_bad:
        idx[:, topk - n_bad:] = -1
    return q, kv, idx.to(torch.int32).unsqueeze(1)


def reference(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor,
              sm_scale: float = SM_SCALE) -> torch.Tensor:
    """Sparse MLA attention in fp32: softmax over each token's valid top-k KV rows.

    Args:
        q: [tokens, heads, 576].
        kv: [kv_len, 1, 576]; keys are all 576 columns, values the first 512.
        idx: [tokens, 1, topk], -1 = masked.
        sm_scale: softmax scale.

    Returns:
        [tokens, heads, 512] fp32.
    """
    ids = idx[:, 0, :].long()
    valid = ids >= 0
    kvg = kv[:, 0, :].float()[ids.clamp(min=0)]  # [tokens, topk, 576]
    s = torch.einsum("thd,tkd->thk", q.float(), kvg) * sm_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("thk,tkd->thd", p, kvg[..., :D_V])


def metrics(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Compare one output with the reference.

    Args:
        out: [tokens, heads, 512], any float dtype.
        ref: same shape, fp32.

    Returns:
        max_abs_err, max_rel_err (max|out-ref| / max|ref|), rel_l2, cosine (flattened),
        min_row_cosine (over (token, head) rows), nonfinite (count).
    """
    o, r = out.float(), ref.float()
    nonfinite = int((~torch.isfinite(o)).sum())
    o = torch.nan_to_num(o, nan=0.0, posinf=0.0, neginf=0.0)
    d = o - r
    cos = torch.nn.functional.cosine_similarity(o.flatten(), r.flatten(), dim=0)
    row_cos = torch.nn.functional.cosine_similarity(o.flatten(0, 1), r.flatten(0, 1), dim=-1)
    return {
        "max_abs_err": float(d.abs().max()),
        "max_rel_err": float(d.abs().max() / r.abs().max()),
        "rel_l2": float(d.norm() / r.norm()),
        "cosine": float(cos),
        "min_row_cosine": float(row_cos.min()),
        "nonfinite": nonfinite,
        "ref_max_abs": float(r.abs().max()),
    }


def passes(m: dict[str, float]) -> bool:
    """Return whether one comparison is within the stated bf16 bound."""
    return (m["nonfinite"] == 0 and m["max_rel_err"] <= MAX_REL_ERR
            and m["cosine"] >= MIN_COSINE)


def cmd_run(a: argparse.Namespace) -> None:
    """Run one kernel file over every case and save its outputs (see module docstring)."""
    out_dir = a.out / a.tag
    out_dir.mkdir(parents=True, exist_ok=True)
    status: dict[str, Any] = {"tag": a.tag, "kernel": str(a.kernel), "force_sm12x": a.force_sm12x,
                              "cases": {}}
    t0 = time.time()
    mod = load_kernel_file(a.kernel, f"dsa_kernel_{a.tag.replace('-', '_').replace('.', '_')}")
    status["import_s"] = round(time.time() - t0, 2)
    if hasattr(mod, "_is_sm12x_cuda"):
        status["is_sm12x_cuda_unforced"] = bool(mod._is_sm12x_cuda())
    if a.force_sm12x:
        if not hasattr(mod, "_is_sm12x_cuda"):
            sys.exit(f"{a.kernel} has no _is_sm12x_cuda: not a patched file")
        mod._is_sm12x_cuda = lambda: True  # the SM12x branch, on this GPU
    status["device"] = torch.cuda.get_device_name()
    status["capability"] = list(torch.cuda.get_device_capability())
    for heads in parse_list(a.heads, int):
        for tokens in parse_list(a.tokens, int):
            for invalid in parse_list(a.invalid, float):
                name = case_name(heads, tokens, invalid)
                q, kv, idx = make_inputs(heads, tokens, invalid, a.topk, a.kv_len, a.seed)
                t = time.time()
                try:
                    out = mod.tilelang_sparse_fwd(q.cuda(), kv.cuda(), idx.cuda(), SM_SCALE,
                                                  d_v=D_V)
                    torch.cuda.synchronize()
                    out = out.reshape(tokens, heads, D_V).cpu()
                    torch.save(out, out_dir / f"{name}.pt")
                    status["cases"][name] = {"ok": True, "seconds": round(time.time() - t, 2)}
                except Exception as e:  # record and go on: one failing shape is a result
                    status["cases"][name] = {"ok": False, "seconds": round(time.time() - t, 2),
                                             "error": f"{type(e).__name__}: {e}"[:2000],
                                             "trace": traceback.format_exc()[-3000:]}
                print(a.tag, name, status["cases"][name].get("ok"),
                      status["cases"][name]["seconds"], "s", flush=True)
    status["total_s"] = round(time.time() - t0, 2)
    # several processes (one per head count) may share a tag: one status file each
    (out_dir / f"status_h{a.heads.replace(',', '-')}.json").write_text(json.dumps(status, indent=1))


def cmd_compare(a: argparse.Namespace) -> None:
    """Compare saved outputs with the fp32 reference and upstream; write the results JSON."""
    torch.backends.cuda.matmul.allow_tf32 = False  # an fp32 reference, not TF32
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tags = sorted(p.name for p in a.dir.iterdir() if any(p.glob("status_*.json")))
    status: dict[str, Any] = {}
    for t in tags:
        parts = [json.loads(f.read_text()) for f in sorted((a.dir / t).glob("status_*.json"))]
        status[t] = {"parts": [{k: v for k, v in p.items() if k != "cases"} for p in parts],
                     "cases": {k: v for p in parts for k, v in p["cases"].items()}}
    res: dict[str, Any] = {
        "bound": {"max_rel_err": MAX_REL_ERR, "min_cosine": MIN_COSINE,
                  "max_rel_err_definition": "max|out - ref| / max|ref| over the case's tensor",
                  "cosine_definition": "cosine similarity of the flattened outputs"},
        "setup": {"topk": a.topk, "kv_len": a.kv_len, "seed": a.seed, "d_v": D_V,
                  "d_tail": D_TAIL, "sm_scale": SM_SCALE},
        "status": status, "cases": {},
    }
    for heads in parse_list(a.heads, int):
        for tokens in parse_list(a.tokens, int):
            for invalid in parse_list(a.invalid, float):
                name = case_name(heads, tokens, invalid)
                q, kv, idx = make_inputs(heads, tokens, invalid, a.topk, a.kv_len, a.seed)
                ref = reference(q.to(dev), kv.to(dev), idx.to(dev))
                row: dict[str, Any] = {}
                outs: dict[str, torch.Tensor] = {}
                for t in tags:
                    f = a.dir / t / f"{name}.pt"
                    if not f.exists():
                        row[t] = {"ran": False,
                                  "error": status[t]["cases"].get(name, {}).get("error")}
                        continue
                    outs[t] = torch.load(f).to(dev)
                    m = metrics(outs[t], ref)
                    row[t] = {"ran": True, **m, "pass": passes(m)}
                for t in tags:  # SM12x tile (and controls) against upstream, same release
                    rel = t.split("-")[0]
                    up = f"{rel}-upstream"
                    if t != up and t in outs and up in outs:
                        d = (outs[t].float() - outs[up].float()).abs()
                        row[t]["vs_upstream_max_abs"] = float(d.max())
                        row[t]["vs_upstream_bitwise_equal_frac"] = float(
                            (outs[t] == outs[up]).float().mean())
                res["cases"][name] = row
                print(name, {t: (v.get("pass"), round(v.get("max_rel_err", -1), 5),
                                 round(v.get("cosine", -1), 6)) for t, v in row.items()},
                      flush=True)
    summary: dict[str, Any] = {}
    for t in tags:
        rows = [r[t] for r in res["cases"].values() if t in r]
        ran = [r for r in rows if r.get("ran")]
        summary[t] = {
            "cases": len(rows), "ran": len(ran), "passed": sum(bool(r["pass"]) for r in ran),
            "worst_max_rel_err": max((r["max_rel_err"] for r in ran), default=None),
            "worst_cosine": min((r["cosine"] for r in ran), default=None),
        }
    res["summary"] = summary
    a.json.write_text(json.dumps(res, indent=1))
    print(json.dumps(summary, indent=1))


def main() -> None:
    """Parse arguments and run a sub-command."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "compare"):
        p = sub.add_parser(name)
        p.add_argument("--heads", default="16,32,64,128")
        p.add_argument("--tokens", default="1,64")
        p.add_argument("--invalid", default="0,0.25")
        p.add_argument("--topk", type=int, default=2048)  # DeepSeek-V3.2 index_topk
        p.add_argument("--kv-len", type=int, default=4096)
        p.add_argument("--seed", type=int, default=0)
        if name == "run":
            p.add_argument("--kernel", type=Path, required=True)
            p.add_argument("--tag", required=True, help="RELEASE-NAME, e.g. 0.5.23-upstream")
            p.add_argument("--out", type=Path, required=True)
            p.add_argument("--force-sm12x", action="store_true")
        else:
            p.add_argument("--dir", type=Path, required=True)
            p.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()
    cmd_run(a) if a.cmd == "run" else cmd_compare(a)


if __name__ == "__main__":
    main()
