"""The warm autotune cache's key and refusal rules (:mod:`builder.smoke.warm_cache`), on the
autotune file FlashInfer 0.6.14 wrote on the lent H200 (``reports/2026-12-01-h200-moe-shapes/``:
five bf16 MoE shapes in one file).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from builder.core.errors import ConfigurationError
from builder.smoke.warm_cache import (
    WarmCacheKey,
    capture,
    capture_ranks,
    restore,
    write_artifact,
)
from tests.helpers.paths import REPO

H200_FILE = (REPO / "reports" / "2026-12-01-h200-moe-shapes"
             / "autotune-cache-pass2.json")
KEY = WarmCacheKey(gpu_name="NVIDIA H200", compute_capability="9.0",
                   flashinfer_version="0.6.14", release="sglang-0.5.16", hidden=7168,
                   experts=256, top_k=8, intermediate=256, tp=8, dtype="bf16")


def test_capture_keeps_only_the_keys_shape(tmp_path: Path) -> None:
    artifact = capture(H200_FILE, KEY)
    assert list(artifact["ranks"]) == ["rank_tp0_pp0_dp0"]
    entries = [k for k in artifact["ranks"]["rank_tp0_pp0_dp0"] if k != "_metadata"]
    # 2 GEMMs x 5 token buckets for deepseek-v3-tp8, out of the file's 5 shapes.
    source = json.loads(H200_FILE.read_text())
    assert len(source) - 1 == 50
    assert len(entries) == 10
    assert all("(256, 512, 7168)" in k for k in entries)
    assert artifact["key"]["dtype"] == "bf16"
    write_artifact(artifact, tmp_path / "warm.json")
    assert json.loads((tmp_path / "warm.json").read_text()) == artifact


@pytest.mark.parametrize(("change", "message"), [
    ({"gpu_name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"},
     "was written with gpu 'NVIDIA H200'"),
    ({"flashinfer_version": "0.6.18"}, "was written with flashinfer_version '0.6.14'"),
    ({"hidden": 6144, "intermediate": 128}, "no fused-MoE entry for fc1 weights [256, 256, 6144]"),
])
def test_capture_refuses_a_file_from_elsewhere(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[")) as info:
        capture(H200_FILE, dataclasses.replace(KEY, **change))  # type: ignore[arg-type]
    assert info.value.exit_status == 2


def test_restore_writes_the_file_for_the_same_key(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    write_artifact(capture(H200_FILE, KEY), tmp_path / "warm.json")
    with caplog.at_level(logging.WARNING, logger="builder.smoke.warm_cache"):
        assert restore(tmp_path / "warm.json", KEY, tmp_path / "out" / "cache.json")
    assert caplog.records == []
    written = json.loads((tmp_path / "out" / "cache.json").read_text())
    assert written["_metadata"]["gpu"] == "NVIDIA H200" and len(written) == 11


@pytest.mark.parametrize("change", [
    {"dtype": "fp8"},  # FlashInfer's own keys would collide: the H200 fp8 run crashed on them
    {"tp": 4}, {"release": "sglang-0.5.17"}, {"compute_capability": "12.0"},
    {"gpu_name": "NVIDIA GeForce RTX 5090"}, {"flashinfer_version": "0.6.15"},
    {"top_k": 6}, {"experts": 128}, {"hidden": 6144}, {"intermediate": 512},
])
def test_restore_ignores_another_key_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, change: dict[str, object]) -> None:
    write_artifact(capture(H200_FILE, KEY), tmp_path / "warm.json")
    running = dataclasses.replace(KEY, **change)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="builder.smoke.warm_cache"):
        assert not restore(tmp_path / "warm.json", running, tmp_path / "cache.json")
    assert len(caplog.records) == 1
    (field,) = change
    assert f"{field}: captured" in caplog.records[0].getMessage()
    assert not (tmp_path / "cache.json").exists()


@pytest.mark.parametrize("text", ["{not json", '{"format": 1}', "[]",
                                  '{"format": 2, "key": {"gpu_name": "x"}}'])
def test_restore_ignores_a_broken_artifact_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str) -> None:
    (tmp_path / "warm.json").write_text(text)
    with caplog.at_level(logging.WARNING, logger="builder.smoke.warm_cache"):
        assert not restore(tmp_path / "warm.json", KEY, tmp_path / "cache.json")
    assert len(caplog.records) == 1 and "unreadable" in caplog.records[0].getMessage()
    assert not (tmp_path / "cache.json").exists()


@pytest.mark.parametrize(("data", "message"), [
    ({**dataclasses.asdict(KEY), "dtype": "int4"}, "dtype 'int4' is not one of"),
    ({**dataclasses.asdict(KEY), "tp": "8"}, "tp must be a positive integer"),
    ({**dataclasses.asdict(KEY), "tp": 0}, "tp must be a positive integer"),
    ({**dataclasses.asdict(KEY), "compute_capability": "sm90"}, "is not major.minor"),
    ({k: v for k, v in dataclasses.asdict(KEY).items() if k != "release"},
     r"missing \['release'\]"),
])
def test_key_fields_are_checked(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        WarmCacheKey.from_mapping(data)
    assert WarmCacheKey.from_mapping(dataclasses.asdict(KEY)) == KEY


def _artifact(tmp_path: Path, cache: dict[str, object]) -> Path:
    """An artifact whose key is :data:`KEY` and whose file is ``cache`` (a hand edit)."""
    artifact = capture(H200_FILE, KEY)
    artifact["ranks"] = {"rank_tp0_pp0_dp0": cache}
    write_artifact(artifact, tmp_path / "warm.json")
    return tmp_path / "warm.json"


_OURS = capture(H200_FILE, KEY)["ranks"]["rank_tp0_pp0_dp0"]
_OTHER_SHAPE = next(k for k in json.loads(H200_FILE.read_text())
                    if k != "_metadata" and "(256, 512, 7168)" not in k)


@pytest.mark.parametrize(("cache", "message"), [
    ({**_OURS, "_metadata": {**_OURS["_metadata"], "gpu": "NVIDIA GeForce RTX 5090"}},
     "was written with gpu 'NVIDIA GeForce RTX 5090'"),
    ({**_OURS, "_metadata": {**_OURS["_metadata"], "flashinfer_version": "0.6.3"}},
     "was written with flashinfer_version '0.6.3'"),
    ({"_metadata": _OURS["_metadata"], _OTHER_SHAPE: ["MoERunner", 3]},
     "holds 1 entries not of fused-MoE fc1 weights [256, 512, 7168]"),
    ({**_OURS, _OTHER_SHAPE: ["MoERunner", 3]}, "holds 1 entries not of"),
    ({k: v for k, v in _OURS.items() if k != "_metadata"}, "has no _metadata"),
])
def test_restore_rechecks_the_content_not_only_the_key(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, cache: dict[str, object],
        message: str) -> None:
    # Issue 38 class B: the key field equals the running key, the file is another GPU's,
    # FlashInfer's or shape's; capture would refuse it, so restore does too.
    with caplog.at_level(logging.WARNING, logger="builder.smoke.warm_cache"):
        assert not restore(_artifact(tmp_path, cache), KEY, tmp_path / "cache.json")
    assert len(caplog.records) == 1 and message in caplog.records[0].getMessage()
    assert not (tmp_path / "cache.json").exists()


@pytest.mark.parametrize("hostile", [
    "-" * 100_000 + "1",  # ast.literal_eval: MemoryError from the compiler
    "(" * 150 + ")" * 150,
    "('trtllm::fused_moe::gemm1', 'MoERunner', ((1, 7168), (256, 512, 7168)), ())" + " " * 2000,
    "('trtllm::fused_moe::gemm1', 'MoERunner', ((1, 7168), (256, 512, 7168),), (((((1,),),),),))",
    "('trtllm::fused_moe::gemm1', 'MoERunner', ((1, 7168), (256, 512, __import__)), ())",
    "('trtllm::fused_moe::gemm1', 'MoERunner', ((1, 7168), (256, 512, 7168)), ()",
], ids=["minus-signs", "nested", "over-long", "over-deep", "a-name", "unclosed"])
def test_capture_skips_hostile_entry_keys_with_bounded_work(tmp_path: Path,
                                                             hostile: str) -> None:
    data = json.loads(H200_FILE.read_text())
    data[hostile] = ["MoERunner", 0]
    (tmp_path / "file.json").write_text(json.dumps(data))
    content = capture(tmp_path / "file.json", KEY)["ranks"]["rank_tp0_pp0_dp0"]
    assert hostile not in content
    assert len(content) == 11


def _two_ranks(tmp_path: Path) -> dict[str, Path]:
    files = {}
    for rank in (0, 1):
        files[f"rank_tp{rank}_pp0_dp0"] = tmp_path / f"rank_tp{rank}_pp0_dp0.json"
        files[f"rank_tp{rank}_pp0_dp0"].write_bytes(H200_FILE.read_bytes())
    return files


def test_every_rank_is_captured_and_restored_all_or_none(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Issue 37: one artifact holds every rank of a run; restore writes every rank the
    # server runs, or none (0.5.23 drops all ranks' files when they disagree).
    key = dataclasses.replace(KEY, tp=2)
    folder = "flashinfer/autotune/0.6.14/sm90/d4e4eb6f01a747dc"
    write_artifact(capture_ranks(_two_ranks(tmp_path), key, folder), tmp_path / "warm.json")
    dests = {f"rank_tp{r}_pp0_dp0": tmp_path / "srv" / f"rank_tp{r}_pp0_dp0.json"
             for r in (0, 1)}
    assert restore(tmp_path / "warm.json", key, dests)
    assert all(len(json.loads(p.read_text())) == 11 for p in dests.values())
    wider = {**dests, "rank_tp2_pp0_dp0": tmp_path / "srv4" / "rank_tp2_pp0_dp0.json"}
    with caplog.at_level(logging.WARNING, logger="builder.smoke.warm_cache"):
        assert not restore(tmp_path / "warm.json", key, wider)
    assert "runs ranks it does not hold (rank_tp2_pp0_dp0" in caplog.records[0].getMessage()
    assert not (tmp_path / "srv4").exists()


def test_a_rank_outside_the_keys_tp_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="'rank_tp1_pp0_dp0' is not a rank of a TP 1"):
        capture_ranks(_two_ranks(tmp_path), dataclasses.replace(KEY, tp=1), None)
