"""Benchmark the kernel stage against FlashInfer's own AOT build of the same modules.

Measured in one run on one machine, reported as ratios (never a timed test):

* **cold**: ``python -m builder kernels build`` (preflight, compile, cuobjdump
  check, pack) against FlashInfer's own AOT builder, ``flashinfer.jit.core.build_jit_specs``
  (what ``python -m flashinfer.aot`` calls; its CLI cannot select an exact module set),
  compiling the same JIT specs for the same arch, with the same nvcc, ``CUDA_HOME`` and
  ``MAX_JOBS``, each in a fresh workspace. Goal: ratio ≤ 1.0. CPU busy is the children's
  CPU time over wall time × CPUs (goal ≥ 90 %).
* **warm**: the same command again with unchanged inputs. Goal: no compiler run, < 10 s.

The build environment (venv with FlashInfer, torch, NVIDIA's wheels) is made once before
timing and shared by both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, CPU busy fraction (children, all CPUs), stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{command[:4]} failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu / (wall * len(os.sched_getaffinity(0))), done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="sglang-0.5.9")
    parser.add_argument("--cuda-lane", default="13.0")
    parser.add_argument("--modules", default="norm,activation,sampling")
    parser.add_argument("--build-torch", default="torch==2.13.0")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-kernels-"))
    cache = work / "cache"
    what = ["--target", args.target, "--cuda-lane", args.cuda_lane, "--modules", args.modules,
            "--cache-dir", str(cache)]
    cli = [sys.executable, "-m", "builder", "kernels", "build", *what, "--build-torch",
           args.build_torch, "--json"]
    env = {**os.environ}
    try:
        # Untimed: the build environment, and the request (pins, arch) it resolves.
        request_file = work / "request.json"
        subprocess.run([sys.executable, "-m", "builder", "kernels", "plan", *what,
                        "--output", str(request_file)], check=True, capture_output=True)
        request = json.loads(request_file.read_text())
        warmup = subprocess.run([*cli, "--modules", "page", "--dist", str(work / "warmup")],
                                env=env, capture_output=True, text=True, check=False)
        if warmup.returncode != 0:
            sys.exit(f"warm-up failed:\n{warmup.stderr[-3000:]}")
        venv_python = next(cache.glob("kernel-env/*/venv/bin/python"))
        shutil.rmtree(cache / "kernels")

        ours_wall, ours_busy, out = _timed([*cli, "--dist", str(work / "ours")], env)
        ours = json.loads(out)
        jobs = str(len(os.sched_getaffinity(0)))

        # FlashInfer's own builder over the same specs, same toolchain.
        from builder.kernels.toolchain import PythonEnv, assemble, find_nvcc, local_nvcc

        site = next(cache.glob("kernel-env/*/venv/lib/python3*/site-packages"))
        py_env = PythonEnv(venv_python, site, "bench")
        toolchain = assemble(find_nvcc(local_nvcc(args.cuda_lane), py_env), py_env,
                             work / "cuda")
        names = [m["name"] for m in ours["manifest"]["modules"]]
        script = (
            "import sys\n"
            f"sys.path.insert(0, {str(ROOT / 'builder' / 'data')!r})\n"
            "from flashinfer_aot import specs_for\n"
            "from flashinfer.jit.core import build_jit_specs\n"
            f"specs = {{s.name: s for g in {args.modules.split(',')!r} "
            f"for s in specs_for(g, [128])}}\n"
            f"assert sorted(specs) == {sorted(names)!r}, sorted(specs)\n"
            "build_jit_specs(list(specs.values()), verbose=False, skip_prebuilt=False)\n")
        theirs_env = {**env, "CUDA_HOME": str(toolchain.cuda_home),
                      "FLASHINFER_CUDA_ARCH_LIST": " ".join(request["arch_list"]),
                      "FLASHINFER_WORKSPACE_BASE": str(work / "theirs-ws"), "MAX_JOBS": jobs,
                      "PATH": f"{venv_python.parent}{os.pathsep}{env.get('PATH', '')}"}
        theirs_wall, theirs_busy, _ = _timed([str(venv_python), "-c", script], theirs_env)

        # Warm: unchanged inputs.
        warm_wall, _, out = _timed([*cli, "--dist", str(work / "warm")], env)
        warm = json.loads(out)
        result = {
            "modules": names, "arch_list": request["arch_list"], "cpus": int(jobs),
            "ours_s": round(ours_wall, 1), "flashinfer_build_jit_specs_s": round(theirs_wall, 1),
            "cold_ratio": round(ours_wall / theirs_wall, 3),
            "ours_cpu_busy": round(ours_busy, 3), "flashinfer_cpu_busy": round(theirs_busy, 3),
            "warm_s": round(warm_wall, 2), "warm_cached": warm["cached"],
        }
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"cold: builder {result['ours_s']} s vs FlashInfer build_jit_specs "
                  f"{result['flashinfer_build_jit_specs_s']} s -> ratio {result['cold_ratio']} "
                  f"(goal <= 1.0); CPU busy {ours_busy:.0%} vs {theirs_busy:.0%}")
            print(f"warm: {result['warm_s']} s, cached={warm['cached']} (goal: no compiler, "
                  "< 10 s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
