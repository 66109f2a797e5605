"""Smoke check 6's orchestration against a real HTTP server process (fake_sglang_server.py):
start, log watch, /health, /generate, timeouts, and a clean stop that leaves no process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.smoke.server import (
    SERVER_ENV,
    ServerOutcome,
    ServerSpec,
    free_port,
    run_server_check,
    server_env,
    sglang_command,
)
from tests.helpers.paths import TESTS
from tests.helpers.processes import left_over

FAKE = TESTS / "helpers" / "fake_sglang_server.py"


def _run(tmp_path: Path, mode: str, *, env: dict[str, str] | None = None,
         input_ids: tuple[int, ...] | None = None,
         **limits: float) -> tuple[ServerOutcome, dict[str, int]]:
    port = free_port()
    pids = tmp_path / "pids.json"
    spec = ServerSpec(command=(sys.executable, str(FAKE), "--port", str(port), "--pid-file",
                               str(pids), "--mode", mode,
                               *(["--skip-tokenizer-init"] if input_ids else [])),
                      base_url=f"http://127.0.0.1:{port}",
                      env=server_env(tmp_path) if env is None else env,
                      input_ids=input_ids,
                      **{"ready_timeout": 30.0, "request_timeout": 10.0, "stop_grace": 5.0,
                         "pattern_grace": 5.0, **limits})
    outcome = run_server_check(spec)
    return outcome, json.loads(pids.read_text())


def _gone(pids: dict[str, int]) -> None:
    """The server and its child no longer run (no orphan, no zombie left to us)."""
    for name, pid in pids.items():
        left = left_over(pid)
        assert left is None, f"{name} process {pid} is still there ({left})"


def test_a_ready_server_passes_with_its_autotune_warnings_counted(tmp_path: Path) -> None:
    outcome, pids = _run(tmp_path, "ok")
    assert outcome.status == "warning", outcome.detail
    data = outcome.data
    assert data["generated_text"] == " Paris. It is known for"
    assert set(data["patterns_seen"]) == {"Running FlashInfer autotune",
                                          "FlashInfer autotune completed"}
    assert data["warnings"] == {"skipped_tactic": 1, "tma_ws_init_failed": 1}
    assert data["stopped_by"] == "SIGTERM"
    assert data["autotune"] == {"profiled": 1, "chosen": ["3"], "skipped": {
        "missing_module": 0, "hardware": 1, "other": 0}}
    assert "autotune profiled 1 tactics, chose 3" in outcome.detail
    assert "autotune warnings: skipped_tactic 1, tma_ws_init_failed 1" in outcome.detail
    _gone(pids)


def test_an_autotune_that_skipped_every_tactic_for_a_missing_module_fails(
        tmp_path: Path) -> None:
    outcome, pids = _run(tmp_path, "untuned")
    assert outcome.status == "failed"
    assert outcome.detail.startswith("the autotune skipped 3 tactics because a module is "
                                     "missing from the jit-cache")
    assert outcome.data["autotune"]["skipped"]["missing_module"] == 3
    assert outcome.data["stopped_by"] == "SIGTERM"
    _gone(pids)


@pytest.mark.parametrize("env", [{}, SERVER_ENV], ids=["no-debug", "no-logging-config"])
def test_without_flashinfer_debug_lines_nothing_counts_as_tuned(
        tmp_path: Path, env: dict[str, str]) -> None:
    # The same healthy server, but FlashInfer's logger at its default level, or set to debug
    # while SGLang silences it (no SGLANG_LOGGING_CONFIG_PATH, as on the H200 run): the
    # check cannot see a tactic profiled, so it must not pass.
    outcome, pids = _run(tmp_path, "ok", env=env)
    assert outcome.status == "failed"
    assert outcome.detail.startswith("the autotune ran but profiled no tactic")
    assert "SGLANG_LOGGING_CONFIG_PATH" in outcome.detail
    _gone(pids)


def test_the_logging_configuration_is_one_sglang_can_apply(tmp_path: Path) -> None:
    env = server_env(tmp_path)
    assert env["FLASHINFER_LOGGING_LEVEL"] == "debug"
    # What SGLang's configure_logger does with it, in a process of its own: a logger made
    # before (as FlashInfer's is) keeps working, and SGLang's lines keep their format.
    code = ("import json, logging, logging.config, sys\n"
            "early = logging.getLogger('flashinfer.jit'); early.setLevel(logging.DEBUG)\n"
            "logging.config.dictConfig(json.load(open(sys.argv[1])))\n"
            "early.debug('[Autotuner]: profiling x 1, avg_time 0.1')\n"
            "logging.getLogger('sglang').info('Running FlashInfer autotune')\n")
    done = subprocess.run([sys.executable, "-c", code, env["SGLANG_LOGGING_CONFIG_PATH"]],
                          capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0].endswith("] [Autotuner]: profiling x 1, avg_time 0.1")
    assert lines[1].startswith("[") and lines[1].endswith("] Running FlashInfer autotune")


def test_a_server_without_tokenizer_is_asked_with_token_ids(tmp_path: Path) -> None:
    outcome, pids = _run(tmp_path, "ok", input_ids=(1, 2, 3, 4))
    assert outcome.status == "warning", outcome.detail
    assert outcome.data["generated_ids"] == list(range(7, 23))
    assert "/generate answered 16 token ids" in outcome.detail
    _gone(pids)


def test_no_token_ids_back_fails(tmp_path: Path) -> None:
    outcome, pids = _run(tmp_path, "empty-text", input_ids=(1, 2, 3, 4))
    assert outcome.status == "failed"
    assert outcome.detail.startswith("POST /generate answered no token ids")
    _gone(pids)


def test_a_hung_server_times_out_and_is_stopped(tmp_path: Path) -> None:
    outcome, pids = _run(tmp_path, "hang", ready_timeout=3.0)
    assert outcome.status == "failed"
    assert outcome.detail == "no /health answer within 3 s (hung?)"
    assert any("Load weight begin" in line for line in outcome.data["log_tail"])
    assert outcome.data["log_tail"][-1].endswith('"GET /health HTTP/1.1" 503 -')
    _gone(pids)


def test_a_crashed_server_fails_with_its_log(tmp_path: Path) -> None:
    outcome, pids = _run(tmp_path, "crash")
    assert outcome.status == "failed"
    assert outcome.detail == "the server exited with code 1 before it was ready"
    assert outcome.data["log_tail"][-1].startswith("RuntimeError: CUDA error: no kernel")
    assert outcome.data["exit_code"] == 1
    _gone(pids)


def test_missing_autotune_lines_fail_even_when_healthy(tmp_path: Path) -> None:
    outcome, pids = _run(tmp_path, "no-autotune", pattern_grace=1.0)
    assert outcome.status == "failed"
    assert outcome.detail == ("/health answered but the log never showed: Running "
                              "FlashInfer autotune; FlashInfer autotune completed")
    assert "generated_text" not in outcome.data
    _gone(pids)


def test_a_server_ignoring_sigterm_is_killed_with_its_children(tmp_path: Path) -> None:
    started = time.monotonic()
    outcome, pids = _run(tmp_path, "stubborn", stop_grace=1.0)
    assert outcome.status == "warning", outcome.detail
    assert outcome.data["stopped_by"] == "SIGKILL"
    assert time.monotonic() - started < 20
    _gone(pids)


def test_an_empty_answer_fails(tmp_path: Path) -> None:
    outcome, pids = _run(tmp_path, "empty-text")
    assert outcome.status == "failed"
    assert outcome.detail.startswith("POST /generate answered an empty text")
    _gone(pids)


def test_the_real_command_uses_the_flashinfer_cutlass_backend() -> None:
    command = sglang_command("/venv/bin/python", "/models/m", 30001,
                             extra=("--tp", "8", "--disable-cuda-graph"))
    assert command == ("/venv/bin/python", "-m", "sglang.launch_server", "--model-path",
                       "/models/m", "--moe-runner-backend", "flashinfer_cutlass", "--host",
                       "127.0.0.1", "--port", "30001", "--tp", "8", "--disable-cuda-graph")
