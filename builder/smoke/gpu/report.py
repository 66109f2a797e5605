"""The smoke report: one result per check (:class:`CheckResult`), the verdict, the file
it is written to, and the gate ``release`` calls (:func:`require_passed`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core.cache import atomic_write_bytes, sha256_json
from builder.core.errors import BuilderError, ConfigurationError, PublishError
from builder.core.userfiles import read_json_input
from builder.smoke.shared import STATUSES, Status

CHECKS = ("runner", "sglang", "lockstep", "kernels", "moe-autotune", "server", "parallel")
#: The checks every report must have run and counted (1-4, see :mod:`builder.smoke.gpu`):
#: a report without one of them proves nothing, whatever else it holds.
ALWAYS_COUNTED = CHECKS[:4]
EXIT_PASSED, EXIT_FAILED, EXIT_MISCONFIGURED = 0, 1, 3


def to_status(text: str) -> Status:
    """``text`` as a status; anything unknown is a failure."""
    return Status.parse(text) or Status.FAILED


@dataclass(frozen=True)
class CheckResult:
    """One named check of the report.

    Attributes:
        name: one of :data:`CHECKS`.
        status: ``passed``, ``failed``, ``warning`` (passed, with something to look at) or
            ``not-run`` (with the reason in ``detail``).
        detail: one line for people.
        required: whether the report's verdict counts this check (see the module doc).
        data: what was measured, for machines.
    """

    name: str
    status: Status
    detail: str
    required: bool = True
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True for ``passed`` and ``warning``."""
        return to_status(self.status).ok

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"name": self.name, "status": str(self.status), "required": self.required,
                "detail": self.detail, "data": dict(self.data)}

    @classmethod
    def from_json(cls, data: Any) -> CheckResult:
        """Rebuild a result from :meth:`to_json` output, every field's type checked.

        Raises:
            BuilderError: not an object; the name is not one of :data:`CHECKS`; the status
                not a :class:`~builder.smoke.shared.Status`; ``required`` not a boolean;
                ``detail`` not a string or ``data`` not an object.
        """
        if not isinstance(data, dict):
            raise ConfigurationError(f"a check is a {type(data).__name__}, not an object",
                                     _REPORT_HINT)
        name, status = data.get("name"), data.get("status")
        if not isinstance(name, str) or name not in CHECKS:
            raise ConfigurationError(f"check {name!r} is not one of {', '.join(CHECKS)}",
                                     _REPORT_HINT)
        known = Status.parse(status)
        if known is None:
            raise ConfigurationError(f"check {name!r} has unknown status {status!r}",
                                     f"a status is one of {', '.join(STATUSES)}")
        required, detail, extra = data.get("required"), data.get("detail"), data.get("data")
        if not isinstance(required, bool):
            raise ConfigurationError(f"check {name!r}: required is {required!r}, not true "
                                     "or false", _REPORT_HINT)
        if not isinstance(detail, str) or not isinstance(extra, dict | None):
            raise ConfigurationError(f"check {name!r}: detail must be a string and data an "
                                     "object", _REPORT_HINT)
        return cls(name, known, detail, required, dict(extra or {}))


_REPORT_HINT = "use a report written by python -m builder smoke --output, unedited"


