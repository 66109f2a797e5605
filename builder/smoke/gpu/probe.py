"""Running the probe (``builder/smoke/script/smoke_probe.py``, checks 1-5) in the tested
interpreter, and reading its output into typed results; never importing it."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.core.errors import ConfigurationError, MissingToolError, VerificationError
from builder.smoke.gpu.report import CheckResult, to_status
from builder.smoke.shared import (
    RESULT_PREFIX,
    ProbeCheck,
    ProbeOutputError,
    ProbeResults,
    Status,
)

#: What runs in the tested interpreter (never imported here): the probe, the tiny model's
#: writer, and the links to the two standard-library modules the probe loads beside it.
SCRIPT_DIR = Path(__file__).parent.with_name("script")
PROBE_PATH = SCRIPT_DIR / "smoke_probe.py"
#: The files the probe needs next to it (read through the links when sent elsewhere).
PROBE_FILES = ("smoke_probe.py", "sm120_arch.py", "smoke_shared.py")
_PROBE_CHECKS = ("runner", "sglang", "versions", "kernels", "moe")


@dataclass(frozen=True)
class ProbeRun:
    """The probe's results, and how it ended."""

    results: ProbeResults
    exit_code: int | None
    stderr_tail: str


def parse_probe_output(stdout: str, saved: Path | None = None) -> ProbeResults:
    """The probe's results from its standard output (other lines are ignored).

    Args:
        stdout: the probe's standard output.
        saved: the file it was read from (``--probe-output``), or ``None`` for a run.

    Raises:
        VerificationError: a result line of a run is malformed, or its data is not what
            the probe writes (:meth:`~builder.smoke.shared.ProbeData.check`).
        ConfigurationError: a line or the data of a saved output is, or it has no result
            line (the user's file).
    """
    if saved is not None and not any(line.startswith(RESULT_PREFIX)
                                     for line in stdout.splitlines()):
        raise ConfigurationError(f"{saved} is not the probe's output: it has no line "
                                 f"starting {RESULT_PREFIX!r}",
                                 "give the unedited standard output of smoke_probe.py")
    try:
        return ProbeResults.from_output(stdout)
    except ProbeOutputError as exc:
        if saved is not None:
            raise ConfigurationError(f"{saved} is not the probe's output: {exc}",
                                     "give the unedited standard output of smoke_probe.py"
                                     ) from None
        raise VerificationError(f"the probe printed a malformed result: {exc}",
                                "is something else printing lines that start like the "
                                "probe's?") from None


def probe_files() -> dict[str, bytes]:
    """The probe and the files it loads beside it, by name, read through the links."""
    return {name: (SCRIPT_DIR / name).read_bytes() for name in PROBE_FILES}


def tail(text: str, lines: int = 8) -> str:
    """The last ``lines`` lines of ``text`` (a process's output, for a detail)."""
    return "\n".join(text.strip().splitlines()[-lines:])


def probe_arguments(patterns: Sequence[str], moe: bool) -> list[str]:
    """The probe's command-line arguments."""
    args = ["--checks", ",".join(_PROBE_CHECKS), "--moe", "require" if moe else "auto"]
    for pattern in patterns:
        args += ["--sglang-pattern", pattern]
    return args


def run_probe_host(python: str, args: Sequence[str], timeout: float) -> ProbeRun:
    """Run the probe with ``python`` on this machine (JIT disabled by the probe itself)."""
    try:
        done = subprocess.run([python, str(PROBE_PATH), *args], capture_output=True,
                              text=True, timeout=timeout, check=False, errors="replace")
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else exc.stdout or ""
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) \
            else exc.stderr or ""
        return ProbeRun(parse_probe_output(out), None,
                        f"killed after {timeout:g} s\n{tail(err)}")
    except OSError as exc:
        raise MissingToolError(f"cannot run {python}: {exc.strerror}",
                               "--python must be the interpreter of the environment to test"
                               ) from None
    return ProbeRun(parse_probe_output(done.stdout), done.returncode, tail(done.stderr))


def from_probe(name: str, result: ProbeCheck | None, run: ProbeRun,
                required: bool = True) -> CheckResult:
    """The report's check ``name`` copied from the probe's ``result``, or failed with how
    the probe ended when it never printed one."""
    if result is None:
        how = "was killed" if run.exit_code is None else f"exited with code {run.exit_code}"
        return CheckResult(name, Status.FAILED, f"the probe {how} before this check finished: "
                           f"{run.stderr_tail.splitlines()[-1] if run.stderr_tail else ''}",
                           required, {"stderr_tail": run.stderr_tail})
    return CheckResult(name, to_status(result.status), result.detail, required,
                       dict(result.data))
