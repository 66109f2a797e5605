"""Smoke check 7 (builder/smoke/parallel.py): each leg is a real server process
(fake_sglang_server.py, which takes --tp-size/--ep-size and can plant a different token for
one leg), started, asked for token ids greedily and stopped by check 6's orchestration."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from builder.smoke.gpu import PROMPT_IDS, CheckResult, SmokeOptions, SmokeReport
from builder.smoke.gpu.serving import ServedModel, parallel_check, server_check
from builder.smoke.parallel import LEGS, PARALLEL_ENV, ParallelOutcome, run_parallel_check
from builder.smoke.server import server_env
from builder.smoke.shared import ProbeCheck
from tests.helpers.cli import run_cli
from tests.helpers.paths import TESTS
from tests.helpers.processes import left_over

FAKE = TESTS / "helpers" / "fake_sglang_server.py"


def _run(tmp_path: Path, gpus: int, *, experts: int | None = 8,
         **env: str) -> ParallelOutcome:
    def command(port: int, leg: tuple[str, ...]) -> tuple[str, ...]:
        pids = tmp_path / f"pids-tp{leg[1]}-ep{leg[3]}.json"
        return (sys.executable, str(FAKE), "--port", str(port), "--pid-file", str(pids),
                "--mode", "ok", "--skip-tokenizer-init", *leg)

    return run_parallel_check(command, gpus=gpus, experts=experts,
                              env={"FLASHINFER_DISABLE_JIT": "1", **server_env(tmp_path), **env},
                              prompt_ids=PROMPT_IDS, ready_timeout=30.0, stop_grace=5.0)


def _servers(tmp_path: Path) -> dict[str, dict[str, object]]:
    """What each started server recorded, by leg (``tp1-ep1``), after checking it is gone."""
    found = {}
    for path in sorted(tmp_path.glob("pids-*[0-9].json")):
        pids = json.loads(path.read_text())
        for pid in (pids["server"], pids["child"]):
            left = left_over(pid)
            assert left is None, f"process {pid} of {path.name} is left ({left})"
        found[path.stem.removeprefix("pids-")] = json.loads(
            path.with_suffix(".leg.json").read_text())
    return found


def test_three_legs_that_agree_pass(tmp_path: Path) -> None:
    result = _run(tmp_path, gpus=2)
    assert result.status == "passed", result.detail
    assert result.detail == "TP 1, TP 2 EP 1, TP 2 EP 2 returned the same 16 token ids"
    legs = result.data["legs"]
    assert [leg["leg"] for leg in legs] == ["TP 1", "TP 2 EP 1", "TP 2 EP 2"]
    assert all(leg["output_ids"] == list(range(7, 23)) for leg in legs)
    assert legs[0]["top_logprobs"][0] == [[-0.25, 7], [-0.75, 8]]
    servers = _servers(tmp_path)
    assert {name: (s["tp"], s["ep"]) for name, s in servers.items()} == {
        "tp1-ep1": (1, 1), "tp2-ep1": (2, 1), "tp2-ep2": (2, 2)}


def test_a_planted_difference_at_ep_2_fails_naming_the_leg_and_position(
        tmp_path: Path) -> None:
    result = _run(tmp_path, gpus=2, FAKE_SGLANG_DIFFER="2,2,5")
    assert result.status == "failed"
    assert result.detail == ("TP 2 EP 2 differs from TP 1 at position 5: token 13 instead of "
                             "12 (TP 1's top-2 logprob margin there: 0.5; near 0 is bf16 "
                             "noise, large is a fault)")
    assert result.data["first_difference"] == {"leg": "TP 2 EP 2", "position": 5,
                                               "reference": 12, "got": 13,
                                               "reference_top2_margin": 0.5}
    assert len(_servers(tmp_path)) == 3


def test_one_gpu_runs_tp_1_and_reports_the_tp_2_legs_not_run(tmp_path: Path) -> None:
    result = _run(tmp_path, gpus=1)
    assert result.status == "not-run"
    assert result.detail == ("TP 1 returned 16 token ids, nothing to compare them with; "
                             "TP 2 EP 1 not run: TP 2 "
                             "needs 2 GPUs, 1 visible; TP 2 EP 2 not run: TP 2 needs 2 GPUs, "
                             "1 visible")
    assert result.data["legs"][0]["output_ids"] == list(range(7, 23))
    assert [leg["status"] for leg in result.data["legs"][1:]] == ["not-run", "not-run"]
    assert list(_servers(tmp_path)) == ["tp1-ep1"]
    # A report that asked for check 7 fails with it, whatever else passed.
    passed = tuple(CheckResult(name, "passed", "") for name in
                   ("runner", "sglang", "lockstep", "kernels"))
    assert SmokeReport("host", passed).passed
    asked = CheckResult.from_json({"name": "parallel", "status": result.status,
                                   "required": True, "detail": result.detail,
                                   "data": result.data})
    assert not SmokeReport("host", (*passed, asked)).passed


def test_multicast_stays_off_in_every_server_whatever_the_caller_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    result = _run(tmp_path, gpus=2, TORCH_SYMM_MEM_DISABLE_MULTICAST="0")
    assert result.status == "passed", result.detail
    servers = _servers(tmp_path)
    assert len(servers) == 3
    for record in servers.values():
        assert record["env"] == {**PARALLEL_ENV, "FLASHINFER_DISABLE_JIT": "1"}


def test_an_expert_count_ep_2_cannot_split_fails_before_any_server(tmp_path: Path) -> None:
    result = _run(tmp_path, gpus=2, experts=7)
    assert result.status == "failed"
    assert result.detail == "EP 2 needs an expert count divisible by 2; the model has 7 experts"
    assert not list(tmp_path.glob("pids-*.json"))


def test_the_cli_path_counts_gpus_from_the_probe_and_reads_the_made_model(
        tmp_path: Path) -> None:
    # No SGLang here: check 7 writes the tiny model with this interpreter, reads its 8
    # experts, and starts the real command at TP 1, which exits at once; the probe's runner
    # counted one GPU, so the TP 2 legs are not started.
    runner = ProbeCheck("runner", "passed", "", {"devices": 1})
    options = SmokeOptions(tiny_model=True, python=sys.executable, server_timeout=60.0)
    result = parallel_check(options, runner, ServedModel(options, tmp_path))
    assert result.status == "failed"
    assert result.detail.startswith("TP 1: the server exited with code 1 before it was ready")
    assert result.data["experts"] == 8 and result.data["gpus"] == 1
    first, *rest = result.data["legs"]
    assert first["command"][-5:] == ["--skip-tokenizer-init", *LEGS[0].args()]
    assert [leg["detail"] for leg in rest] == ["TP 2 needs 2 GPUs, 1 visible"] * 2
    assert Path(result.data["tiny_model"]["path"]) == tmp_path / "tiny-moe"


def test_checks_6_and_7_serve_one_tiny_model_written_once(tmp_path: Path) -> None:
    # tiny_model.py refuses a folder that is not empty, so a second write into the shared
    # folder would fail check 7; a write elsewhere would change the path.
    options = SmokeOptions(tiny_model=True, python=sys.executable, server_timeout=60.0)
    served = ServedModel(options, tmp_path)
    server = server_check(options, None, served)
    config = tmp_path / "tiny-moe" / "config.json"
    written = config.stat().st_mtime_ns
    parallel = parallel_check(options, ProbeCheck("runner", "passed", "", {"devices": 1}),
                               served)
    assert parallel.detail.startswith("TP 1: the server exited"), parallel.detail
    assert parallel.data["tiny_model"] == server.data["tiny_model"]
    assert config.stat().st_mtime_ns == written
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-moe"]


@pytest.mark.parametrize(("args", "message"), [
    (("host", "--parallel"), "--parallel needs a model to serve"),
    (("image", "--image", "sglang-sm120:x", "--parallel"),
     "unrecognized arguments: --parallel"),
    (("host", "--parallel", "--tiny-model", "--server-arg=--tp-size=2"),
     "--server-arg --tp-size=2 would override them"),
], ids=["no-model", "image-mode", "tp-size-arg"])
def test_the_cli_refuses_parallel_where_it_cannot_run(args: tuple[str, ...],
                                                      message: str) -> None:
    done = run_cli("smoke", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