@dataclass(frozen=True)
class SmokeReport:
    """The smoke test's report: one result per check, and what was tested.

    Attributes:
        mode: ``host`` or ``image``.
        checks: one result per check, in :data:`CHECKS` order.
        artifacts: what was tested: sglang's version and provenance digest, the kernel
            wheel's version and manifest digest, the image's id.
        misconfigured_runner: the runner could not give the image a GPU (exit status 3).
        created: UTC time of the run (ISO 8601).
        builder: the builder's version.
    """

    mode: str
    checks: tuple[CheckResult, ...]
    artifacts: Mapping[str, Any] = field(default_factory=dict)
    misconfigured_runner: bool = False
    created: str = ""
    builder: str = ""

    @property
    def unproven(self) -> list[str]:
        """The checks of :data:`ALWAYS_COUNTED` this report did not run as counted ones."""
        counted = {check.name for check in self.checks if check.required}
        return [name for name in ALWAYS_COUNTED if name not in counted]

    @property
    def passed(self) -> bool:
        """True when the runner worked, every check of :data:`ALWAYS_COUNTED` is in the
        report as a counted one, and every counted check passed (or warned)."""
        return not self.misconfigured_runner and not self.unproven and \
            all(check.ok for check in self.checks if check.required)

    @property
    def exit_status(self) -> int:
        """0 passed, 1 failed, 3 misconfigured runner."""
        return EXIT_MISCONFIGURED if self.misconfigured_runner else \
            EXIT_PASSED if self.passed else EXIT_FAILED

    def check(self, name: str) -> CheckResult:
        """The result called ``name`` (KeyError if absent)."""
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data (``schema`` 1)."""
        return {"schema": 1, "mode": self.mode, "passed": self.passed,
                "misconfigured_runner": self.misconfigured_runner, "created": self.created,
                "builder": self.builder, "artifacts": dict(self.artifacts),
                "checks": [check.to_json() for check in self.checks]}

    @classmethod
    def from_json(cls, data: Any) -> SmokeReport:
        """Rebuild a report from :meth:`to_json` output, every field's type checked.

        Raises:
            BuilderError: not a schema-1 smoke report object; the mode is not ``host`` or
                ``image``; a check is malformed or named twice; ``artifacts`` is not an
                object of objects.
        """
        if not isinstance(data, dict) or data.get("schema") != 1 \
                or not isinstance(data.get("checks"), list):
            raise ConfigurationError("not a smoke report (schema 1)", _REPORT_HINT)
        mode, artifacts = data.get("mode"), data.get("artifacts") or {}
        if mode not in ("host", "image"):
            raise ConfigurationError(f"malformed smoke report: mode {mode!r} is not host or "
                                     "image", _REPORT_HINT)
        if not isinstance(artifacts, dict) or \
                not all(isinstance(v, dict) for v in artifacts.values()):
            raise ConfigurationError("malformed smoke report: artifacts must be an object of "
                                     "objects", _REPORT_HINT)
        misconfigured = data.get("misconfigured_runner", False)
        if not isinstance(misconfigured, bool):
            raise ConfigurationError("malformed smoke report: misconfigured_runner is "
                                     f"{misconfigured!r}, not true or false", _REPORT_HINT)
        checks = tuple(CheckResult.from_json(c) for c in data["checks"])
        names = [check.name for check in checks]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ConfigurationError(f"malformed smoke report: check {', '.join(twice)} "
                                     "appears more than once", _REPORT_HINT)
        return cls(mode, checks, dict(artifacts), misconfigured,
                   str(data.get("created", "")), str(data.get("builder", "")))

    def summary(self) -> list[str]:
        """Short human summary: one line per check, then the verdict."""
        lines = []
        for check in self.checks:
            counted = "" if check.required else " (not counted)"
            lines.append(f"{check.name:<13} {check.status:<8}{counted} {check.detail}")
        verdict = ("MISCONFIGURED RUNNER" if self.misconfigured_runner else
                   "passed" if self.passed else "FAILED")
        lines.append(f"smoke ({self.mode} mode): {verdict}")
        return lines


class SmokeFailed(BuilderError):
    """The smoke test ran and did not pass; the CLI exits with :attr:`exit_status`."""

    def __init__(self, report: SmokeReport) -> None:
        failed = [c.name for c in report.checks if c.required and not c.ok]
        cause = ("the runner cannot give a container a GPU: "
                 + report.check("runner").detail if report.misconfigured_runner else
                 f"smoke test failed: {', '.join(failed)}")
        hint = ("fix the runner (NVIDIA Container Toolkit registered with the engine), not "
                "the image" if report.misconfigured_runner else
                "each check's detail says why; nothing may be published")
        super().__init__(cause, hint, report=report)
        self.exit_status = report.exit_status


def write_report(report: SmokeReport, path: Path) -> None:
    """Write the report as JSON through a temporary file and a rename."""
    atomic_write_bytes(path, (json.dumps(report.to_json(), indent=2) + "\n").encode())


def load_report(path: Path) -> SmokeReport:
    """Read a report written by :func:`write_report`.

    Raises:
        BuilderError: unreadable, or not a well-formed smoke report (the error names
            ``path``).
    """
    data = read_json_input(path, "the smoke report",
                           "run python -m builder smoke --output FILE first")
    try:
        return SmokeReport.from_json(data)
    except ConfigurationError as exc:
        raise ConfigurationError(f"smoke report {path}: {exc.cause}", exc.hint) from None


def require_passed(report: SmokeReport, *, sglang_provenance: Mapping[str, Any] | None = None,
                   kernel_manifest: Mapping[str, Any] | None = None) -> None:
    """The gate ``release`` calls: refuse unless ``report`` passed for these artifacts.

    Args:
        report: the smoke report of the run on a GPU runner.
        sglang_provenance: the provenance inside the sglang wheel to publish.
        kernel_manifest: the manifest inside the kernel wheel to publish.

    Raises:
        BuilderError: the smoke failed, or it tested other artifacts than these.
    """
    if report.unproven:
        raise PublishError(f"the smoke report did not run (as counted checks) "
                           f"{', '.join(report.unproven)}: it proves nothing; refusing to "
                           "publish", "run the smoke test on a GPU runner and give its "
                           "report as written")
    if not report.passed:
        failed = [c.name for c in report.checks if c.required and not c.ok]
        raise PublishError(f"the smoke test did not pass ({', '.join(failed) or 'runner'}); "
                           "refusing to publish", "fix it and run the smoke test again")
    tested = report.artifacts
    # The artifact the sglang check itself verified is the one the gate admits.
    checked = report.check("sglang").data.get("provenance_sha256")
    recorded = (tested.get("sglang") or {}).get("provenance_sha256")
    if sglang_provenance is not None and checked != recorded:
        raise PublishError("the smoke report's sglang artifact is not the one its sglang "
                           "check verified; refusing to publish", _REPORT_HINT)
    pairs = (("sglang", "provenance_sha256", sglang_provenance),
             ("kernels", "manifest_sha256", kernel_manifest))
    for key, field_name, artifact in pairs:
        if artifact is None:
            continue
        recorded = (tested.get(key) or {}).get(field_name)
        if recorded != sha256_json(artifact):
            raise PublishError(f"the smoke report tested another {key} artifact "
                               f"({field_name} {str(recorded)[:12]}, this one "
                               f"{sha256_json(artifact)[:12]}); refusing to publish",
                               "run the smoke test on the artifacts being published")
