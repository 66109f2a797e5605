"""Checks 6 and 7, which serve a model here (host mode): ``server`` (SGLang serves it and
answers, :mod:`builder.smoke.server`) and ``parallel`` (the same tokens at TP 1, TP 2 EP 1
and TP 2 EP 2, :mod:`builder.smoke.parallel`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from builder.core.errors import ConfigurationError
from builder.smoke.gpu.options import SmokeOptions
from builder.smoke.gpu.probe import SCRIPT_DIR, tail
from builder.smoke.gpu.report import CheckResult, to_status
from builder.smoke.shared import ProbeCheck, RunnerData, Status

#: ``tiny_model.py``: run by path with the tested interpreter, like the probe.
TINY_MODEL_PATH = SCRIPT_DIR / "tiny_model.py"
SKIP_TOKENIZER = "--skip-tokenizer-init"
#: The prompt's token ids when the server has no tokenizer (any ids below the vocab size).
PROMPT_IDS = tuple(range(1, 17))


class ServedModel:
    """The model checks 6 and 7 serve: ``--model``, or the tiny one, written once on first use.

    Args:
        options: the smoke options (``model``, ``tiny_model``, ``python``, ``reporter``).
        scratch: the folder the tiny model is written into; the caller removes it.
    """

    def __init__(self, options: SmokeOptions, scratch: Path) -> None:
        self.options = options
        self.scratch = scratch
        self._written: dict[str, Any] | str | None = None

    def get(self) -> tuple[Path, dict[str, Any] | None] | str:
        """The model's folder and, for the tiny model, what was written; or why not."""
        if self.options.model is not None and not self.options.tiny_model:
            return self.options.model, None
        if self._written is None:
            self._written = _write_tiny_model(self.options, self.scratch)
        if isinstance(self._written, str):
            return self._written
        return Path(self._written["path"]), self._written


def server_check(options: SmokeOptions, no_gpu: ProbeCheck | None,
                 served: ServedModel) -> CheckResult:
    """Check 6: SGLang serves the model and answers (see :mod:`builder.smoke.server`);
    not run without a model, failed without a GPU."""
    if options.model is None and not options.tiny_model:
        return CheckResult("server", Status.NOT_RUN,
                           "no model given (--model PATH or --tiny-model)", required=False)
    if no_gpu is not None:  # the probe found none: SGLang would only fail later, less clearly
        return CheckResult("server", Status.FAILED, no_gpu.detail, True)
    got = served.get()
    if isinstance(got, str):
        return CheckResult("server", Status.FAILED, got, True)
    model, made = got
    extra = tuple(options.server_args)
    if made is not None and SKIP_TOKENIZER not in extra:
        extra = (*extra, SKIP_TOKENIZER)
    with tempfile.TemporaryDirectory(prefix="sm120-server-") as scratch:
        return _serve(options, model, extra, made, Path(scratch))


def _write_tiny_model(options: SmokeOptions, scratch: Path) -> dict[str, Any] | str:
    """Write the tiny model under ``scratch`` with the tested interpreter.

    Returns:
        ``tiny_model.py``'s answer (``{"path", "parameters", "bytes"}``), or why not.
    """
    python = options.python or sys.executable
    options.reporter.info("Writing a tiny Qwen3-MoE with random weights ...")
    try:
        done = subprocess.run([python, str(TINY_MODEL_PATH), f"{scratch}/tiny-moe"],
                              capture_output=True, text=True, check=False, timeout=600)
    except subprocess.TimeoutExpired:
        return "writing the tiny model took more than 600 s"
    if done.returncode != 0:
        return "could not write the tiny model: " + tail(done.stderr)[-300:]
    made: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return made


