"""Smoke check 6: launch an SGLang server, watch its log, ask it for text, stop it cleanly.

The orchestration is generic over the command, so the tests drive it against a real HTTP
server process of their own (``tests/fake_sglang_server.py``) that imitates SGLang's log
lines and endpoints; on a GPU runner the command is :func:`sglang_command`. The server runs
in its own session (process group): stopping sends SIGTERM to the whole group, waits, then
SIGKILLs whatever is left, so no scheduler or detokenizer child outlives the check.

SGLang facts used (read in the 0.5.9 and 0.5.16 sources): the model runner logs ``Running
FlashInfer autotune...`` (0.5.16: ``Running FlashInfer autotune with cache: ...``) and then
``FlashInfer autotune completed.``; ``GET /health`` answers 503 while the server starts and
200 once it serves; ``POST /generate`` takes ``{"text", "sampling_params"}`` and answers
``{"text", "meta_info"}``; with ``--skip-tokenizer-init`` it takes ``{"input_ids", ...}``
and answers ``{"output_ids", "meta_info"}`` (``srt/managers/tokenizer_manager.py``).
Whether the autotune tuned anything is read from FlashInfer's own per-tactic log lines
(:func:`builder.smoke.shared.autotune_summary`), which :func:`server_env` turns on.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.smoke.shared import (
    Status,
    autotune_summary,
    classify_line,
    count_warnings,
    untuned,
)

AUTOTUNE_PATTERNS = ("Running FlashInfer autotune", "FlashInfer autotune completed")

#: What FlashInfer's autotuner prefixes its log lines with (``flashinfer/autotuner.py``).
AUTOTUNER_TAG = "[Autotuner]: "

#: FlashInfer's logger at debug level (``FLASHINFER_LOGGING_LEVEL``, read when
#: ``flashinfer/jit/core.py`` creates it), so that every tactic the autotuner times or
#: skips is one line of the server's log.
SERVER_ENV = {"FLASHINFER_LOGGING_LEVEL": "debug"}

#: SGLang's own log format (``configure_logger`` in ``sglang/srt/utils/common.py``), as a
#: ``logging.config.dictConfig`` that leaves other loggers alone.
LOGGING_CONFIG: dict[str, Any] = {
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"sglang": {"format": "[%(asctime)s] %(message)s",
                              "datefmt": "%Y-%m-%d %H:%M:%S"}},
    "handlers": {"stdout": {"class": "logging.StreamHandler", "formatter": "sglang",
                            "stream": "ext://sys.stdout"}},
    "root": {"level": "INFO", "handlers": ["stdout"]},
}


def server_env(scratch: Path) -> dict[str, str]:
    """The environment the server check adds, with a logging configuration in ``scratch``.

    SGLang's ``configure_logger`` (0.5.16, ``sglang/srt/utils/common.py``) sets FlashInfer's
    logger to ERROR in every process, which hides the autotuner's lines whatever
    ``FLASHINFER_LOGGING_LEVEL`` says, unless ``SGLANG_LOGGING_CONFIG_PATH`` names a
    logging configuration: then SGLang applies that one and leaves FlashInfer's logger
    alone. (Seen on the lent H200 on 2026-11-30: without it the autotune ran for 28 s and
    logged no tactic.)

    Returns:
        :data:`SERVER_ENV` plus ``SGLANG_LOGGING_CONFIG_PATH`` (the file it wrote).
    """
    path = scratch / "sglang-logging.json"
    path.write_text(json.dumps(LOGGING_CONFIG))
    return {**SERVER_ENV, "SGLANG_LOGGING_CONFIG_PATH": str(path)}


def sglang_command(python: str, model: str, port: int, *,
                   extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The command that serves ``model`` with the MoE backend our patch autotunes."""
    return (python, "-m", "sglang.launch_server", "--model-path", model,
            "--moe-runner-backend", "flashinfer_cutlass", "--host", "127.0.0.1",
            "--port", str(port), *extra)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class ServerSpec:
    """What to launch and how long to wait.

    Attributes:
        command: the server's command line.
        base_url: where it listens (``http://127.0.0.1:PORT``).
        env: extra environment variables.
        patterns: log lines (substrings) that must appear before the check passes.
        ready_timeout: seconds to wait for ``/health`` and the patterns (model load and
            autotune included).
        request_timeout: seconds for the ``/generate`` answer.
        stop_grace: seconds between SIGTERM and SIGKILL.
        pattern_grace: seconds a pattern may come after ``/health`` answers (SGLang logs
            its autotune before it serves, so only a late flush needs this).
        prompt: the text sent to ``/generate``.
        input_ids: token ids sent instead of ``prompt`` (a server started with
            ``--skip-tokenizer-init``, which answers ``output_ids`` and no text).
        max_new_tokens: tokens asked for (EOS ignored with ``input_ids``: random
            weights may pick it first).
        require_tuning: fail unless the autotuner's log shows a tactic profiled and none
            skipped for a module missing from the jit-cache (needs
            :data:`SERVER_ENV`).
        top_logprobs: with ``input_ids``, also ask for this many most likely tokens per
            output position (``return_logprob`` and ``top_logprobs_num`` of SGLang's
            ``GenerateReqInput``); kept in the outcome's ``top_logprobs``. 0: not asked.
    """

    command: tuple[str, ...]
    base_url: str
    env: Mapping[str, str] = field(default_factory=dict)
    patterns: tuple[str, ...] = AUTOTUNE_PATTERNS
    ready_timeout: float = 1800.0
    request_timeout: float = 300.0
    stop_grace: float = 30.0
    pattern_grace: float = 10.0
    prompt: str = "The capital of France is"
    input_ids: tuple[int, ...] | None = None
    max_new_tokens: int = 16
    require_tuning: bool = True
    top_logprobs: int = 0


