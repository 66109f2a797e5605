"""The image's launcher restores every rank of a warm autotune cache before the server
starts (issue 37): ``restore_warm_cache`` in ``builder/image/data/sglang-sm120-serve``.

The launcher runs as in the image, in a process of its own, with a folder on
``PYTHONPATH`` holding the distributions' metadata an image has (``sglang`` with our local
label, ``flashinfer-python``) and no ``nvidia-smi`` on ``PATH``; it then execs
``python -m sglang.launch_server``, which fails here (no sglang code): the restore is done
by then.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builder.image.profile import LAUNCHER_SOURCE
from builder.smoke.warm_cache import _fc1_shape

FOLDER = "flashinfer/autotune/0.7.2/sm120/0123456789abcdef"
KEY = {"gpu_name": "NVIDIA RTX PRO 6000 Blackwell", "compute_capability": "12.0",
       "flashinfer_version": "0.7.2", "release": "sglang-0.5.23", "hidden": 1024,
       "experts": 8, "top_k": 2, "intermediate": 256, "tp": 2, "dtype": "bf16"}
ENTRY = "('trtllm::fused_moe::gemm1', 'MoERunner', ((1, 1024), (8, 512, 1024)), ())"


def _rank(tp: int, gpu: str = KEY["gpu_name"]) -> dict[str, object]:
    return {"_metadata": {"gpu": gpu, "flashinfer_version": "0.7.2"}, ENTRY: ["MoERunner", tp]}


def _artifact(path: Path, **change: object) -> Path:
    artifact = {"format": 2, "key": KEY, "folder": FOLDER,
                "ranks": {f"rank_tp{r}_pp0_dp0": _rank(r) for r in (0, 1)}, **change}
    path.write_text(json.dumps(artifact))
    return path


def _launch(tmp_path: Path, artifact: Path, *args: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    for dist, version in (("sglang", "0.5.23+sm120.1"), ("flashinfer_python", "0.7.2")):
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\n"
                                       f"Version: {version}\n")
    env = {**os.environ, "SGLANG_SM120_PROFILE": "none", "PYTHONPATH": str(site),
           "SGLANG_SM120_WARM_CACHE": str(artifact), "SGLANG_CACHE_DIR": str(tmp_path / "c"),
           "PATH": os.path.dirname(sys.executable)}
    env.pop("SGLANG_SM120_DRY_RUN", None)
    return subprocess.run([sys.executable, str(LAUNCHER_SOURCE), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_every_rank_is_restored_where_the_captured_server_kept_it(tmp_path: Path) -> None:
    done = _launch(tmp_path, _artifact(tmp_path / "w.json"), "--tp-size", "2")
    assert "2 of 2 rank file(s) restored" in done.stderr, done.stderr
    # it cannot compute SGLang's hash of this server's model path and flags: it says so
    assert (f"restored to {tmp_path / 'c' / FOLDER} (read only by a server of the captured "
            "model path and flags)") in done.stderr, done.stderr
    for rank in (0, 1):
        path = tmp_path / "c" / FOLDER / f"rank_tp{rank}_pp0_dp0.json"
        assert json.loads(path.read_text()) == _rank(rank)
    # a second start keeps what is there (the server's own tuning wins)
    (tmp_path / "c" / FOLDER / "rank_tp0_pp0_dp0.json").write_text("{}")
    done = _launch(tmp_path, _artifact(tmp_path / "w.json"), "--tp-size", "2")
    assert "0 of 2 rank file(s) restored" in done.stderr, done.stderr
    assert (tmp_path / "c" / FOLDER / "rank_tp0_pp0_dp0.json").read_text() == "{}"


@pytest.mark.parametrize(("args", "change", "message"), [
    (("--tp-size", "1"), {}, "tp: captured 2, running 1"),
    (("--tp", "2"), {"key": {**KEY, "flashinfer_version": "0.6.14"}},
     "flashinfer_version: captured '0.6.14', running '0.7.2'"),
    (("--tp", "2"), {"key": {**KEY, "release": "sglang-0.5.20"}}, "release: captured"),
    (("--tp", "2"), {"ranks": {"rank_tp0_pp0_dp0": _rank(0)}}, "are not every rank of TP 2"),
    (("--tp", "2"), {"ranks": {"rank_tp0_pp0_dp0": _rank(0),
                               "rank_tp1_pp0_dp0": _rank(1, "NVIDIA H200")}},
     "rank_tp1_pp0_dp0's _metadata is another GPU's"),
    (("--tp", "2"), {"folder": "../../etc"}, "not a format-2 artifact with a folder"),
])
def test_an_artifact_of_another_server_is_ignored_with_one_line(
        tmp_path: Path, args: tuple[str, ...], change: dict[str, object], message: str) -> None:
    done = _launch(tmp_path, _artifact(tmp_path / "w.json", **change), *args)
    assert message in done.stderr and "ignored" in done.stderr, done.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(("change", "message"), [
    ({"note": "hand-edited"}, "fields capture never writes ['note']"),
    ({"key": {**KEY, "extra": 1}}, "fields capture never writes ['extra']"),
    ({"ranks": {f"rank_tp{r}_pp0_dp0": {**_rank(r), "('flashinfer::gemm', 'R', ((1, 2),), ())":
                                       ["R", 0]} for r in (0, 1)}},
     "holds 1 of 2 entries not of fused-MoE fc1 weights [8, 512, 1024]"),
    ({"ranks": {f"rank_tp{r}_pp0_dp0": {"_metadata": _rank(r)["_metadata"],
                                       ENTRY.replace("(8, 512", "(8, 1024"): ["R", 0]}
                for r in (0, 1)}}, "holds 1 of 1 entries not of fused-MoE"),
    ({"ranks": {f"rank_tp{r}_pp0_dp0": {"_metadata": _rank(r)["_metadata"]}
                for r in (0, 1)}}, "holds 0 of 0 entries"),
])
def test_content_capture_would_not_keep_is_ignored(
        tmp_path: Path, change: dict[str, object], message: str) -> None:
    # docs/promises.md: the launcher, like restore, writes nothing unless every rank holds
    # only fused-MoE entries of the key's shape; a field capture never writes is unreadable
    done = _launch(tmp_path, _artifact(tmp_path / "w.json", **change), "--tp-size", "2")
    assert message in done.stderr and "ignored" in done.stderr, done.stderr
    assert "restored" not in done.stderr
    assert not (tmp_path / "c").exists()


def _launcher() -> ModuleType:
    """The launcher as a module, without a .pyc beside it in the package's data."""
    loader = importlib.machinery.SourceFileLoader("sglang_sm120_serve", str(LAUNCHER_SOURCE))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name,
                                                                             loader))
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
    return module


_SEEDS = [ENTRY, "('trtllm::fused_moe::gemm2', 'MoERunner', ((8, 1024), (8, 512, 1024), (0,), "
          "(8, 1024, 256), (0,)), (('a', ((1,), (2, 3))),))", "((((((1,),),),),),)", "()",
          "('flashinfer::gemm', 'R', ((1, 2),), ())", "-" * 2000]


@settings(max_examples=400, deadline=None)
@given(seed=st.sampled_from(_SEEDS), cuts=st.lists(
    st.tuples(st.integers(0, 200), st.integers(0, 3), st.sampled_from(list("(),' 0-9ab:"))),
    max_size=4))
def test_the_launchers_entry_rule_is_the_builders(
        seed: str, cuts: list[tuple[int, int, str]]) -> None:
    # the launcher cannot import the builder: its own bounded parser must agree with it
    text = seed
    for at, drop, insert in cuts:
        text = text[:at] + insert + text[at + drop:]
    assert _LAUNCHER._warm_fc1(text) == _fc1_shape(text), text


_LAUNCHER = _launcher()