def parallel_check(options: SmokeOptions, runner: ProbeCheck | None,
                   served: ServedModel) -> CheckResult:
    """Check 7 with the model of check 6 (see :mod:`builder.smoke.parallel`)."""
    from builder.smoke.parallel import expert_count, run_parallel_check
    from builder.smoke.server import server_env, sglang_command

    found = RunnerData.read(runner)
    devices = found.devices if found is not None else None
    if runner is None or devices is None or devices < 1:
        return CheckResult("parallel", Status.FAILED, runner.detail if runner is not None and
                           runner.detail else "the probe counted no CUDA device", True)
    got = served.get()
    if isinstance(got, str):
        return CheckResult("parallel", Status.FAILED, got, True)
    model, made = got
    with tempfile.TemporaryDirectory(prefix="sm120-parallel-") as scratch:
        try:
            experts = expert_count(model)
        except (OSError, ValueError) as exc:
            return CheckResult("parallel", Status.FAILED, f"cannot read {model}/config.json: {exc}",
                               True)
        extra = tuple(options.server_args)
        if SKIP_TOKENIZER not in extra:  # the legs are asked by token id, any model
            extra = (*extra, SKIP_TOKENIZER)
        python = options.python or sys.executable
        outcome = run_parallel_check(
            lambda port, leg: sglang_command(python, str(model), port, extra=(*extra, *leg)),
            gpus=devices, experts=experts,
            env={"FLASHINFER_DISABLE_JIT": "1", **server_env(Path(scratch))},
            prompt_ids=PROMPT_IDS, ready_timeout=options.server_timeout,
            info=options.reporter.info)
    return CheckResult("parallel", to_status(outcome.status), outcome.detail, True,
                       {**outcome.data, **({"tiny_model": made} if made else {})})


def _serve(options: SmokeOptions, model: Path, extra: tuple[str, ...],
           made: dict[str, Any] | None, scratch: Path) -> CheckResult:
    from builder.smoke.server import (
        ServerSpec,
        free_port,
        run_server_check,
        server_env,
        sglang_command,
    )

    port = free_port()
    env = {"FLASHINFER_DISABLE_JIT": "1", **server_env(scratch)}
    overridden = [k for k in env if os.environ.get(k) not in (None, env[k])]
    if overridden:
        options.reporter.info(f"check 6 sets {', '.join(overridden)} for the server "
                              "(FlashInfer's tactic lines must reach its log)")
    options.reporter.info(f"Starting SGLang on 127.0.0.1:{port} with {model} ...")
    outcome = run_server_check(ServerSpec(
        command=sglang_command(options.python or sys.executable, str(model), port,
                               extra=extra),
        base_url=f"http://127.0.0.1:{port}", ready_timeout=options.server_timeout,
        env=env,
        input_ids=PROMPT_IDS if SKIP_TOKENIZER in extra else None))
    data = {**outcome.data, **({"tiny_model": made} if made else {})}
    return CheckResult("server", to_status(outcome.status), outcome.detail, True, data)


def parallel_rules(options: SmokeOptions) -> None:
    """Refuse ``--parallel`` where check 7 cannot run as asked.

    Raises:
        ConfigurationError: image mode, a saved probe output, no model, or a
            ``--server-arg`` that sets a parallel size the legs set themselves.
    """
    from builder.smoke.parallel import PARALLEL_ARGS

    if options.mode == "image" or options.probe_output is not None:
        raise ConfigurationError("--parallel: check 7 starts SGLang in this environment (host "
                                 "mode only, without --probe-output)",
                                 "run `smoke host --parallel --tiny-model` inside the "
                                 "image, or leave --parallel out")
    if options.model is None and not options.tiny_model:
        raise ConfigurationError("--parallel needs a model to serve",
                                 "add --tiny-model (a random-weight MoE written here) or "
                                 "--model PATH")
    clash = [arg for arg in options.server_args if arg.split("=")[0] in PARALLEL_ARGS]
    if clash:
        raise ConfigurationError(f"--parallel sets the parallel sizes of each leg itself: "
                                 f"--server-arg {' '.join(clash)} would override them",
                                 "leave those --server-arg out with --parallel")
