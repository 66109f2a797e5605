"""Smoke stage: the checks an artifact passes on a GPU runner before it is published.

Two modes run the same checks. ``host`` tests the current Python environment (the patched
sglang wheel, FlashInfer and our ``flashinfer_jit_cache`` kernel wheel installed); ``image``
runs the same probe inside a built image with every GPU attached. The GPU-side work happens
in ``builder/smoke/script/`` (:data:`SCRIPT_DIR`), run by path as a separate process with
the tested interpreter (so a CUDA fault cannot take the report with it); this module never
imports it, it reads its output (:class:`~builder.smoke.shared.ProbeResults`), judges it,
runs the server check, and writes the report.

Checks, in order (``name``: what passes):

1. ``runner``: a CUDA device is visible; its name, compute capability, driver, CUDA runtime
   and shared memory per block (opt-in) are recorded.
2. ``sglang``: the installed sglang carries our provenance, its files equal its RECORD,
   the provenance equals the artifact's (``--sglang-wheel`` / ``--expect-provenance``), and
   every intent check of the series holds in the installed files.
3. ``lockstep``: flashinfer_python is sglang's pin; flashinfer_cubin equals it; the kernel
   wheel's version is FlashInfer's plus a local label, its manifest names the same
   FlashInfer, and its CUDA major is torch's.
4. ``kernels``: with ``FLASHINFER_DISABLE_JIT=1``, every module of the kernel wheel is found
   by FlashInfer and loads for this GPU's arch; known-answer tests (norm, activation,
   sampling) match torch; nothing was compiled at run time.
5. ``moe-autotune``: ``cutlass_fused_moe`` (bf16, fp8 from sm_89) inside ``autotune()``
   matches a torch reference with the default and the tuned tactic, and really tunes: it
   fails when no tactic was profiled or a tactic was skipped for a module missing from the
   jit-cache; tactics skipped for the hardware are warnings; the profiled count, the chosen
   tactic and the default/tuned time ratio (only when tuning happened) are reported.
6. ``server``: SGLang serves a model with ``--moe-runner-backend flashinfer_cutlass`` and
   ``FLASHINFER_DISABLE_JIT=1``, logs its autotune start and end with tactics profiled and
   none skipped for a missing module, answers ``/health`` and one ``/generate``, and its
   whole process group is gone afterwards (host mode; ``--model`` or ``--tiny-model``).
7. ``parallel``: the same model served at TP 1, TP 2 EP 1 and TP 2 EP 2 (NVLink multicast
   off) returns the same greedy tokens for the same token ids; a leg that needs more GPUs
   than are visible is not run, and the check is then ``not-run`` (host mode;
   ``--parallel`` with ``--model`` or ``--tiny-model``; :mod:`builder.smoke.parallel`).

Which checks count (:attr:`SmokeReport.passed`): 1-4 always; 5 when asked for (``--moe``)
or when it ran (the kernel wheel ships the fused MoE module for this GPU); 6 when a model
is given (``--model`` or ``--tiny-model``); 7 when asked for (``--parallel``). A counted
check passes with status ``passed`` or ``warning``; ``failed`` and ``not-run`` fail the
report. A check that needs a GPU and finds none fails with "no CUDA device": nothing is
ever pretended.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from packaging.markers import UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core.cache import atomic_write_bytes, sha256_json
from builder.core.errors import (
    BuilderError,
    ConfigurationError,
    MissingToolError,
    PublishError,
    VerificationError,
)
from builder.core.layout import Layout
from builder.core.progress import Reporter
from builder.core.userfiles import read_input, read_json_input
from builder.patching.series import Series, load_series
from builder.smoke.shared import (
    FAILED,
    NOT_RUN,
    PASSED,
    RESULT_PREFIX,
    WARNING,
    ProbeCheck,
    ProbeOutputError,
    ProbeResults,
    parse_manifest,
)
from builder.wheel.build import PROVENANCE_FILE, builder_version

Status = Literal["passed", "failed", "warning", "not-run"]
STATUSES: tuple[Status, ...] = ("passed", "failed", "warning", "not-run")
CHECKS = ("runner", "sglang", "lockstep", "kernels", "moe-autotune", "server", "parallel")
#: The checks every report must have run and counted (1-4, see the module doc): a report
#: without one of them proves nothing, whatever else it holds.
ALWAYS_COUNTED = CHECKS[:4]
EXIT_PASSED, EXIT_FAILED, EXIT_MISCONFIGURED = 0, 1, 3
#: What runs in the tested interpreter (never imported here): the probe, the tiny model's
#: writer, and the links to the two standard-library modules the probe loads beside it.
SCRIPT_DIR = Path(__file__).with_name("script")
PROBE_PATH = SCRIPT_DIR / "smoke_probe.py"
#: The files the probe needs next to it (read through the links when sent elsewhere).
PROBE_FILES = ("smoke_probe.py", "sm120_arch.py", "smoke_shared.py")
_PROBE_CHECKS = ("runner", "sglang", "versions", "kernels", "moe")


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
        return self.status in (PASSED, WARNING)

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"name": self.name, "status": self.status, "required": self.required,
                "detail": self.detail, "data": dict(self.data)}

    @classmethod
    def from_json(cls, data: Any) -> CheckResult:
        """Rebuild a result from :meth:`to_json` output, every field's type checked.

        Raises:
            BuilderError: not an object; the name is not one of :data:`CHECKS`; the status
                not one of :data:`STATUSES`; ``required`` not a boolean; ``detail`` not a
                string or ``data`` not an object.
        """
        if not isinstance(data, dict):
            raise ConfigurationError(f"a check is a {type(data).__name__}, not an object",
                                     _REPORT_HINT)
        name, status = data.get("name"), data.get("status")
        if not isinstance(name, str) or name not in CHECKS:
            raise ConfigurationError(f"check {name!r} is not one of {', '.join(CHECKS)}",
                                     _REPORT_HINT)
        if not isinstance(status, str) or status not in STATUSES:
            raise ConfigurationError(f"check {name!r} has unknown status {status!r}",
                                     f"a status is one of {', '.join(STATUSES)}")
        required, detail, extra = data.get("required"), data.get("detail"), data.get("data")
        if not isinstance(required, bool):
            raise ConfigurationError(f"check {name!r}: required is {required!r}, not true "
                                     "or false", _REPORT_HINT)
        if not isinstance(detail, str) or not isinstance(extra, dict | None):
            raise ConfigurationError(f"check {name!r}: detail must be a string and data an "
                                     "object", _REPORT_HINT)
        return cls(name, _status(status), detail, required, dict(extra or {}))


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


@dataclass(frozen=True)
class SmokeOptions:
    """What to test and how.

    Attributes:
        mode: ``host`` (this environment) or ``image`` (a container of ``image``).
        image: the image reference (image mode).
        docker_host: the engine holding it (image mode; ``None``: ``DOCKER_HOST``).
        python: the interpreter that runs the probe (host: this one; image: ``python3``).
        series: the patch series whose intent checks must hold in the installed sglang.
        sglang_wheel: the patched wheel being released: the installed provenance and RECORD
            must equal its.
        expect_provenance: a provenance JSON file to compare with instead of a wheel.
        model: a model folder for the server check (host mode).
        tiny_model: run the server check on a tiny Qwen3-MoE with random weights, written
            by ``tiny_model.py`` with the tested interpreter into a temporary folder (no
            weights to download, no tokenizer: ``--skip-tokenizer-init`` and token ids).
        moe: count check 5 even when it cannot run.
        parallel: run and count check 7 (TP 1, TP 2 EP 1, TP 2 EP 2 on the model).
        server_args: extra arguments for ``sglang.launch_server``.
        probe_output: judge this saved output of ``smoke_probe.py`` (run by hand in the
            tested environment, which then needs neither the builder nor its
            dependencies) instead of running the probe.
        probe_timeout: seconds for the probe (checks 1-5).
        server_timeout: seconds for the server to become ready.
        reporter: progress output.
    """

    mode: Literal["host", "image"] = "host"
    image: str | None = None
    docker_host: str | None = None
    python: str | None = None
    series: Path = Path("patches/series.toml")
    sglang_wheel: Path | None = None
    expect_provenance: Path | None = None
    model: Path | None = None
    tiny_model: bool = False
    moe: bool = False
    parallel: bool = False
    server_args: tuple[str, ...] = ()
    probe_output: Path | None = None
    probe_timeout: float = 3600.0
    server_timeout: float = 1800.0
    reporter: Reporter = field(default_factory=lambda: Reporter(quiet=True))


# ---------------------------------------------------------------------------------------
# Check 2: the installed sglang.


class InstalledTree:
    """Read access (:class:`builder.patching.intent.RepoReader`) to an installed sglang, by
    repository path, from the files the probe collected. An installed package has the
    sdist layout: ``python/sglang/x.py`` is ``sglang/x.py`` in site-packages.

    Args:
        files: every installed path (``sglang/...``) of the distribution.
        texts: the contents of the ones the intent checks read.
    """

    def __init__(self, files: Iterable[str], texts: Mapping[str, str]) -> None:
        self.layout = Layout("sdist")
        self.files = sorted(files)
        self.texts = dict(texts)

    def read_repo_path(self, repo_path: str) -> str | None:
        """The file's text, or ``None`` if it is not installed (or was not collected)."""
        tree = self.layout.tree_path(repo_path)
        return None if tree is None else self.texts.get(tree)

    def glob_repo_paths(self, pattern: str) -> list[str]:
        """Installed repository paths matching an ``fnmatch`` pattern, sorted."""
        paths = (self.layout.repo_path(f) for f in self.files)
        return sorted(p for p in paths if fnmatchcase(p, pattern))


