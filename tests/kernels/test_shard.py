"""One cold kernel build over several machines: ``kernels --shard I/N`` into a shared sccache
backend (a real Redis on 127.0.0.1), then the final build without ``--shard``.

The two "machines" are two shard processes running at once, each in its own mount
namespace (``unshare -m``) with a private folder mounted over ``<cache>/kernels-work``: the
same build path and nothing else shared but the cache and Redis, as on two CI runners.
Real FlashInfer 0.6.3 spec functions, nvcc, sccache and ninja throughout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.core.cache import Cache
from builder.core.errors import BuilderError
from builder.kernels.build import KernelRequest, costs_file, seed_costs
from builder.kernels.shard import Shard, StepCosts, makespan, model_wall_time, partition
from tests.helpers.cli import run_cli
from tests.helpers.kernels import TARGET, TORCH
from tests.helpers.paths import REPO
from tests.helpers.services import need

MODULES = ["--modules", "norm,activation"]  # 5 translation units, 4 modules, ~1 min cold


# --- the split, on its own ---------------------------------------------------------------

def test_shard_parse_and_refusals():
    assert Shard.parse("2/4") == Shard(2, 4) and str(Shard.parse(" 1 / 1 ")) == "1/1"
    for bad in ("0/2", "3/2", "1", "a/b", "1/0", "-1/2"):
        with pytest.raises(BuilderError, match="is not I/N"):
            Shard.parse(bad)


def test_partition_covers_every_step_once_and_balances_by_cost():
    costs = {"moe/a.o": 400.0, "moe/b.o": 300.0, "moe/c.o": 200.0, "x/d.o": 100.0,
             "x/e.o": 100.0, "x/f.o": 100.0}
    shards = partition(list(costs), costs, 2)
    assert sorted(s for shard in shards for s in shard) == sorted(costs)
    loads = sorted(sum(costs[s] for s in shard) for shard in shards)
    assert loads == [600.0, 600.0]
    # The long step measured last by name still goes first (name order would give 6 and 2).
    late = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "z": 4.0}
    assert partition(list(late), late, 2) == [["z"], ["a", "b", "c", "d"]]
    # Same inputs in any order: the same split (every runner computes it alone).
    assert partition(list(reversed(costs)), dict(reversed(costs.items())), 2) == shards
    # More shards than steps: the extra shards are empty, nothing is lost.
    many = partition(["a", "b"], {}, 4)
    assert sorted(s for shard in many for s in shard) == ["a", "b"] and many.count([]) == 2


def test_partition_without_costs_splits_by_count_and_unknown_steps_weigh_the_median():
    steps = [f"m/{i:02}.o" for i in range(10)]
    assert [len(s) for s in partition(steps, {}, 3)] == [4, 3, 3]
    costs = {"m/00.o": 100.0, "m/01.o": 1.0, "m/02.o": 1.0}
    shards = partition(["m/00.o", "m/01.o", "m/02.o", "new.o"], costs, 2)
    assert ["m/00.o"] in shards  # the measured long step alone; the unknown one weighs 1


def test_makespan_and_model():
    assert makespan([4, 3, 3, 2], 2) == 6 and makespan([10, 1], 8) == 10
    assert makespan([], 4) == 0
    compile_costs = {"a": 100.0, "b": 60.0, "c": 40.0, "d": 40.0, "e": 20.0}
    model = model_wall_time(compile_costs, {"l": 1.0}, runners=2, jobs=1)
    assert model == {"shards": 140.0, "link": 1.0, "critical_path": 101.0, "wall": 141.0}
    # Enough runners: the longest step plus the link, no better.
    assert model_wall_time(compile_costs, {"l": 1.0}, 8, 4)["wall"] == 101.0


def test_step_costs_record_merges_and_a_foreign_file_is_refused(tmp_path):
    costs = StepCosts(tmp_path / "c" / "costs.json")
    assert costs.read() == {"steps": {}, "links": {}}
    costs.record({"a.o": 1.5, "a.so": 0.1}, {"a.o"}, jobs=2)
    costs.record({"b.o": 2.0}, {"b.o"}, jobs=4)
    data = costs.read()
    assert data["steps"] == {"a.o": 1.5, "b.o": 2.0} and data["links"] == {"a.so": 0.1}
    assert data["jobs"] == 4
    (tmp_path / "bad.json").write_text('{"steps": [1, 2]}')
    with pytest.raises(BuilderError, match="not a step-costs file"):
        StepCosts(tmp_path / "bad.json").read()


def test_seed_costs_are_the_x2_measurement():
    seed = seed_costs()
    assert len(seed["steps"]) == 152 and max(seed["steps"].values()) > 400
    assert "fused_moe_120/moe_gemm_kernels_fp8_uint4.cuda.o" in seed["steps"]


def test_shard_without_sccache_and_a_bad_shard_are_refused(tmp_path):
    bad = run_cli("kernels", "build", *TARGET, "--shard", "3/2", "--dist",
                  str(tmp_path / "r.json"))
    assert bad.returncode == 2 and "is not I/N" in bad.stderr
    request = tmp_path / "r.json"
    assert run_cli("kernels", "plan", *TARGET, *MODULES, "--output", str(request)).returncode == 0
    alone = run_cli("kernels", "build", "--request", str(request), "--shard", "1/2",
                    "--cache-dir", str(tmp_path / "cache"))
    assert alone.returncode == 2 and "Traceback" not in alone.stderr  # the flags
    assert "a shard without --sccache" in alone.stderr and "add --sccache" in alone.stderr
    assert not (tmp_path / "cache" / "kernel-env").exists()  # refused before any work


# --- the real thing ------------------------------------------------------------------------

def _flush(endpoint: str) -> None:
    host, port = endpoint.removeprefix("redis://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"FLUSHALL\r\n")
        assert conn.recv(16).startswith(b"+OK")


def _kill_marked(marker: str) -> None:
    """Kill the processes started with ``SM120_TEST_MACHINE=marker`` (by their ids)."""
    needle = f"SM120_TEST_MACHINE={marker}\0".encode()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and needle in (proc / "environ").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            continue


def _start_shard(shard: str, cache: Path, request: Path, env: dict[str, str],
                 private: Path, log: Path) -> subprocess.Popen[str]:
    """A shard on its own "machine": a mount namespace where ``<cache>/kernels-work`` is a
    private folder (same path as everywhere, nothing shared but the cache and Redis)."""
    unshare = need("unshare", "util-linux")
    work = cache / "kernels-work"
    work.mkdir(parents=True, exist_ok=True)
    private.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "builder", "kernels", "build", "--request", str(request),
               *TORCH, "--sccache", "--shard", shard, "--jobs", "1",
               "--cache-dir", str(cache), "--json", "--progress"]
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    return subprocess.Popen([unshare, "--mount", "sh", "-c", script, "sh", str(private),
                             str(work), *command], cwd=REPO,
                            env={**os.environ, **env, "SM120_TEST_MACHINE": str(private)},
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                            start_new_session=True)


def _final(cache: Path, request: Path, dist: Path, env: dict[str, str]) -> dict:
    done = run_cli("kernels", "build", "--request", str(request), *TORCH,
                   "--sccache", "--cache-dir", str(cache), "--dist", str(dist), "--json",
                   env=env)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    result: dict = json.loads(done.stdout)
    return result


def _private_cache(shared: Path, root: Path) -> Path:
    """A cache of this test's own for the kernel entries, build folders and step costs (the
    other kernel tests empty the shared one's ``kernels``), borrowing the shared one's
    build environments and upstream sources."""
    for name in ("kernel-env", "downloads", "source", "wheelhouse"):
        (shared / name).mkdir(parents=True, exist_ok=True)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(shared / name)
    return root


@pytest.mark.slow(reason="starts redis-server")
def test_two_shards_then_the_final_build_gets_every_object_and_the_unsharded_bytes(
        kernel_cache, redis_server, tmp_path):
    """Shards 1/2 and 2/2 at once on two "machines", then the final build: 0 misses, and its
    wheel is byte-identical to an unsharded cold build's. Then shard 2 dies mid-compile: the
    final build compiles what it left out and still ships the same bytes."""
    env = {"SCCACHE_REDIS_ENDPOINT": redis_server, "SCCACHE_BUCKET": ""}
    kernel_cache = _private_cache(kernel_cache, tmp_path / "cache")
    request = tmp_path / "request.json"
    saved = run_cli("kernels", "plan", *TARGET, *MODULES, "--output", str(request),
                    "--cache-dir", str(kernel_cache))
    assert saved.returncode == 0, saved.stderr
    shutil.rmtree(kernel_cache / "kernels", ignore_errors=True)
    _flush(redis_server)

    # 1. Two shards at once, then the final build.
    shards = [_start_shard(f"{i}/2", kernel_cache, request, env, tmp_path / f"m{i}",
                           tmp_path / f"shard{i}.log") for i in (1, 2)]
    results = []
    for index, process in enumerate(shards, 1):
        out, _ = process.communicate(timeout=1800)
        assert process.returncode == 0, (tmp_path / f"shard{index}.log").read_text()[-3000:]
        results.append(json.loads(out))
    steps = [set(r["steps"]) for r in results]
    assert steps[0] and steps[1] and not steps[0] & steps[1]
    assert len(steps[0] | steps[1]) == results[0]["total_steps"] == 5
    # sccache counts nvcc's sub-steps (cicc, ptxas ...) as hits and misses of their own
    assert all(r["sccache"]["compile_requests"] == len(r["steps"]) for r in results), results
    assert all(r["sccache"]["misses"] > 0 and r["sccache"]["hits"] == 0 for r in results)
    assert not list(kernel_cache.glob("kernels/*/*.whl"))  # a shard writes no wheel
    recorded = costs_file(Cache(kernel_cache),
                          KernelRequest.from_json(json.loads(request.read_text())))
    costs = json.loads(recorded.read_text())
    assert set(costs["steps"]) >= steps[0] | steps[1]  # both shards recorded their times
    sharded = _final(kernel_cache, request, tmp_path / "sharded", env)
    assert sharded["cached"] is False
    stats = sharded["sccache"]
    assert stats["misses"] == 0 and stats["hits"] > 0 and stats["errors"] == 0, stats
    assert json.loads(recorded.read_text()) == costs  # hits are no compile's cost

    # 2. The same request unsharded, cold (an empty backend, a fresh cache entry).
    shutil.rmtree(kernel_cache / "kernels")
    _flush(redis_server)
    unsharded = _final(kernel_cache, request, tmp_path / "unsharded", env)
    cold = unsharded["sccache"]["misses"]
    assert cold > 0 and unsharded["sccache"]["hits"] == 0
    wheel = Path(sharded["wheel"]).name
    assert Path(unsharded["wheel"]).name == wheel
    assert (tmp_path / "sharded" / wheel).read_bytes() == \
        (tmp_path / "unsharded" / wheel).read_bytes()

    # 3. Shard 2 dies (SIGKILL) while compiling: the final build compiles the rest.
    shutil.rmtree(kernel_cache / "kernels")
    _flush(redis_server)
    dying = _start_shard("2/2", kernel_cache, request, env, tmp_path / "m3",
                         tmp_path / "dying.log")
    deadline = time.monotonic() + 600
    # ninja -v prints a step's command as it starts it: kill during the first compile.
    # (the listing before it runs no ninja step, so "[1/" is the shard's first compile)
    while "[1/" not in (tmp_path / "dying.log").read_text():
        assert dying.poll() is None and time.monotonic() < deadline, \
            (tmp_path / "dying.log").read_text()[-2000:]
        time.sleep(0.5)
    os.killpg(dying.pid, signal.SIGKILL)
    dying.wait()
    _kill_marked(str(tmp_path / "m3"))  # its sccache server, which left the group
    survivor = _start_shard("1/2", kernel_cache, request, env, tmp_path / "m4",
                            tmp_path / "survivor.log")
    out, _ = survivor.communicate(timeout=1800)
    assert survivor.returncode == 0, (tmp_path / "survivor.log").read_text()[-3000:]
    survived = set(json.loads(out)["steps"])
    assert survived and len(survived) < 5  # (the split follows the costs stage 2 recorded)
    recovered = _final(kernel_cache, request, tmp_path / "recovered", env)
    stats = recovered["sccache"]
    assert 0 < stats["misses"] < cold and stats["hits"] > 0, stats  # only what was left
    assert (tmp_path / "recovered" / wheel).read_bytes() == \
        (tmp_path / "unsharded" / wheel).read_bytes()
