"""Summarise the device run's state folder (argument) as one JSON object on stdout."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _busy(folder: Path, name: str) -> float | None:
    """CPU busy fraction between the two /proc/stat lines around a build."""
    try:
        a, b = ([int(v) for v in (folder / f"{name}.stat{i}").read_text().split()[1:]]
                for i in (0, 1))
    except (OSError, ValueError):
        return None
    d = [y - x for x, y in zip(a, b, strict=True)]
    idle = d[3] + d[4]
    return round(1 - idle / sum(d), 3) if sum(d) else None


def build(folder: Path, name: str) -> dict[str, Any]:
    """One build's time, step costs, bound and manifest facts."""
    row: dict[str, Any] = {}
    for what, suffix in (("time", ".time"), ("result", ".json")):
        try:
            row[what] = json.loads((folder / f"{name}{suffix}").read_text())
        except (OSError, ValueError):
            row[what] = None
    result = row.pop("result") or {}
    manifest = result.get("manifest") or {}
    row["wheel_sha256"] = result.get("sha256")
    row["compile_seconds"] = result.get("compile_seconds")
    row["moe_variants"] = manifest.get("moe_variants")
    row["modules"] = [m["name"] for m in manifest.get("modules", [])]
    row["pruned"] = {m["name"]: m["pruned"] for m in manifest.get("modules", [])
                     if m.get("pruned")}
    try:
        costs = json.loads((folder / f"costs-{name}.json").read_text())
    except (OSError, ValueError):
        costs = {}
    steps = costs.get("steps", {})
    if steps:
        work = sum(steps.values())
        longest = max(steps, key=steps.get)
        jobs = costs.get("jobs", 16)
        bound = max(steps[longest], work / jobs)
        row.update({"compile_steps": len(steps), "work_seconds": round(work, 1),
                    "longest_step": [longest, steps[longest]], "jobs": jobs,
                    "bound_seconds": round(bound, 1),
                    "top_steps": sorted(steps.items(), key=lambda kv: -kv[1])[:8]})
        if row.get("time") and row["time"].get("seconds"):
            row["ratio_to_bound"] = round(row["time"]["seconds"] / bound, 3)
    row["cpu_busy"] = _busy(folder, name)
    return row


def main() -> None:
    """Print the summary."""
    folder = Path(sys.argv[1])
    out: dict[str, Any] = {"machine": (folder / "machine.txt").read_text()
                           if (folder / "machine.txt").exists() else None}
    for name in ("a", "b", "c"):
        out[name] = build(folder, name)
    for name in ("a", "b", "c"):
        path = folder / f"nm-{name}.txt"
        if path.exists():
            lines = path.read_text().splitlines()
            out[f"undefined_tensorrt_llm_symbols_{name}"] = len(lines)
            out[f"undefined_runner_symbols_{name}"] = [
                line for line in lines
                if "MoeGemmRunner<" in line or "cutlass_kernels_oss::" in line]
    if (folder / "nm-a.txt").exists() and (folder / "nm-b.txt").exists():
        a = set((folder / "nm-a.txt").read_text().splitlines())
        b = set((folder / "nm-b.txt").read_text().splitlines())
        out["undefined_in_pruned_not_in_full"] = sorted(a - b)
    try:
        out["call_c"] = json.loads((folder / "call-c.json").read_text())
    except (OSError, ValueError):
        out["call_c"] = None
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
