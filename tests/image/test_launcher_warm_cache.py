"""The image's launcher restores every rank of a warm autotune cache before the server
starts (issue 37): ``restore_warm_cache`` in ``builder/image/data/sglang-sm120-serve``.

The launcher runs as in the image, in a process of its own, with a folder on
``PYTHONPATH`` holding the distributions' metadata an image has (``sglang`` with our local
label, ``flashinfer-python``) and no ``nvidia-smi`` on ``PATH``; it then execs
``python -m sglang.launch_server``, which fails here (no sglang code): the restore is done
by then.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.image.profile import LAUNCHER_SOURCE

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