@dataclass(frozen=True)
class ServerOutcome:
    """The server check's result.

    Attributes:
        status: ``passed``, ``warning`` (passed, with autotune warnings) or ``failed``.
        detail: one line.
        data: timings, patterns seen, the answer, warnings, how it stopped, the log's tail.
    """

    status: Status
    detail: str
    data: dict[str, Any]


class _LogWatcher:
    """Reads the server's merged stdout/stderr on a thread; remembers the patterns seen."""

    def __init__(self, stream: Any, patterns: Sequence[str]) -> None:
        self.patterns = list(patterns)
        self.seen: dict[str, float] = {}
        self.tail: deque[str] = deque(maxlen=40)
        self.warning_lines: list[str] = []
        self.autotuner_lines: list[str] = []
        self.lines = 0
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for raw in stream:
            line = raw.rstrip("\n")
            with self._lock:
                self.lines += 1
                self.tail.append(line)
                if classify_line(line):
                    self.warning_lines.append(line)
                if AUTOTUNER_TAG in line:
                    self.autotuner_lines.append(line)
                for pattern in self.patterns:
                    if pattern in line and pattern not in self.seen:
                        self.seen[pattern] = round(time.monotonic() - self._start, 2)

    def missing(self) -> list[str]:
        with self._lock:
            return [p for p in self.patterns if p not in self.seen]

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _group_alive(pgid: int) -> bool:
    """Whether a member of process group ``pgid`` still runs (a zombie does not).

    ``killpg(pgid, 0)`` also finds zombies: members that have exited and wait for their
    parent to reap them. A child orphaned by the server's exit is reaped by PID 1, which
    in some containers does so only every second or two (measured here: 1.6 s), or never
    where PID 1 is a plain script; a zombie holds no memory, GPU or port, so it does not
    count. Where ``/proc`` cannot tell (another kernel), every member counts.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal still exists
        return True
    states = [state for pid_pgrp, state in _process_states() if pid_pgrp == pgid]
    # No entry: /proc cannot tell (or the member just went), so killpg's answer stands.
    return not states or any(state not in ("Z", "X") for state in states)


def _process_states() -> list[tuple[int, str]]:
    """``(process group, state)`` of every process in ``/proc`` (proc(5)'s ``stat``: "pid
    (comm) state ppid pgrp ...", where comm may hold spaces and parentheses)."""
    found = []
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = path.read_text().rpartition(")")[2].split()
        except OSError:  # it exited while we looked
            continue
        if len(fields) >= 3 and fields[2].lstrip("-").isdigit():
            found.append((int(fields[2]), fields[0]))
    return found


def stop_group(process: subprocess.Popen[str], grace: float) -> str:
    """Stop the server's process group: SIGTERM, wait ``grace`` seconds, then SIGKILL.

    Returns:
        How it ended: ``exited`` (before we stopped it), ``SIGTERM`` or ``SIGKILL``; with
        `` (orphans left)`` appended if group members survived even SIGKILL for 5 s
        (zombies do not count: :func:`_group_alive`).
    """
    pgid = process.pid  # start_new_session=True: the leader's pid is the group id
    how = "exited" if process.poll() is not None else "SIGTERM"
    if _group_alive(pgid):
        if how == "exited":
            how = "exited, children SIGTERM"
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            process.poll()
            if not _group_alive(pgid):
                break
            time.sleep(0.1)
        else:
            how = how.replace("SIGTERM", "SIGKILL")
            os.killpg(pgid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 5
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return how + (" (orphans left)" if _group_alive(pgid) else "")


def run_server_check(spec: ServerSpec) -> ServerOutcome:
    """Launch the server, wait for ``/health`` and the log patterns, ``POST /generate``, stop.

    Every path (crash, hang, a missing log line, a bad answer) ends with the process group
    stopped; a failed outcome carries the log's last lines.

    Returns:
        The outcome; never raises for the server's behaviour.
    """
    import requests

    started = time.monotonic()
    process = subprocess.Popen(
        list(spec.command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        bufsize=1, errors="replace", start_new_session=True, stdin=subprocess.DEVNULL,
        env={**os.environ, **spec.env})
    assert process.stdout is not None
    watcher = _LogWatcher(process.stdout, spec.patterns)
    data: dict[str, Any] = {"command": list(spec.command)}
    status, detail = Status.FAILED, ""
    session = requests.Session()
    try:
        healthy_at = None
        polls = 0
        deadline = started + spec.ready_timeout
        while True:
            now = time.monotonic()
            code = process.poll()
            if code is not None:
                detail = f"the server exited with code {code} before it was ready"
                break
            if healthy_at is None:
                try:
                    answer = session.get(f"{spec.base_url}/health", timeout=5)
                    if answer.status_code == 200:
                        healthy_at = now
                        data["seconds_to_health"] = round(now - started, 2)
                except requests.RequestException:
                    pass
            # The autotune runs while the model loads, so its lines come before /health;
            # a late line gets pattern_grace seconds after /health, not the whole timeout.
            if healthy_at is not None and (not watcher.missing()
                                           or now > healthy_at + spec.pattern_grace):
                break
            if now > deadline:
                detail = (f"no /health answer within {spec.ready_timeout:g} s (hung?)"
                          if healthy_at is None else "timed out")
                break
            # 0.05 s at first, doubling to 0.5 s: a quick start is seen at once, a model
            # that loads for minutes is asked twice a second.
            time.sleep(min(0.5, 0.05 * 2 ** polls))
            polls += 1
        if healthy_at is not None and not detail:
            missing = watcher.missing()
            if missing:
                detail = f"/health answered but the log never showed: {'; '.join(missing)}"
            else:
                status, detail = _generate(session, spec, data)
                tuned = autotune_summary(list(watcher.autotuner_lines))
                data["autotune"] = tuned
                untuned = tuning_failure(tuned) if spec.require_tuning else None
                if status == Status.PASSED and untuned:
                    status, detail = Status.FAILED, f"{untuned} ({detail})"
                elif status == Status.PASSED and spec.require_tuning:
                    detail += (f"; autotune profiled {tuned['profiled']} tactics, chose "
                               f"{'/'.join(tuned['chosen']) or '?'}")
    finally:
        session.close()
        data["stopped_by"] = stop_group(process, spec.stop_grace)
        data["exit_code"] = process.returncode
        watcher.join(5)
    data.update(patterns_seen=watcher.seen, log_lines=watcher.lines,
                warnings=count_warnings(watcher.warning_lines),
                warning_lines=watcher.warning_lines[:20], log_tail=list(watcher.tail),
                seconds=round(time.monotonic() - started, 2))
    if "orphans" in data["stopped_by"]:
        status, detail = Status.FAILED, f"{detail}; processes survived the stop" if detail else \
            "processes of the server survived SIGKILL"
    if status == Status.PASSED and any(data["warnings"].values()):
        status = Status.WARNING
        detail += "; autotune warnings: " + ", ".join(
            f"{k} {n}" for k, n in data["warnings"].items() if n)
    return ServerOutcome(status, detail, data)


def tuning_failure(tuned: dict[str, Any]) -> str | None:
    """Why the server's autotune tuned nothing (``None``: it tuned).

    Args:
        tuned: :func:`builder.smoke.shared.autotune_summary` of the server's log.
    """
    cause = untuned(tuned)
    if cause == "missing_module":
        return (f"the autotune skipped {tuned['skipped']['missing_module']} tactics because "
                "a module is missing from the jit-cache with JIT disabled (the autotuner's "
                "trtllm_utils?): nothing was tuned")
    if cause == "none_profiled":
        return ("the autotune ran but profiled no tactic (FlashInfer logs each at debug "
                "level with FLASHINFER_LOGGING_LEVEL=debug and SGLANG_LOGGING_CONFIG_PATH set, "
                "see server_env): nothing was tuned")
    return None


def _generate(session: Any, spec: ServerSpec, data: dict[str, Any]) -> tuple[Status, str]:
    import requests

    params: dict[str, Any] = {"max_new_tokens": spec.max_new_tokens, "temperature": 0}
    body: dict[str, Any] = {"text": spec.prompt, "sampling_params": params}
    if spec.input_ids is not None:
        params["ignore_eos"] = True
        body = {"input_ids": list(spec.input_ids), "sampling_params": params}
        if spec.top_logprobs:
            body.update(return_logprob=True, top_logprobs_num=spec.top_logprobs)
    try:
        answer = session.post(f"{spec.base_url}/generate", json=body,
                              timeout=spec.request_timeout)
    except requests.RequestException as exc:
        return Status.FAILED, f"POST /generate failed: {exc}"
    if answer.status_code != 200:
        return Status.FAILED, f"POST /generate answered {answer.status_code}: {answer.text[:200]}"
    if spec.input_ids is not None:
        try:
            ids = answer.json()["output_ids"]
        except (ValueError, KeyError, TypeError):
            return Status.FAILED, f"POST /generate answered no output_ids: {answer.text[:200]}"
        if not isinstance(ids, list) or not ids or \
                not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            return Status.FAILED, f"POST /generate answered no token ids: {answer.text[:200]}"
        data["generated_ids"] = ids
        if spec.top_logprobs:
            data["top_logprobs"] = _top_logprobs(answer.json())
        return Status.PASSED, (f"/health after {data['seconds_to_health']} s, autotune ran, "
                               f"/generate answered {len(ids)} token ids")
    try:
        text = answer.json()["text"]
    except (ValueError, KeyError, TypeError):
        return Status.FAILED, f"POST /generate answered no text: {answer.text[:200]}"
    if not isinstance(text, str) or not text.strip():
        return Status.FAILED, f"POST /generate answered an empty text: {answer.text[:200]}"
    data["generated_text"] = text
    return Status.PASSED, (f"/health after {data['seconds_to_health']} s, autotune ran, "
                           f"/generate answered {text.strip()[:60]!r}")


def _top_logprobs(answer: Any) -> list[list[list[float]]] | None:
    """``[[logprob, token id], ...]`` per output position, most likely first, from the
    answer's ``meta_info.output_top_logprobs`` (``None`` when absent or not that shape).

    SGLang answers ``(logprob, token id, text or None)`` per candidate and ``None`` for a
    position without them (``detokenize_top_logprobs_tokens`` in
    ``sglang/srt/managers/tokenizer_manager.py``, 0.5.16).
    """
    try:
        positions = answer["meta_info"]["output_top_logprobs"]
        return [[[float(c[0]), int(c[1])] for c in position or []] for position in positions]
    except (KeyError, TypeError, ValueError, IndexError):
        return None
