"""Publishing wheels alone: wheel -> gate -> index, with no Docker Engine.

For a user who wants the patched wheel on their index without an image. The checks are
``release``'s (:mod:`builder.release.publish`): every wheel's state on the index is read
before anything is uploaded (the same name with other bytes is an error, never an
overwrite; the same sha256 is already published), twine uploads, and the index must then
list each file with our sha256.

The gate:

* ``smoke`` (the default): the smoke test's report from a GPU runner, written by
  ``smoke host --sglang-wheel WHEEL --output FILE`` there; it must have passed and
  tested exactly this wheel (its provenance digest, :func:`builder.smoke.gpu.require_passed`).
  Only the wheels it covered are published.
* ``build``: the build's own checks alone (every patch applied within its fuzz policy,
  every intent check held, the version lock): chosen explicitly, like ``release image --gate
  static``, for an index that does not need proof from a GPU.

Kernel wheels (``--kernel-wheel``, what the kernel stage wrote: FlashInfer >= 0.7's
provider wheel and its shim, or the one jit-cache wheel of older releases) go through the
same door: each must be a kernel wheel the builder made for the target (its local label,
the FlashInfer the target pins, and a kernel manifest naming both in the provider or
jit-cache wheel, of the target's own module set: :mod:`builder.image.kernel_gate`; a shim
only beside its provider), the ``smoke`` gate's report must have tested that manifest,
and the index checks above apply to them before anything at all is uploaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from builder.core.cache import sha256_json
from builder.core.config import Target
from builder.core.errors import BuilderError, ConfigurationError, PublishError
from builder.core.options import Options, select_target
from builder.image.build import ExtraWheel, read_extra_wheel
from builder.image.kernel_gate import gate_kernel_wheels
from builder.release.publish import Index, Published, upload_wheel, wheel_state
from builder.release.run import ReleaseSummary
from builder.smoke.gpu import SmokeReport, load_report, require_passed
from builder.wheel.build import WheelResult, run_wheels

WheelGate = Literal["smoke", "build"]


def _report(gate: WheelGate, smoke_report: Path | None) -> SmokeReport | None:
    """The smoke report the gate needs, read and checked before anything is built.

    Raises:
        ConfigurationError: no report with ``smoke``; a report that cannot be read or is
            malformed (exit 2).
    """
    if gate == "build":
        return None
    if smoke_report is None:
        raise ConfigurationError(
            "the smoke gate needs the smoke test's report from a GPU runner",
            "there: python -m builder smoke host --sglang-wheel WHEEL --output "
            "smoke.json, then --smoke-report smoke.json; or --gate build to publish on the "
            "build's own checks alone")
    return load_report(smoke_report)


def _covered(wheels: list[WheelResult], report: SmokeReport | None) -> list[WheelResult]:
    """The wheels the gate lets through (all of them with the ``build`` gate: no report).

    Raises:
        BuilderError: the report did not run the required checks, failed, or tested
            another wheel.
    """
    if report is None:
        return wheels
    tested = (report.artifacts.get("sglang") or {}).get("provenance_sha256")
    covered = [w for w in wheels if sha256_json(w.provenance) == tested]
    # Raises when the report failed, or tested none of these wheels.
    require_passed(report, sglang_provenance=(covered or wheels)[0].provenance)
    return covered


def kernel_wheels_for(options: Options, paths: tuple[Path, ...], target: Target,
                      report: SmokeReport | None) -> list[ExtraWheel]:
    """Read and gate the kernel wheels to publish beside the sglang wheels.

    Args:
        options: the build options (the target's upstream source, for its FlashInfer pin).
        paths: the kernel wheel files (``--kernel-wheel``).
        target: the target released: each wheel must be its own kernel wheel for the
            FlashInfer it pins, of its own module set
            (:func:`builder.image.kernel_gate.gate_kernel_wheels`).
        report: the smoke gate's report, read by :func:`_report` (it must have tested the
            kernel manifest); ``None`` for the ``build`` gate.

    Raises:
        ConfigurationError: a file is not a wheel or has a broken manifest; it was built
            for another target or FlashInfer (exit 2).
        PublishError: it is not the target's (label) or a trial of it; no wheel carries a
            kernel manifest; the smoke report failed or tested other kernels.
    """
    wheels = [read_extra_wheel(p) for p in paths]
    gate_kernel_wheels(options, target, wheels)
    manifests = [w for w in wheels if w.manifest is not None]
    if wheels and not manifests:
        raise PublishError(
            f"no kernel manifest in {', '.join(w.path.name for w in wheels)}: a shim wheel "
            "is published only with its provider wheel", "pass the provider wheel too "
            "(flashinfer_jit_cache_sm120*), as the kernel stage wrote them")
    if report is not None:
        for wheel in manifests:
            require_passed(report, kernel_manifest=wheel.manifest)
    return wheels


def run_release_wheels(options: Options, index: Index, *, gate: WheelGate = "smoke",
                       smoke_report: Path | None = None,
                       kernel_wheels: tuple[Path, ...] = ()) -> ReleaseSummary:
    """Build the target's wheel(s), gate them and publish them to ``index``.

    Args:
        options: the target and build options (the version lock applies).
        index: where the wheels go.
        gate: ``smoke`` (a passed smoke report for the wheel) or ``build``.
        smoke_report: the report for the ``smoke`` gate.
        kernel_wheels: kernel wheels published with them (:func:`kernel_wheels_for`).

    Returns:
        What was published (or found already published), and what was not and why.

    Raises:
        BuilderError: a stage failed, the gate refused, the index refused (down,
            credentials, a file of the same name with other bytes); its ``report`` is the
            :class:`~builder.release.run.ReleaseSummary` so far.
    """
    summary = ReleaseSummary()
    report = _report(gate, smoke_report)
    try:
        # The kernel wheels are checked first: a refusal costs no build.
        kernels = kernel_wheels_for(options, kernel_wheels, select_target(options), report)
        wheels = run_wheels(options)
        covered = _covered(wheels, report)
    except BuilderError as exc:
        what = f"target {options.target}" if options.target else "the default target"
        summary.not_published.append((f"the wheels of {what}", f"stopped: {exc.cause}"))
        raise exc.replaced(report=summary) from None  # the failing stage's type and status
    names = {w.path.name for w in covered}
    summary.not_published += [(w.path.name, f"not covered by the {gate} gate (the smoke "
                                            "report tested another wheel)")
                              for w in wheels if w.path.name not in names]
    done: set[str] = set()
    files = [(w.path, w.sha256) for w in covered] + [(k.path, k.sha256) for k in kernels]
    try:
        # Every check that can refuse runs before anything is uploaded.
        states = {path.name: wheel_state(index, path, sha256) for path, sha256 in files}
        for path, sha256 in files:
            if states[path.name] == "already-published":
                summary.published.append(Published("wheel", path.name, index.simple_url,
                                                   f"sha256:{sha256}", "already-published"))
            else:
                summary.published.append(upload_wheel(index, path, sha256, options.reporter))
            done.add(path.name)
    except BuilderError as exc:
        summary.not_published += [(path.name, f"stopped: {exc.cause}") for path, _ in files
                                  if path.name not in done]
        raise exc.replaced(report=summary) from None
    return summary
