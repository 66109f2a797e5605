"""Publishing wheels alone: wheel -> gate -> index, with no Docker Engine.

For a user who wants the patched wheel on their index without an image. The checks are
``release``'s (:mod:`builder.release.publish`): every wheel's state on the index is read
before anything is uploaded (the same name with other bytes is an error, never an
overwrite; the same sha256 is already published), twine uploads, and the index must then
list each file with our sha256.

The gate:

* ``smoke`` (the default): the smoke test's report from a GPU runner, written by
  ``smoke --mode host --sglang-wheel WHEEL --output FILE`` there; it must have passed and
  tested exactly this wheel (its provenance digest, :func:`builder.smoke.gpu.require_passed`).
  Only the wheels it covered are published.
* ``build``: the build's own checks alone (every patch applied within its fuzz policy,
  every intent check held, the version lock): chosen explicitly, like ``release --gate
  static``, for an index that does not need proof from a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from builder.core.cache import sha256_json
from builder.core.errors import BuilderError, PublishError
from builder.core.options import Options
from builder.release.publish import Index, Published, upload_wheel, wheel_state
from builder.release.run import ReleaseSummary
from builder.smoke.gpu import SmokeReport, load_report, require_passed
from builder.wheel.build import WheelResult, run_wheels

WheelGate = Literal["smoke", "build"]


def _report(gate: WheelGate, smoke_report: Path | None) -> SmokeReport | None:
    """The smoke report the gate needs, read and checked before anything is built.

    Raises:
        BuilderError: no report with ``smoke`` (exit 7); a report that cannot be read or
            is malformed (a configuration error, exit 2).
    """
    if gate == "build":
        return None
    if smoke_report is None:
        raise PublishError(
            "the smoke gate needs the smoke test's report from a GPU runner",
            "there: python -m builder smoke --mode host --sglang-wheel WHEEL --output "
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


def run_publish_wheels(options: Options, index: Index, *, gate: WheelGate = "smoke",
                       smoke_report: Path | None = None) -> ReleaseSummary:
    """Build the target's wheel(s), gate them and publish them to ``index``.

    Args:
        options: the target and build options (the version lock applies).
        index: where the wheels go.
        gate: ``smoke`` (a passed smoke report for the wheel) or ``build``.
        smoke_report: the report for the ``smoke`` gate.

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
        wheels = run_wheels(options)
        covered = _covered(wheels, report)
    except BuilderError as exc:
        what = f"target {options.target}" if options.target else "the default target"
        summary.not_published.append((f"the wheels of {what}", f"stopped: {exc.cause}"))
        raise PublishError(exc.cause, exc.hint, report=summary) from None
    names = {w.path.name for w in covered}
    summary.not_published += [(w.path.name, f"not covered by the {gate} gate (the smoke "
                                            "report tested another wheel)")
                              for w in wheels if w.path.name not in names]
    done: set[str] = set()
    try:
        # Every check that can refuse runs before anything is uploaded.
        states = {w.path.name: wheel_state(index, w.path, w.sha256) for w in covered}
        for wheel in covered:
            if states[wheel.path.name] == "already-published":
                summary.published.append(Published("wheel", wheel.path.name,
                                                   index.simple_url, f"sha256:{wheel.sha256}",
                                                   "already-published"))
            else:
                summary.published.append(upload_wheel(index, wheel.path, wheel.sha256,
                                                      options.reporter))
            done.add(wheel.path.name)
    except BuilderError as exc:
        summary.not_published += [(w.path.name, f"stopped: {exc.cause}") for w in covered
                                  if w.path.name not in done]
        raise PublishError(exc.cause, exc.hint, report=summary) from None
    return summary
