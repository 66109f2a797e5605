"""CPU checks of the comparison harness before any device time is spent.

1. ``dsa_numerics.reference`` equals a per-(token, head) loop written independently;
2. the bf16-rounded reference PASSES the stated bound, and the reference with a doubled
   softmax scale or with rows of the wrong token (the two controls' bugs) FAILS it;
3. ``moe_numerics.reference_moe`` with the clamp differs from it without the clamp by more
   than the bound (inputs large enough to hit the limit), and its bf16 rounding passes;
4. each kernel file in CARRY/dsa/kernels imports standalone with the sglang stubs (needs
   tilelang importable: it is, on CPU) and the patched ones have ``_tilelang_sparse_fwd_sm12x``.

Usage: python selftest_cpu.py [--kernels CARRY/dsa/kernels]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dsa_numerics as dn
import moe_numerics as mn


def main() -> None:
    """Run the checks; exit 1 on the first one that does not hold."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=Path)
    a = ap.parse_args()
    bad = 0

    def check(ok: bool, what: str) -> None:
        nonlocal bad
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        bad += not ok

    q, kv, idx = dn.make_inputs(32, 3, 0.25, 256, 1024, 0)
    ref = dn.reference(q, kv, idx)
    loop = torch.empty_like(ref)
    for t in range(q.shape[0]):
        ids = [int(i) for i in idx[t, 0] if i >= 0]
        k = kv[ids, 0, :].float()
        for h in range(q.shape[1]):
            p = torch.softmax(k @ q[t, h].float() * dn.SM_SCALE, dim=0)
            loop[t, h] = p @ k[:, : dn.D_V]
    check(torch.allclose(ref, loop, atol=1e-5, rtol=1e-5), "dsa reference == loop")
    m = dn.metrics(ref.to(torch.bfloat16), ref)
    check(dn.passes(m), f"dsa bf16(ref) passes: {m}")
    m = dn.metrics(dn.reference(q, kv, idx, dn.SM_SCALE * 2), ref)
    check(not dn.passes(m), f"dsa scale x2 fails: {m}")
    # the rowsplit control: row t*groups+g gets token (t*groups+g) % tokens's indices
    groups = 2
    wrong = torch.empty_like(ref)
    for t in range(q.shape[0]):
        for g in range(groups):
            r = t * groups + g
            hs = slice(g * 16, (g + 1) * 16)
            wrong[t, hs] = dn.reference(q[t : t + 1, hs], kv, idx[r % q.shape[0]][None])[0]
    m = dn.metrics(wrong, ref)
    check(not dn.passes(m), f"dsa wrong rows fails: {m}")

    x, w13, w2, ids, sc = mn.make_inputs(16, 256, 128, 8, 2, 0, scale=mn.INPUT_SCALE)
    ref_c = mn.reference_moe(x, w13, w2, ids, sc, mn.GPT_OSS)
    ref_n = mn.reference_moe(x, w13, w2, ids, sc, None)
    m = mn.metrics(ref_n, ref_c)
    check(not mn.passes(m), f"moe unclamped vs clamped reference differs: {m}")
    frac = mn.clamp_hit_fraction(x, w13, ids, mn.GPT_OSS)
    check(frac > 0.01, f"moe inputs hit the clamp: {frac}")
    m = mn.metrics(ref_c.to(torch.bfloat16), ref_c)
    check(mn.passes(m), f"moe bf16(ref) passes: {m}")

    if a.kernels:
        for f in sorted(a.kernels.glob("*/*.py")):
            mod = dn.load_kernel_file(f, "k_" + f.parent.name.replace(".", "_") + "_" + f.stem)
            has = hasattr(mod, "_tilelang_sparse_fwd_sm12x")
            check(has == (f.stem != "upstream"), f"{f}: imports, sm12x function {has}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
