"""What the smoke probe and the builder both read: the probe's typed results, FlashInfer's
log rules and the kernel wheel's manifest format (standard library only).

The probe (``builder/smoke/script/smoke_probe.py``) runs in the tested interpreter without
the builder and loads this file by path (``builder/smoke/script/smoke_shared.py`` is a link
to it, shipped next to the probe into an image); the builder imports it as
:mod:`builder.smoke.shared` to read the probe's output and judge the server's log. One
definition serves both sides, so the two cannot drift.

Facts about FlashInfer used here, read in ``flashinfer_python`` 0.6.3's source:

* ``autotuner.py``: tactics that fail while profiling are logged through the
  ``flashinfer.jit`` logger as ``[Autotuner]: Skipping tactic {runner} {tactic}, due to
  failure while profiling: {error}`` (line 497); a debug line for each tactic it timed
  (line 603) and one for the (runner, tactic) it chose per shape profile (line 534).
* ``jit/core.py``: ``MissingJITCacheError``'s text (line 291) when
  ``FLASHINFER_DISABLE_JIT`` is set and a module is not in the jit-cache.
* ``data/csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/
  moe_gemm_tma_ws_launcher.inl`` line 698: the error of a CUTLASS TMA warp-specialised
  grouped GEMM that cannot initialise, for example for lack of shared memory.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Final, TypeVar

#: What starts each result line of the probe's standard output (then one JSON object).
RESULT_PREFIX: Final = "SM120-SMOKE "
#: The kernel wheel's manifest, beside its modules.
MANIFEST_FILE: Final = "sm120-manifest.json"


class Status(str, enum.Enum):  # noqa: UP042 (StrEnum is 3.11+: see below)
    """A check's outcome, the one list of them: the probe prints it, the report records it.

    A ``str`` enum, not ``enum.StrEnum`` (new in Python 3.11): this file runs in the tested
    interpreter, the image's, which the builder's own floor does not bind. It compares
    equal to its text and JSON writes it as that text.
    """

    #: the check held.
    PASSED = "passed"
    #: it did not, or could not be run where it had to be.
    FAILED = "failed"
    #: it held, with something to look at.
    WARNING = "warning"
    #: it was not run (the reason is in the detail).
    NOT_RUN = "not-run"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @property
    def ok(self) -> bool:
        """True for ``passed`` and ``warning``."""
        return self in (Status.PASSED, Status.WARNING)

    @classmethod
    def parse(cls, text: object) -> Status | None:
        """``text`` as a status, or ``None`` when it is not one's text (any JSON value)."""
        return next((status for status in cls if status.value == text), None) \
            if isinstance(text, str) else None


#: Every status's text, in :class:`Status` order (for messages).
STATUSES: Final = tuple(status.value for status in Status)


class ProbeOutputError(ValueError):
    """The probe's output is not what the probe writes (one message says where)."""


class Reason(enum.Enum):
    """Why a check that needs a GPU could not use one (``None``: it could)."""

    #: torch imports, but sees no CUDA device (or the driver fails).
    NO_DEVICE = "no-device"
    #: torch is not installed in the tested environment.
    NO_TORCH = "no-torch"


