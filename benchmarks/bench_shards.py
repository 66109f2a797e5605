"""Benchmark one cold kernel build unsharded against the same build in two shards.

Measured in one run on this machine, as a ratio (never a timed test), with a real Redis
(Debian's ``redis-server``) on 127.0.0.1 as the shared sccache backend, flushed before
each side:

* **unsharded**: ``python -m builder kernels build --sccache`` (every core).
* **sharded**: ``--shard 1/2`` and ``--shard 2/2`` at once, each with ``--jobs`` half the
  cores and in its own mount namespace with a private build folder (two "runners"), then
  the final ``kernels --sccache`` (links, checks, packs: every object a cache hit).

Ratio = sharded wall (shards + final) / unsharded wall; on one machine the shards share the
same cores, so it measures the overhead of sharding (a second FlashInfer graph listing,
the final job), not the gain on N machines (``model_shards.py`` models that). The wheels
of both sides must be byte-identical. **CPU busy** is machine-wide (``/proc/stat``, all
processes: on a shared machine other work counts too) during the unsharded compile, and
the job-slot occupancy (the step times ninja logged, over wall time x jobs).
Needs root (``unshare --mount``) and ``redis-server``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _stat() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def _busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    return (after[0] - before[0]) / max(1, after[1] - before[1])


def _flush(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"FLUSHALL\r\n")
        if not conn.recv(16).startswith(b"+OK"):
            sys.exit("redis did not flush")


def _run(command: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False,
                          cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"{command[3:8]} failed:\n{done.stderr[-3000:]}")
    result: dict = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="sglang-0.5.9")
    parser.add_argument("--cuda-lane", default="13.0")
    parser.add_argument("--modules", default="norm,activation,page,rope")
    parser.add_argument("--build-torch", default="torch==2.13.0")
    parser.add_argument("--borrow", type=Path, default=None, metavar="CACHE",
                        help="use this cache's build environments and upstream sources "
                             "(links in a fresh cache; default: make them there, untimed)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-shards-"))
    cache = work / "cache"
    for name in ("kernel-env", "downloads", "source", "wheelhouse") if args.borrow else ():
        cache.mkdir(exist_ok=True)
        (cache / name).symlink_to(args.borrow.resolve() / name)
    cpus = len(os.sched_getaffinity(0))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--bind",
                              "127.0.0.1", "--port", str(port), "--save", "",
                              "--appendonly", "no", "--dir", str(work)],
                             stdout=subprocess.DEVNULL)
    env = {**os.environ, "SCCACHE_REDIS_ENDPOINT": f"redis://127.0.0.1:{port}",
           "SCCACHE_BUCKET": "", "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "builder", "kernels", "build", "--build-torch",
            args.build_torch, "--sccache", "--cache-dir", str(cache), "--json"]
    try:
        time.sleep(1)
        request = work / "request.json"
        subprocess.run([sys.executable, "-m", "builder", "kernels", "plan", "--target",
                        args.target, "--cuda-lane", args.cuda_lane, "--modules", args.modules,
                        "--output", str(request), "--cache-dir", str(cache)],
                       check=True, capture_output=True, env=env, cwd=ROOT)
        base += ["--request", str(request)]
        # Untimed: the build environment (a one-module build, no sccache).
        _run([sys.executable, "-m", "builder", "kernels", "build", "--target", args.target,
              "--cuda-lane", args.cuda_lane, "--modules", "page", "--build-torch",
              args.build_torch, "--cache-dir", str(cache), "--dist",
              str(work / "warmup"), "--json"], env)

        def clean() -> None:
            shutil.rmtree(cache / "kernels", ignore_errors=True)
            _flush(port)

        clean()
        before, start = _stat(), time.monotonic()
        unsharded = _run([*base, "--dist", str(work / "unsharded")], env)
        unsharded_wall, busy = time.monotonic() - start, _busy(before, _stat())
        costs = json.loads(Path(unsharded["step_costs"]).read_text())
        occupancy = sum(costs["steps"].values()) / (unsharded["compile_seconds"] * cpus)

        clean()
        half = str(max(1, cpus // 2))
        start = time.monotonic()
        shards = []
        for index in (1, 2):
            private = work / f"runner{index}"
            private.mkdir()
            (cache / "kernels-work").mkdir(parents=True, exist_ok=True)
            shards.append(subprocess.Popen(
                ["unshare", "--mount", "sh", "-c", 'mount --bind "$1" "$2" && shift 2 && '
                 'exec "$@"', "sh", str(private), str(cache / "kernels-work"), *base,
                 "--shard", f"{index}/2", "--jobs", half], env=env, cwd=ROOT,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        shard_results = []
        for process in shards:
            out, _ = process.communicate()
            if process.returncode != 0:
                sys.exit("a shard failed")
            shard_results.append(json.loads(out))
        shards_wall = time.monotonic() - start
        final = _run([*base, "--dist", str(work / "sharded")], env)
        sharded_wall = time.monotonic() - start
        name = Path(final["wheel"]).name
        identical = (work / "sharded" / name).read_bytes() == \
            (work / "unsharded" / name).read_bytes()
        result = {
            "modules": args.modules, "cpus": cpus, "load_average": os.getloadavg(),
            "unsharded_s": round(unsharded_wall, 1), "shards_s": round(shards_wall, 1),
            "final_s": round(sharded_wall - shards_wall, 1),
            "sharded_s": round(sharded_wall, 1),
            "ratio_sharded_over_unsharded": round(sharded_wall / unsharded_wall, 2),
            "final_sccache": final["sccache"],
            "shard_steps": [len(r["steps"]) for r in shard_results],
            "wheels_identical": identical,
            "cpu_busy_machine_wide": round(busy, 3),
            "job_slot_occupancy": round(occupancy, 3)}
        print(json.dumps(result, indent=1) if args.json else "\n".join(
            f"{k}: {v}" for k, v in result.items()))
        if not identical or final["sccache"]["misses"] != 0:
            sys.exit("FAILED: the sharded wheel differs or the final build missed the cache")
    finally:
        redis.terminate()
        redis.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