def intent_patterns(series: Series) -> list[str]:
    """Installed-path patterns of every file the series' intent checks read."""
    layout = Layout("sdist")
    patterns = {layout.tree_path(check.file) for entry in series.entries
                for check in entry.intents}
    return sorted(p for p in patterns if p is not None)


def wheel_provenance(wheel: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The provenance record and the RECORD hashes (``sglang/...`` files) inside a wheel.

    Raises:
        BuilderError: not a wheel, or it has no provenance (not one of ours).
    """
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            info = next((n for n in names if n.count("/") == 1
                         and n.endswith(f".dist-info/{PROVENANCE_FILE}")), None)
            record_name = next((n for n in names if n.count("/") == 1
                                and n.endswith(".dist-info/RECORD")), None)
            if info is None or record_name is None:
                raise ConfigurationError(f"{wheel} has no {PROVENANCE_FILE} (or no RECORD)",
                                         "pass a wheel built by python -m builder wheel")
            provenance = json.loads(archive.read(info))
            record = archive.read(record_name).decode()
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigurationError(f"cannot read the wheel {wheel}: {exc}",
                                 "pass the patched sglang wheel (dist/sglang-*.whl)") from None
    hashes = {row[0]: row[1] for row in csv.reader(io.StringIO(record))  # paths may hold ","
              if len(row) == 3 and row[0].startswith("sglang/") and row[1]}
    return provenance, hashes


def check_sglang(data: ProbeCheck | None, series: Series, *,
                 expected: Mapping[str, Any] | None = None,
                 expected_record: Mapping[str, str] | None = None) -> CheckResult:
    """Judge check 2 from the probe's ``sglang-data``.

    Args:
        data: the probe's collection (``None``: the probe never got there).
        series: the series whose intent checks must hold.
        expected: the artifact's provenance (``None``: not compared, a warning).
        expected_record: the artifact wheel's RECORD hashes of ``sglang/...`` files.
    """
    name = "sglang"
    if data is None or data.status != PASSED:
        return CheckResult(name, FAILED, data.detail if data and data.detail else
                           "no data from the probe")
    info = data.data
    if info.get("provenance") is None:
        return CheckResult(name, FAILED, f"sglang {info['version']} has no "
                           f"{PROVENANCE_FILE}: it is not a wheel of this project",
                           data={"version": info["version"]})
    provenance, unusable = _provenance_record(info["provenance"])
    if unusable:
        return CheckResult(name, FAILED, f"sglang {info['version']}'s {PROVENANCE_FILE} "
                           f"{unusable}: it is not a provenance record of this project",
                           data={"version": info["version"]})
    problems = []
    summary = {"version": info["version"], "provenance_sha256": sha256_json(provenance),
               "target": provenance.get("target"),
               "upstream_version": provenance.get("upstream_version")}
    if provenance.get("version") != info["version"]:
        problems.append(f"installed version {info['version']} but the provenance says "
                        f"{provenance.get('version')}")
    if info["mismatched"] or info["missing"]:
        changed = [*info["mismatched"], *info["missing"]]
        problems.append(f"{len(changed)} installed files differ from the RECORD "
                        f"(edited after install?): {', '.join(changed[:3])}")
    if expected is not None and dict(expected) != provenance:
        keys = sorted(k for k in set(expected) | set(provenance)
                      if expected.get(k) != provenance.get(k))
        problems.append(f"the provenance differs from the artifact's in {', '.join(keys)}")
    if expected_record is not None:
        installed = {k: v for k, v in info["record"].items() if v}
        differ = sorted(k for k in set(expected_record) | set(installed)
                        if expected_record.get(k) != installed.get(k))
        if differ:
            problems.append(f"{len(differ)} installed files differ from the wheel's: "
                            f"{', '.join(differ[:3])}")
    intents = []
    reader = InstalledTree(info["record"], info["texts"])
    patches = {p["name"]: p for p in provenance.get("patches", [])}
    for entry in series.entries:
        recorded = patches.get(entry.name)
        if recorded is None or recorded.get("status") in ("not-applicable", "not-reached"):
            continue
        if entry.sha256 is not None and recorded.get("sha256") != entry.sha256:
            problems.append(f"{entry.name}: the series pins sha256 {entry.sha256[:12]} but "
                            f"the wheel was built with {str(recorded.get('sha256'))[:12]}")
            continue
        for check in entry.intents:
            outcome = check.evaluate_tree(reader)
            intents.append({"patch": entry.name, "check": check.describe(),
                            "holds": outcome.holds, "detail": outcome.detail})
            if not outcome.holds:
                problems.append(f"intent of {entry.name} fails in the installed file: "
                                f"{outcome.detail}")
    if not intents and not problems:
        problems.append(f"no patch of {series.path} applies to the installed sglang "
                        f"{provenance.get('upstream_version')}: its intent was not checked")
    summary["intents"] = intents
    summary["compared_with"] = "artifact" if expected is not None else None
    if problems:
        return CheckResult(name, FAILED, "; ".join(problems), data=summary)
    held = "; ".join(f"{i['patch']}: {i['detail']}" for i in intents)
    detail = f"sglang {info['version']} ({provenance.get('target')}); intent holds: {held}"
    if expected is None:
        return CheckResult(name, WARNING, detail + "; not compared with an artifact (give "
                           "--sglang-wheel or --expect-provenance)", data=summary)
    return CheckResult(name, PASSED, detail + "; provenance equals the artifact's",
                       data=summary)


def _provenance_record(text: str) -> tuple[dict[str, Any], str | None]:
    """The installed provenance record parsed, or why it cannot be judged.

    Returns:
        The record and ``None``, or ``{}`` and what is wrong with it (not JSON, not an
        object, ``patches`` not a list of objects with a string ``name``).
    """
    try:
        provenance = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return {}, f"is not JSON ({exc})"
    if not isinstance(provenance, dict):
        return {}, f"is a JSON {type(provenance).__name__}, not an object"
    patches = provenance.get("patches", [])
    if not isinstance(patches, list) or not all(
            isinstance(p, dict) and isinstance(p.get("name"), str) for p in patches):
        return {}, "has patches that are not a list of objects with a string name"
    return provenance, None


# ---------------------------------------------------------------------------------------
# Check 3: lockstep versions.


def _pin(requires: Sequence[str], project: str) -> Version | None:
    """The exact (==) version ``requires`` pins ``project`` to (unconditional ones only)."""
    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) != canonicalize_name(project):
            continue
        try:
            if requirement.marker is not None and \
                    not requirement.marker.evaluate({"extra": ""}):
                continue
        except (UndefinedComparison, UndefinedEnvironmentName):  # e.g. os_name ~= "x"
            continue  # a marker that cannot be judged pins nothing
        pins = [s.version for s in requirement.specifier if s.operator == "=="]
        if len(pins) == 1:
            try:
                return Version(pins[0])
            except InvalidVersion:
                return None
    return None


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def check_lockstep(versions: ProbeCheck | None,
                   sglang_requires: Sequence[str]) -> CheckResult:
    """Judge check 3 from the probe's ``versions-data`` and sglang's requirements.

    FlashInfer's own rules (flashinfer 0.6.3, ``jit/env.py``): flashinfer_cubin's version
    must equal flashinfer's; flashinfer_jit_cache's must start with it. Ours is stricter:
    the kernel wheel's public version equals FlashInfer's, and its manifest agrees.
    """
    name = "lockstep"
    if versions is None or versions.status != PASSED:
        return CheckResult(name, FAILED, versions.detail if versions and versions.detail
                           else "no data from the probe")
    info = versions.data
    found = {k: _version(v) for k, v in info["versions"].items()}
    flashinfer, cubin = found["flashinfer-python"], found["flashinfer-cubin"]
    jit_cache = found["flashinfer-jit-cache"]
    data = {"installed": info["versions"], "torch_cuda": info.get("torch_cuda")}
    problems = []
    wanted = {p: _pin(sglang_requires, p) for p in ("flashinfer_python", "flashinfer_cubin")}
    data["sglang_pins"] = {k: str(v) if v else None for k, v in wanted.items()}
    if flashinfer is None:
        return CheckResult(name, FAILED, "flashinfer_python is not installed", data=data)
    if wanted["flashinfer_python"] and flashinfer != wanted["flashinfer_python"]:
        problems.append(f"flashinfer_python {flashinfer} but sglang pins "
                        f"{wanted['flashinfer_python']}")
    if cubin is None:
        if wanted["flashinfer_cubin"] is not None:
            problems.append(f"flashinfer_cubin is not installed (sglang pins "
                            f"flashinfer_cubin=={wanted['flashinfer_cubin']})")
    elif cubin != flashinfer:
        problems.append(f"flashinfer_cubin {cubin} differs from flashinfer_python "
                        f"{flashinfer} (FlashInfer refuses to import)")
    if jit_cache is None:
        problems.append("flashinfer_jit_cache (the kernel wheel) is not installed")
    elif Version(jit_cache.public) != flashinfer or not jit_cache.local:
        problems.append(f"flashinfer_jit_cache {jit_cache} is not flashinfer_python "
                        f"{flashinfer} plus a local label")
    manifest = info.get("manifest")
    if jit_cache is not None and manifest is None:
        problems.append(f"the kernel wheel's manifest: {info.get('manifest_error')}")
    elif manifest is not None:
        try:
            parsed = parse_manifest(manifest)
        except ValueError as exc:
            problems.append(f"the kernel wheel's manifest: {exc}")
        else:
            data["manifest"] = {"flashinfer_version": parsed.flashinfer_version,
                                "version": parsed.version, "arch_list": parsed.arch_list,
                                "cuda_version": parsed.cuda_version,
                                "modules": [m.name for m in parsed.modules]}
            if _version(parsed.flashinfer_version) != flashinfer:
                problems.append(f"the kernels were built for FlashInfer "
                                f"{parsed.flashinfer_version}, not {flashinfer}")
            if jit_cache is not None and _version(parsed.version) != jit_cache:
                problems.append(f"the manifest says version {parsed.version} but "
                                f"flashinfer_jit_cache {jit_cache} is installed")
            torch_cuda = info.get("torch_cuda")
            if torch_cuda and parsed.cuda_version and \
                    parsed.cuda_version.split(".")[0] != str(torch_cuda).split(".")[0]:
                problems.append(f"the kernels were built with CUDA {parsed.cuda_version} "
                                f"but torch uses CUDA {torch_cuda}")
    if problems:
        return CheckResult(name, FAILED, "; ".join(problems), data=data)
    return CheckResult(name, PASSED, f"flashinfer_python {flashinfer}, flashinfer_cubin "
                       f"{cubin or 'not installed (not pinned)'}, flashinfer_jit_cache "
                       f"{jit_cache}", data=data)


# ---------------------------------------------------------------------------------------
# Running the probe and assembling the report.


@dataclass(frozen=True)
class ProbeRun:
    """The probe's results, and how it ended."""

    results: ProbeResults
    exit_code: int | None
    stderr_tail: str


def _is_list_of_str(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _is_str_map(value: object, *, nullable: bool = False) -> bool:
    """Whether ``value`` is an object of strings (or ``null`` values, with ``nullable``)."""
    return isinstance(value, dict) and all(
        isinstance(item, str) or (nullable and item is None) for item in value.values())


#: The data keys the host reads from each collecting result, with the test of each value's
#: shape (what the probe's ``collect_sglang`` and ``collect_versions`` write).
_DATA_SHAPES: dict[str, dict[str, tuple[str, Any]]] = {
    "sglang-data": {
        "version": ("a string", lambda v: isinstance(v, str)),
        "provenance": ("a string or null", lambda v: v is None or isinstance(v, str)),
        "requires": ("a list of strings", _is_list_of_str),
        "record": ("an object of strings or nulls", lambda v: _is_str_map(v, nullable=True)),
        "mismatched": ("a list of strings", _is_list_of_str),
        "missing": ("a list of strings", _is_list_of_str),
        "texts": ("an object of strings", _is_str_map),
    },
    "versions-data": {
        "versions": ("an object of strings or nulls", lambda v: _is_str_map(v, nullable=True)),
        "manifest": ("an object or null", lambda v: v is None or isinstance(v, dict)),
        "manifest_error": ("a string or null", lambda v: v is None or isinstance(v, str)),
        "torch_cuda": ("a string or null", lambda v: v is None or isinstance(v, str)),
    },
}
#: The flashinfer packages check 3 looks up in ``versions-data``'s ``versions``.
_LOCKSTEP_PACKAGES = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")


def _required_keys(check: ProbeCheck) -> tuple[str, ...]:
    """The data keys the host reads unconditionally from ``check`` (what the probe always
    writes for a passed collection; a manifest's artifact digest needs the versions too)."""
    data = check.data
    if check.name == "sglang-data" and check.status == PASSED:
        return ("version",) if data.get("provenance") is None else \
            ("version", "record", "mismatched", "missing", "texts")
    if check.name == "versions-data" and (check.status == PASSED or
                                          data.get("manifest") is not None):
        return ("versions",)
    return ()


def check_probe_data(results: ProbeResults) -> None:
    """Refuse results whose data the host could not judge: a key it reads is missing or of
    another type than the probe writes (an edited or foreign output, never a traceback).

    Args:
        results: the parsed results.

    Raises:
        ProbeOutputError: the first such key, named with its result.
    """
    for check in (results.sglang_data, results.versions_data):
        if check is None:
            continue
        for key in _required_keys(check):
            if key not in check.data:
                raise ProbeOutputError(f"probe result {check.name!r} ({check.status}) has no "
                                       f"data key {key!r}")
        for key, (shape, test) in _DATA_SHAPES[check.name].items():
            if key in check.data and not test(check.data[key]):
                raise ProbeOutputError(f"probe result {check.name!r}: data key {key!r} must be "
                                       f"{shape}, not {check.data[key]!r:.60}")
        versions = check.data.get("versions")
        if check.name == "versions-data" and versions is not None:
            absent = [name for name in _LOCKSTEP_PACKAGES if name not in versions]
            if absent:
                raise ProbeOutputError(f"probe result 'versions-data': versions names no "
                                       f"{', '.join(absent)} (null when not installed)")


def parse_probe_output(stdout: str, saved: Path | None = None) -> ProbeResults:
    """The probe's results from its standard output (other lines are ignored).

    Args:
        stdout: the probe's standard output.
        saved: the file it was read from (``--probe-output``), or ``None`` for a run.

    Raises:
        VerificationError: a result line of a run is malformed, or its data is not what
            the probe writes (:func:`check_probe_data`).
        ConfigurationError: a line or the data of a saved output is, or it has no result
            line (the user's file).
    """
    if saved is not None and not any(line.startswith(RESULT_PREFIX)
                                     for line in stdout.splitlines()):
        raise ConfigurationError(f"{saved} is not the probe's output: it has no line "
                                 f"starting {RESULT_PREFIX!r}",
                                 "give the unedited standard output of smoke_probe.py")
    try:
        results = ProbeResults.from_output(stdout)
        check_probe_data(results)
        return results
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


def _tail(text: str, lines: int = 8) -> str:
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
                        f"killed after {timeout:g} s\n{_tail(err)}")
    except OSError as exc:
        raise MissingToolError(f"cannot run {python}: {exc.strerror}",
                               "--python must be the interpreter of the environment to test"
                               ) from None
    return ProbeRun(parse_probe_output(done.stdout), done.returncode, _tail(done.stderr))


def _status(text: str) -> Status:
    """``text`` as a status; anything unknown is a failure."""
    for status in STATUSES:
        if text == status:
            return status
    return "failed"


def _from_probe(name: str, result: ProbeCheck | None, run: ProbeRun,
                required: bool = True) -> CheckResult:
    if result is None:
        how = "was killed" if run.exit_code is None else f"exited with code {run.exit_code}"
        return CheckResult(name, FAILED, f"the probe {how} before this check finished: "
                           f"{run.stderr_tail.splitlines()[-1] if run.stderr_tail else ''}",
                           required, {"stderr_tail": run.stderr_tail})
    return CheckResult(name, _status(result.status), result.detail, required,
                       dict(result.data))


def assemble(mode: str, run: ProbeRun, series: Series, *, moe: bool,
             expected: Mapping[str, Any] | None, expected_record: Mapping[str, str] | None,
             server: CheckResult, artifacts: Mapping[str, Any],
             parallel: CheckResult | None = None) -> SmokeReport:
    """Judge the probe's results and build the report (pure: no GPU, no processes).

    ``parallel`` is check 7's result (``None``: not asked for, not counted).
    """
    results = run.results
    sglang_data = results.sglang_data
    requires = list(sglang_data.data.get("requires", [])) if sglang_data and \
        sglang_data.status == PASSED else []
    moe_result = results.moe_autotune
    moe_required = moe or (moe_result is not None and moe_result.status != NOT_RUN)
    sglang_check = _from_probe("sglang", None, run) if sglang_data is None else \
        check_sglang(sglang_data, series, expected=expected, expected_record=expected_record)
    versions = results.versions_data
    lockstep = _from_probe("lockstep", None, run) if versions is None else \
        check_lockstep(versions, requires)
    runner = _from_probe("runner", results.runner, run)
    checks = (
        runner,
        sglang_check,
        lockstep,
        _from_probe("kernels", results.kernels, run),
        _from_probe("moe-autotune", moe_result, run, moe_required),
        server,
        parallel or CheckResult("parallel", NOT_RUN, "not asked for (--parallel)",
                                required=False),
    )
    found = dict(artifacts)
    if sglang_check.data.get("provenance_sha256"):
        found["sglang"] = {"version": sglang_check.data["version"],
                           "provenance_sha256": sglang_check.data["provenance_sha256"]}
    if versions is not None and versions.data.get("manifest") is not None:
        found["kernels"] = {"version": (versions.data.get("versions") or {}).get(
                                "flashinfer-jit-cache"),
                            "manifest_sha256": sha256_json(versions.data["manifest"])}
    if runner.ok:
        found["runner"] = {k: runner.data.get(k) for k in ("gpu", "compute_capability",
                                                          "driver", "cuda_runtime")}
    return SmokeReport(mode, checks, found, created=_now(), builder=builder_version())


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


#: ``tiny_model.py``: run by path with the tested interpreter, like the probe.
TINY_MODEL_PATH = SCRIPT_DIR / "tiny_model.py"
SKIP_TOKENIZER = "--skip-tokenizer-init"
#: The prompt's token ids when the server has no tokenizer (any ids below the vocab size).
PROMPT_IDS = tuple(range(1, 17))


class _Model:
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


def _server_check(options: SmokeOptions, no_gpu: ProbeCheck | None,
                  served: _Model) -> CheckResult:
    if options.model is None and not options.tiny_model:
        return CheckResult("server", NOT_RUN, "no model given (--model PATH or --tiny-model)",
                           required=False)
    if no_gpu is not None:  # the probe found none: SGLang would only fail later, less clearly
        return CheckResult("server", FAILED, no_gpu.detail, True)
    got = served.get()
    if isinstance(got, str):
        return CheckResult("server", FAILED, got, True)
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
        return "could not write the tiny model: " + _tail(done.stderr)[-300:]
    made: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return made


def _parallel_check(options: SmokeOptions, runner: ProbeCheck | None,
                    served: _Model) -> CheckResult:
    """Check 7 with the model of check 6 (see :mod:`builder.smoke.parallel`)."""
    from builder.smoke.parallel import expert_count, run_parallel_check
    from builder.smoke.server import server_env, sglang_command

    devices = runner.data.get("devices") if runner is not None else None
    if runner is None or not isinstance(devices, int) or isinstance(devices, bool) or \
            devices < 1:
        return CheckResult("parallel", FAILED, runner.detail if runner is not None and
                           runner.detail else "the probe counted no CUDA device", True)
    got = served.get()
    if isinstance(got, str):
        return CheckResult("parallel", FAILED, got, True)
    model, made = got
    with tempfile.TemporaryDirectory(prefix="sm120-parallel-") as scratch:
        try:
            experts = expert_count(model)
        except (OSError, ValueError) as exc:
            return CheckResult("parallel", FAILED, f"cannot read {model}/config.json: {exc}",
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
    return CheckResult("parallel", _status(outcome.status), outcome.detail, True,
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
    return CheckResult("server", _status(outcome.status), outcome.detail, True, data)


def run_smoke(options: SmokeOptions) -> SmokeReport:
    """Run the smoke test and return its report (which may say it failed).

    Raises:
        BuilderError: bad input: no ``--image`` in image mode, an image the engine does not
            have, an unreadable series, wheel or provenance file, an interpreter that cannot
            run; ``--parallel`` without a model, outside host mode or with a parallel size
            in ``--server-arg``.
    """
    if options.parallel:
        _parallel_rules(options)
    if options.model is not None or options.tiny_model:
        given = "--model" if options.model is not None else "--tiny-model"
        if options.mode == "image":
            raise ConfigurationError(f"{given}: the server check runs in host mode only",
                                     "run `smoke host` inside the image for check 6, or "
                                     f"leave {given} out")
        if options.probe_output is not None:
            raise ConfigurationError(f"{given} with --probe-output would start SGLang here, not "
                                     "where the probe ran", f"leave {given} out, or run the smoke "
                                     "in the tested environment")
    series = load_series(options.series)
    expected, expected_record = _expected(options)
    args = probe_arguments(intent_patterns(series), options.moe)
    artifacts: dict[str, Any] = {}
    if options.mode == "image":
        from builder.smoke.container import EngineRefused, docker_client, run_in_image

        if not options.image:
            raise ConfigurationError("image mode needs --image REF", "name a built image")
        options.reporter.info(f"Running the probe in {options.image} with every GPU ...")
        try:
            container = run_in_image(
                options.image, [options.python or "python3",
                                "/sm120-smoke/smoke_probe.py", *args],
                files={f"sm120-smoke/{name}": data for name, data in probe_files().items()},
                environment={"FLASHINFER_DISABLE_JIT": "1"}, timeout=options.probe_timeout,
                client=docker_client(options.docker_host))
        except EngineRefused as exc:
            return _refused(str(exc), exc.fault, options.image)
        artifacts["image"] = {"ref": options.image, "id": container.image_id}
        run = ProbeRun(parse_probe_output(container.stdout), container.exit_code,
                       _tail(container.stderr))
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
        served = _Model(options, Path(scratch))  # checks 6 and 7 serve one model
        server = _server_check(options, run.results.no_device(), served)
        parallel = _parallel_check(options, run.results.runner, served) \
            if options.parallel else None
    return assemble(options.mode, run, series, moe=options.moe, expected=expected,
                    expected_record=expected_record, server=server, artifacts=artifacts,
                    parallel=parallel)


def _parallel_rules(options: SmokeOptions) -> None:
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


def _refused(message: str, fault: str, image: str) -> SmokeReport:
    """The report when the engine would not start the container."""
    misconfigured = fault == "misconfigured-runner"
    reason = "the runner could not start the container" if misconfigured else \
        "the image could not start"
    runner = CheckResult("runner", FAILED, ("misconfigured runner: " if misconfigured
                                            else "broken image: ") + message,
                         data={"engine_error": message, "fault": fault})
    rest = tuple(CheckResult(name, NOT_RUN, reason,
                             name not in ("moe-autotune", "server", "parallel"))
                 for name in CHECKS[1:])
    return SmokeReport("image", (runner, *rest), {"image": {"ref": image}},
                       misconfigured_runner=misconfigured, created=_now(),
                       builder=builder_version())


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
