"""Running the smoke test (:func:`run_smoke`): the probe where the artifacts are, the
checks judged here, and the report assembled (:func:`assemble`)."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from builder.core.cache import sha256_json
from builder.core.errors import ConfigurationError
from builder.core.userfiles import read_input, read_json_input
from builder.patching.series import Series, load_series
from builder.smoke.gpu.lockstep import check_lockstep
from builder.smoke.gpu.options import SmokeOptions
from builder.smoke.gpu.probe import (
    ProbeRun,
    from_probe,
    parse_probe_output,
    probe_arguments,
    probe_files,
    run_probe_host,
    tail,
)
from builder.smoke.gpu.report import CHECKS, CheckResult, SmokeReport
from builder.smoke.gpu.serving import ServedModel, parallel_check, parallel_rules, server_check
from builder.smoke.gpu.sglang_check import check_sglang, intent_patterns, wheel_provenance
from builder.smoke.shared import RunnerData, SglangData, Status, VersionsData
from builder.wheel.build import builder_version


def run_smoke(options: SmokeOptions) -> SmokeReport:
    """Run the smoke test and return its report (which may say it failed).

    Raises:
        BuilderError: bad input: no ``--image`` in image mode, an image the engine does not
            have, an unreadable series, wheel or provenance file, an interpreter that cannot
            run; ``--parallel`` without a model, outside host mode or with a parallel size
            in ``--server-arg``.
    """
    if options.parallel:
        parallel_rules(options)
    _model_rules(options)
    series = load_series(options.series)
    expected, expected_record = _expected(options)
    args = probe_arguments(intent_patterns(series), options.moe)
    artifacts: dict[str, Any] = {}
    if options.mode == "image":
        got = _run_in_image(options, args)
        if isinstance(got, SmokeReport):
            return got
        run, artifacts["image"] = got
    elif options.probe_output is not None:
        # A named pipe or a folder is refused at once (read_input), never waited on.
        text = read_input(options.probe_output, "the probe output",
                          "give the saved standard output of smoke_probe.py"
                          ).decode("utf-8", errors="replace")
        run = ProbeRun(parse_probe_output(text, options.probe_output), 0, "")
    else:
        options.reporter.info("Running the probe in this environment ...")
        run = run_probe_host(options.python or sys.executable, args, options.probe_timeout)
    with tempfile.TemporaryDirectory(prefix="sm120-tiny-model-") as scratch:
        served = ServedModel(options, Path(scratch))  # checks 6 and 7 serve one model
        server = server_check(options, run.results.no_device(), served)
        parallel = parallel_check(options, run.results.runner, served) \
            if options.parallel else None
    return assemble(options.mode, run, series, moe=options.moe, expected=expected,
                    expected_record=expected_record, server=server, artifacts=artifacts,
                    parallel=parallel)


def _model_rules(options: SmokeOptions) -> None:
    """Refuse a model (checks 6 and 7 serve it here) where SGLang would not start beside
    the probe's results.

    Raises:
        ConfigurationError: ``--model`` or ``--tiny-model`` in image mode or with
            ``--probe-output``.
    """
    if options.model is None and not options.tiny_model:
        return
    given = "--model" if options.model is not None else "--tiny-model"
    if options.mode == "image":
        raise ConfigurationError(f"{given}: the server check runs in host mode only",
                                 "run `smoke host` inside the image for check 6, or "
                                 f"leave {given} out")
    if options.probe_output is not None:
        raise ConfigurationError(f"{given} with --probe-output would start SGLang here, not "
                                 "where the probe ran", f"leave {given} out, or run the smoke "
                                 "in the tested environment")


def _run_in_image(options: SmokeOptions, args: list[str]
                  ) -> tuple[ProbeRun, dict[str, Any]] | SmokeReport:
    """Run the probe in ``options.image`` with every GPU.

    Returns:
        The run and the image tested (ref and id), or the report when the engine would not
        start the container.

    Raises:
        BuilderError: no ``--image``, or an image the engine does not have.
    """
    from builder.smoke.container import EngineRefused, docker_client, run_in_image

    if not options.image:
        raise ConfigurationError("image mode needs --image REF", "name a built image")
    options.reporter.info(f"Running the probe in {options.image} with every GPU ...")
    try:
        container = run_in_image(
            options.image, [options.python or "python3", "/sm120-smoke/smoke_probe.py", *args],
            files={f"sm120-smoke/{name}": data for name, data in probe_files().items()},
            environment={"FLASHINFER_DISABLE_JIT": "1"}, timeout=options.probe_timeout,
            client=docker_client(options.docker_host))
    except EngineRefused as exc:
        return _refused(str(exc), exc.fault, options.image)
    run = ProbeRun(parse_probe_output(container.stdout), container.exit_code,
                   tail(container.stderr))
    return run, {"ref": options.image, "id": container.image_id}


def _refused(message: str, fault: str, image: str) -> SmokeReport:
    """The report when the engine would not start the container."""
    misconfigured = fault == "misconfigured-runner"
    reason = "the runner could not start the container" if misconfigured else \
        "the image could not start"
    runner = CheckResult("runner", Status.FAILED, ("misconfigured runner: " if misconfigured
                                                   else "broken image: ") + message,
                         data={"engine_error": message, "fault": fault})
    rest = tuple(CheckResult(name, Status.NOT_RUN, reason,
                             name not in ("moe-autotune", "server", "parallel"))
                 for name in CHECKS[1:])
    return SmokeReport("image", (runner, *rest), {"image": {"ref": image}},
                       misconfigured_runner=misconfigured, created=_now(),
                       builder=builder_version())


def assemble(mode: str, run: ProbeRun, series: Series, *, moe: bool,
             expected: Mapping[str, Any] | None, expected_record: Mapping[str, str] | None,
             server: CheckResult, artifacts: Mapping[str, Any],
             parallel: CheckResult | None = None) -> SmokeReport:
    """Judge the probe's results and build the report (pure: no GPU, no processes).

    ``parallel`` is check 7's result (``None``: not asked for, not counted).
    """
    results = run.results
    sglang = SglangData.read(results.sglang_data)
    requires = list(sglang.requires) if sglang is not None and results.sglang_data and \
        results.sglang_data.status == Status.PASSED else []
    moe_result = results.moe_autotune
    moe_required = moe or (moe_result is not None and moe_result.status != Status.NOT_RUN)
    sglang_check = from_probe("sglang", None, run) if results.sglang_data is None else \
        check_sglang(results.sglang_data, series, expected=expected,
                     expected_record=expected_record)
    lockstep = from_probe("lockstep", None, run) if results.versions_data is None else \
        check_lockstep(results.versions_data, requires)
    runner = from_probe("runner", results.runner, run)
    checks = (
        runner,
        sglang_check,
        lockstep,
        from_probe("kernels", results.kernels, run),
        from_probe("moe-autotune", moe_result, run, moe_required),
        server,
        parallel or CheckResult("parallel", Status.NOT_RUN, "not asked for (--parallel)",
                                required=False),
    )
    found = {**artifacts, **_tested(sglang_check, VersionsData.read(results.versions_data))}
    gpu = RunnerData.read(results.runner)
    if runner.ok and gpu is not None:
        found["runner"] = {"gpu": gpu.gpu, "compute_capability": gpu.compute_capability,
                           "driver": gpu.driver, "cuda_runtime": gpu.cuda_runtime}
    return SmokeReport(mode, checks, found, created=_now(), builder=builder_version())


def _tested(sglang: CheckResult, versions: VersionsData | None) -> dict[str, Any]:
    """The artifacts the checks saw: sglang's provenance digest (check 2 verified it) and
    the kernel wheel's manifest digest."""
    found: dict[str, Any] = {}
    if sglang.data.get("provenance_sha256"):
        found["sglang"] = {"version": sglang.data["version"],
                           "provenance_sha256": sglang.data["provenance_sha256"]}
    if versions is not None and versions.manifest is not None:
        found["kernels"] = {"version": versions.versions.get("flashinfer-jit-cache"),
                            "manifest_sha256": sha256_json(versions.manifest)}
    return found


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def _expected(options: SmokeOptions) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
    if options.sglang_wheel is not None:
        return wheel_provenance(options.sglang_wheel)
    if options.expect_provenance is not None:
        hint = "give the sm120-provenance.json of the artifact"
        expected = read_json_input(options.expect_provenance, "the expected provenance", hint)
        if not isinstance(expected, dict):  # compared key by key with the installed one
            raise ConfigurationError(f"the expected provenance {options.expect_provenance} is "
                                     f"a JSON {type(expected).__name__}, not an object", hint)
        return expected, None
    return None, None