@dataclass(frozen=True)
class ProbeCheck:
    """One check's result as the probe prints it.

    Attributes:
        name: the result's name (:data:`ProbeResults.NAMES`).
        status: its :class:`Status`.
        detail: one line for people.
        data: what was measured, for the host's judgement and the report.
        reason: why there was no GPU to check with, when that is why it failed.
    """

    name: str
    status: Status
    detail: str
    data: dict[str, Any] = field(default_factory=dict)
    reason: Reason | None = None

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data (``reason`` only when there is one)."""
        out: dict[str, Any] = {"name": self.name, "status": str(self.status),
                               "detail": self.detail, "data": self.data}
        if self.reason is not None:
            out["reason"] = self.reason.value
        return out

    @classmethod
    def from_json(cls, data: object) -> ProbeCheck:
        """Read one result written by :meth:`to_json`.

        Raises:
            ProbeOutputError: not an object, a key missing or mistyped, an unknown status
                or reason.
        """
        if not isinstance(data, dict):
            raise ProbeOutputError(f"a probe result is a JSON object, not {data!r:.60}")
        name, status, detail = data.get("name"), data.get("status"), data.get("detail")
        found = data.get("data", {})
        if not isinstance(name, str) or not isinstance(detail, str) or \
                not isinstance(found, dict):
            raise ProbeOutputError(f"probe result {name!r}: needs a string name and detail "
                                   "and an object data")
        known = Status.parse(status)
        if known is None:
            raise ProbeOutputError(f"probe result {name!r} has unknown status {status!r} "
                                   f"(one of {', '.join(STATUSES)})")
        try:
            reason = None if data.get("reason") is None else Reason(data["reason"])
        except ValueError:
            raise ProbeOutputError(f"probe result {name!r} has unknown reason "
                                   f"{data['reason']!r}") from None
        return cls(name, known, detail, found, reason)


# ---------------------------------------------------------------------------------------
# What each result carries in ``data``: one dataclass per payload. The probe writes them
# (:meth:`ProbeData.to_json`); the host checks and reads them (:meth:`ProbeData.read`),
# with the shapes taken from the fields' types, so the two sides cannot drift.

_Data = TypeVar("_Data", bound="ProbeData")
#: How each JSON value type is named in messages: (one, several).
_TYPE_NAMES: dict[object, tuple[str, str]] = {
    str: ("a string", "strings"), int: ("an integer", "integers"),
    float: ("a number", "numbers"), bool: ("true or false", "booleans"),
    type(None): ("null", "nulls")}


def _is_union(hint: object) -> bool:
    return typing.get_origin(hint) in (typing.Union, getattr(types, "UnionType", None))


def describe(hint: object, plural: bool = False) -> str:
    """How a JSON value of the type ``hint`` is named in a message (``a list of strings``,
    ``an object of strings or nulls``, ``an object or null``)."""
    args = typing.get_args(hint)
    if _is_union(hint):
        return " or ".join(describe(arg, plural) for arg in args)
    origin = typing.get_origin(hint)
    if origin in (list, dict):
        item = args[-1]
        head = {list: ("a list", "lists"), dict: ("an object", "objects")}[origin][plural]
        return head if item is Any else f"{head} of {describe(item, plural=True)}"
    return _TYPE_NAMES[hint][plural]


def conforms(value: object, hint: object) -> bool:
    """Whether the JSON value ``value`` has the type ``hint`` (``Any`` takes anything; a
    boolean is no number; an integer is a ``float``, as JSON writes ``2.0`` as ``2``)."""
    if hint is Any:
        return True
    if _is_union(hint):
        return any(conforms(value, arg) for arg in typing.get_args(hint))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return isinstance(value, list) and all(conforms(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(conforms(item, args[1])
                                               for item in value.values())
    if hint is type(None):
        return value is None
    if isinstance(value, bool):
        return hint is bool
    if hint is float:
        return isinstance(value, int | float)
    return isinstance(hint, type) and isinstance(value, hint)


@dataclass(frozen=True)
class ProbeData:
    """A result's ``data`` as a dataclass: written by the probe, checked and read by the
    host. A field without a default is needed in a passed result (:meth:`needed`); every
    field present must have its type; other keys (a crashed check's ``trace``) are kept in
    the report and not read."""

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object, one key per field, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def needed(cls, status: Status, data: Mapping[str, Any]) -> tuple[str, ...]:
        """The keys a result with ``status`` and ``data`` must have (the host reads them):
        the fields without a default when it passed."""
        return tuple(f.name for f in fields(cls) if status == Status.PASSED and
                     f.default is MISSING and f.default_factory is MISSING)

    @classmethod
    def check(cls, check: ProbeCheck) -> None:
        """Refuse ``check``'s data when the host could not read it.

        Raises:
            ProbeOutputError: a needed key is missing, or a key is not of its field's type
                (the first one, named with its result).
        """
        for key in cls.needed(check.status, check.data):
            if key not in check.data:
                raise ProbeOutputError(f"probe result {check.name!r} ({check.status}) has no "
                                       f"data key {key!r}")
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if f.name in check.data and not conforms(check.data[f.name], hints[f.name]):
                raise ProbeOutputError(f"probe result {check.name!r}: data key {f.name!r} must "
                                       f"be {describe(hints[f.name])}, not "
                                       f"{check.data[f.name]!r:.60}")

    @classmethod
    def from_json(cls: type[_Data], data: Mapping[str, Any]) -> _Data:
        """Build the payload from its JSON object (keys that are no field are left out;
        the values are taken as they are: :meth:`check` judges them).

        Raises:
            ProbeOutputError: a field without a default has no key.
        """
        names = {f.name for f in fields(cls)}
        absent = [f.name for f in fields(cls) if f.default is MISSING and
                  f.default_factory is MISSING and f.name not in data]
        if absent:
            raise ProbeOutputError(f"{cls.__name__} needs the data key {absent[0]!r}")
        return cls(**{key: value for key, value in data.items() if key in names})

    @classmethod
    def read(cls: type[_Data], check: ProbeCheck | None) -> _Data | None:
        """The payload of ``check``, checked (``None``: no result, or it lacks a field
        without a default, as a failed one does).

        Raises:
            ProbeOutputError: as :meth:`check`.
        """
        if check is None:
            return None
        cls.check(check)
        try:
            return cls.from_json(check.data)
        except ProbeOutputError:
            return None


@dataclass(frozen=True)
class RunnerInfo(ProbeData):
    """Check 1's data without a GPU: torch's version and CUDA (none without torch)."""

    torch: str | None = None
    torch_cuda: str | None = None


@dataclass(frozen=True)
class RunnerData(RunnerInfo):
    """Check 1's data: the first GPU and its software (every field may be absent in a
    result the host reads: it records what there is)."""

    gpu: str | None = None
    devices: int | None = None
    compute_capability: str | None = None
    flashinfer_arch: str | None = None
    driver: str | None = None
    driver_cuda: str | None = None
    cuda_runtime: str | None = None
    shared_memory_per_block_optin: int | None = None
    multiprocessors: int | None = None
    memory_gib: float | None = None


@dataclass(frozen=True)
class SglangData(ProbeData):
    """The installed sglang, for check 2 (``sglang-data``).

    Attributes:
        version: its version.
        provenance: the text of its ``sm120-provenance.json`` (``None``: not ours).
        requires: its ``Requires-Dist`` lines.
        record: its RECORD's hash (``sha256=...``, ``None`` when unhashed) per installed
            ``sglang/`` path.
        mismatched: the paths whose file differs from the RECORD.
        missing: the hashed paths with no file.
        texts: the text of the paths the intent checks read.
    """

    version: str
    provenance: str | None = None
    requires: list[str] = field(default_factory=list)
    record: dict[str, str | None] = field(default_factory=dict)
    mismatched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)

    @classmethod
    def needed(cls, status: Status, data: Mapping[str, Any]) -> tuple[str, ...]:
        """The version when it passed; with a provenance, the files too (not read without
        one: such an sglang fails check 2 at once)."""
        if status != Status.PASSED:
            return ()
        return ("version",) if data.get("provenance") is None else \
            ("version", "record", "mismatched", "missing", "texts")


#: The flashinfer packages check 3 looks up in ``versions-data``'s ``versions``.
LOCKSTEP_PACKAGES: Final = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")


@dataclass(frozen=True)
class VersionsData(ProbeData):
    """FlashInfer's packages and the kernel wheel's manifest, for check 3
    (``versions-data``).

    Attributes:
        versions: installed version per project (``None``: not installed); names at
            least :data:`LOCKSTEP_PACKAGES`.
        manifest: the kernel wheel's manifest as found (``None``: not readable).
        manifest_error: why it was not readable.
        torch_cuda: torch's CUDA version.
    """

    versions: dict[str, str | None]
    manifest: dict[str, Any] | None = None
    manifest_error: str | None = None
    torch_cuda: str | None = None

    @classmethod
    def needed(cls, status: Status, data: Mapping[str, Any]) -> tuple[str, ...]:
        """The versions when it passed or has a manifest (the report's artifact digest
        names the kernel wheel's version)."""
        return ("versions",) if status == Status.PASSED or data.get("manifest") is not None \
            else ()

    @classmethod
    def check(cls, check: ProbeCheck) -> None:
        """As :meth:`ProbeData.check`, and ``versions`` names every package of
        :data:`LOCKSTEP_PACKAGES` (null when not installed).

        Raises:
            ProbeOutputError: the first thing wrong.
        """
        super().check(check)
        versions = check.data.get("versions")
        if versions is not None:
            absent = [name for name in LOCKSTEP_PACKAGES if name not in versions]
            if absent:
                raise ProbeOutputError(f"probe result 'versions-data': versions names no "
                                       f"{', '.join(absent)} (null when not installed)")


@dataclass(frozen=True)
class KernelsData(ProbeData):
    """Check 4's data: each module of the kernel wheel, each known-answer test, and what
    was compiled at run time (the host copies it into the report)."""

    jit_cache_dir: str
    disable_jit: str | None
    modules: list[dict[str, Any]]
    known_answer_tests: list[dict[str, Any]]
    compiled_at_run_time: list[str]


@dataclass(frozen=True)
class MoeModule(ProbeData):
    """Check 5's data when it did not run: the fused MoE module it would have used."""

    module: str


@dataclass(frozen=True)
class MoeData(MoeModule):
    """Check 5's data: each variant's numbers and autotune summary, the autotuner's
    warnings (the host copies it into the report)."""

    variants: list[dict[str, Any]]
    warnings: dict[str, int]
    autotuner_module: str
    autotuner_module_shipped: bool
    tactics_missing_a_module: int
    warning_lines: list[str]


@dataclass(frozen=True)
class CrashData(ProbeData):
    """The data of a check that raised: where."""

    trace: str



@dataclass(frozen=True)
class ProbeResults:
    """The probe's results, one field per result (``None``: the probe never printed it,
    because it was killed or crashed before, or was not asked for it).

    Attributes:
        runner: check 1, the GPU and its software.
        sglang_data: the installed sglang, for check 2.
        versions_data: FlashInfer's packages and the manifest, for check 3.
        kernels: check 4.
        moe_autotune: check 5.
    """

    runner: ProbeCheck | None = None
    sglang_data: ProbeCheck | None = None
    versions_data: ProbeCheck | None = None
    kernels: ProbeCheck | None = None
    moe_autotune: ProbeCheck | None = None

    #: The payload the host reads of each result, by name (the others it copies).
    PAYLOADS: ClassVar[dict[str, type[ProbeData]]] = {
        "runner": RunnerData, "sglang-data": SglangData, "versions-data": VersionsData}
    #: The result names the probe prints, by field.
    NAMES: ClassVar[dict[str, str]] = {"runner": "runner", "sglang_data": "sglang-data",
                    "versions_data": "versions-data", "kernels": "kernels",
                    "moe_autotune": "moe-autotune"}

    def no_device(self) -> ProbeCheck | None:
        """The runner's result when it found no CUDA device (torch sees none), else None."""
        runner = self.runner
        return runner if runner is not None and runner.reason is Reason.NO_DEVICE else None

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data: ``{"checks": [...]}`` in the probe's order."""
        return {"checks": [check.to_json() for f in fields(self)
                           if (check := getattr(self, f.name)) is not None]}

    @classmethod
    def from_checks(cls, checks: Iterable[ProbeCheck]) -> ProbeResults:
        """Collect results by name, and check the data of those the host reads
        (:data:`PAYLOADS`).

        Raises:
            ProbeOutputError: a name that is not one of :data:`NAMES`, one given twice, or
                data the host could not read (:meth:`ProbeData.check`).
        """
        by_name = {name: attribute for attribute, name in cls.NAMES.items()}
        found: dict[str, ProbeCheck] = {}
        for check in checks:
            attribute = by_name.get(check.name)
            if attribute is None:
                raise ProbeOutputError(f"unknown probe result {check.name!r} (known: "
                                       f"{', '.join(cls.NAMES.values())})")
            if attribute in found:
                raise ProbeOutputError(f"probe result {check.name!r} is given twice")
            found[attribute] = check
        for check in found.values():
            payload = cls.PAYLOADS.get(check.name)
            if payload is not None:
                payload.check(check)
        return cls(**found)

    @classmethod
    def from_json(cls, data: object) -> ProbeResults:
        """Read what :meth:`to_json` wrote.

        Raises:
            ProbeOutputError: not ``{"checks": [...]}``, or a result is malformed.
        """
        if not isinstance(data, dict) or not isinstance(data.get("checks"), list):
            raise ProbeOutputError('probe results are {"checks": [...]}')
        return cls.from_checks(ProbeCheck.from_json(item) for item in data["checks"])

    @classmethod
    def from_output(cls, stdout: str) -> ProbeResults:
        """Read the probe's standard output: its :data:`RESULT_PREFIX` lines; other output
        (libraries print freely) is ignored.

        Raises:
            ProbeOutputError: a result line is not valid JSON or not a probe result (the
                message names its line).
        """
        checks = []
        for number, line in enumerate(stdout.splitlines(), 1):
            if not line.startswith(RESULT_PREFIX):
                continue
            try:
                checks.append(ProbeCheck.from_json(json.loads(line[len(RESULT_PREFIX):])))
            except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                raise ProbeOutputError(f"line {number} of the probe's output: {exc}") from None
        return cls.from_checks(checks)


# ---------------------------------------------------------------------------------------
# FlashInfer's log lines.

#: The warnings FlashInfer's autotuner logs for a tactic that failed while profiling, and
#: the TensorRT-LLM TMA WS error; both are expected on some GPUs and count as warnings.
WARNING_PATTERNS: dict[str, str] = {
    "skipped_tactic": "Skipping tactic",
    "tma_ws_init_failed": "Failed to initialize cutlass TMA WS grouped gemm",
}

PROFILED_PREFIX: Final = "[Autotuner]: profiling "
CHOSEN_PREFIX: Final = "[Autotuner]: profiling chosen runner: "
MISSING_MODULE: Final = "the required module is not found in the JIT cache"
SKIP_CAUSES: Final = ("missing_module", "hardware", "other")


def classify_line(line: str) -> tuple[str, ...]:
    """Return the warning kinds (keys of :data:`WARNING_PATTERNS`) that ``line`` shows.

    A ``Skipping tactic`` line that quotes the TMA WS error counts as both kinds.
    """
    return tuple(kind for kind, text in WARNING_PATTERNS.items() if text in line)


def count_warnings(lines: Iterable[str]) -> dict[str, int]:
    """Count each warning kind over ``lines`` (every kind appears, zero included)."""
    counts = dict.fromkeys(WARNING_PATTERNS, 0)
    for line in lines:
        for kind in classify_line(line):
            counts[kind] += 1
    return counts


def skip_cause(line: str) -> str | None:
    """Why the autotuner skipped a tactic on this log line (``None``: not a skip line).

    ``missing_module``: a module is missing from the jit-cache with JIT disabled (the
    build's fault: the check fails); ``hardware``: a CUTLASS TMA warp-specialised grouped
    GEMM that cannot initialise on this GPU, e.g. SM120's ~99 KiB of shared memory (a
    warning); ``other``: any other exception (a warning).
    """
    if WARNING_PATTERNS["skipped_tactic"] not in line:
        return None
    if MISSING_MODULE in line:
        return "missing_module"
    if WARNING_PATTERNS["tma_ws_init_failed"] in line:
        return "hardware"
    return "other"


def autotune_summary(lines: Iterable[str]) -> dict[str, Any]:
    """What one ``autotune()`` pass did, from the autotuner's log lines (debug level).

    Returns:
        ``profiled`` (tactics timed), ``chosen`` (the tactics picked, in order; the
        default tactic when nothing is tuned is -1) and ``skipped`` (count per cause of
        :data:`SKIP_CAUSES`).
    """
    profiled = 0
    chosen: list[str] = []
    skipped = dict.fromkeys(SKIP_CAUSES, 0)
    for line in lines:
        cause = skip_cause(line)
        if cause is not None:
            skipped[cause] += 1
        elif CHOSEN_PREFIX in line:
            # "... chosen runner: <runner repr> TACTIC for (cache key)"
            head = line.split(CHOSEN_PREFIX, 1)[1].split(" for ", 1)[0]
            chosen.append(head.rsplit(" ", 1)[-1])
        elif PROFILED_PREFIX in line and ", avg_time " in line:
            profiled += 1
    return {"profiled": profiled, "chosen": chosen, "skipped": skipped}


def untuned(tuned: Mapping[str, Any]) -> str | None:
    """Why an autotune pass tuned nothing, or ``None`` when it tuned: ``missing_module``
    (a tactic was skipped for a module missing from the jit-cache) or ``none_profiled``.

    Args:
        tuned: :func:`autotune_summary` of the pass's log lines.
    """
    if tuned["skipped"].get("missing_module"):
        return "missing_module"
    return None if tuned["profiled"] else "none_profiled"


# ---------------------------------------------------------------------------------------
# The kernel wheel's manifest.


@dataclass(frozen=True)
class ManifestModule:
    """One compiled module of the kernel wheel.

    Attributes:
        name: FlashInfer's module (JitSpec) name, e.g. ``norm``, ``silu_and_mul``.
        path: the library, relative to ``get_jit_cache_dir()`` (``norm/norm.so``).
        sha256: hex sha256 of the library.
        sass: the SASS archs found in it (``sm_90a``).
    """

    name: str
    path: str
    sha256: str
    sass: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    """The kernel wheel's ``sm120-manifest.json``: what was built, for which archs, how."""

    flashinfer_version: str
    version: str
    arch_list: tuple[str, ...]
    cuda_version: str
    modules: tuple[ManifestModule, ...]
    raw: dict[str, Any]

    def module(self, name: str) -> ManifestModule | None:
        """The module called ``name``, if the wheel has it."""
        return next((m for m in self.modules if m.name == name), None)


def parse_manifest(data: dict[str, Any]) -> Manifest:
    """Read the kernel wheel's manifest (the one place that knows its format).

    Args:
        data: the parsed JSON: ``{"schema": 1, "flashinfer_version", "version",
            "arch_list", "cuda_version", "nvcc_version", "flags_sha256", "modules":
            [{"name", "path", "sha256", "sass"}]}``.

    Raises:
        ValueError: a key is missing or of the wrong type, or the schema is not 1.
    """
    try:
        if data.get("schema") != 1:
            raise ValueError(f"manifest schema {data.get('schema')!r}, expected 1")
        modules = tuple(ManifestModule(str(m["name"]), str(m["path"]), str(m["sha256"]),
                                       tuple(str(s) for s in m.get("sass", ())))
                        for m in data["modules"])
        return Manifest(str(data["flashinfer_version"]), str(data["version"]),
                        tuple(str(a) for a in data["arch_list"]),
                        str(data.get("cuda_version", "")), modules, data)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"manifest is missing or mistypes {exc}") from None
