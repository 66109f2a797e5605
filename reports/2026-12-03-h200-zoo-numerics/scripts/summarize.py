"""Print the README's result tables (markdown) from results/dsa_results.json and moe_results.json.

Usage: python summarize.py RESULTS_DIR   (either file may be missing; its table is then skipped)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def fmt(v: Any, nd: int = 4) -> str:
    """Format a number for a table cell (``-`` for None)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "PASS" if v else "FAIL"
    if isinstance(v, float):
        return f"{v:.{nd}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{nd}f}"
    return str(v)


def dsa_tables(res: dict[str, Any]) -> None:
    """Print the DSA summary (per tag) and per-case tables."""
    b = res["bound"]
    print(f"Bound: max|out-ref|/max|ref| <= {b['max_rel_err']}, cosine >= {b['min_cosine']}.\n")
    print("| kernel | cases run / passed | worst max rel err | worst cosine |")
    print("| --- | --- | --- | --- |")
    for t, s in res["summary"].items():
        print(f"| {t} | {s['ran']}/{s['cases']} run, {s['passed']} passed | "
              f"{fmt(s['worst_max_rel_err'])} | {fmt(s['worst_cosine'], 6)} |")
    tags = list(res["summary"])
    print("\nPer case, max rel err vs fp32 reference (PASS/FAIL); for SM12x rows also the max "
          "|diff| against upstream's output:\n")
    print("| case | " + " | ".join(tags) + " |")
    print("| --- |" + " --- |" * len(tags))
    for name, row in res["cases"].items():
        cells = []
        for t in tags:
            r = row.get(t, {})
            if not r.get("ran"):
                err = f" ({str(r.get('error'))[:60]})" if r.get("error") else ""
                cells.append("not run" + err)
                continue
            c = f"{fmt(r['max_rel_err'])} {fmt(r['pass'])}"
            if "vs_upstream_max_abs" in r:
                c += f", vs up {fmt(r['vs_upstream_max_abs'])}"
            cells.append(c)
        print(f"| {name} | " + " | ".join(cells) + " |")


def moe_tables(res: dict[str, Any]) -> None:
    """Print the MoE table."""
    b = res["bound"]
    print(f"Bound: max|out-ref|/max|ref| <= {b['max_rel_err']}, cosine >= {b['min_cosine']}.\n")
    print("| form, tokens | clamp hit | kernel WITH clamp vs ref with clamp | kernel WITHOUT "
          "clamp vs ref with clamp | kernel WITHOUT clamp vs ref without clamp |")
    print("| --- | --- | --- | --- | --- |")
    def cell(row: dict[str, Any], k: str) -> str:
        r = row[k]
        return f"{fmt(r['max_rel_err'])} / cos {fmt(r['cosine'], 6)} {fmt(r['pass'])}"

    for name, row in res["cases"].items():
        print(f"| {name} | {row['clamp_hit_fraction']:.3f} | "
              f"{cell(row, 'kernel_with_clamp__vs__ref_with_clamp')} | "
              f"{cell(row, 'kernel_without_clamp__vs__ref_with_clamp')} | "
              f"{cell(row, 'kernel_without_clamp__vs__ref_without_clamp')} |")


def main() -> None:
    """Print whichever tables have results."""
    d = Path(sys.argv[1])
    if (d / "dsa_results.json").exists():
        print("### DSA\n")
        dsa_tables(json.loads((d / "dsa_results.json").read_text()))
    if (d / "moe_results.json").exists():
        print("\n### MoE\n")
        moe_tables(json.loads((d / "moe_results.json").read_text()))


if __name__ == "__main__":
    main()
