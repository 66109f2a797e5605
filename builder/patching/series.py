"""The patch series file (``patches/series.toml``), parsed once into typed objects.

A series lists patches in order with their pins (sha256, strip level), the upstream
versions each applies to, fuzz allowances with reasons, and intent checks. It is validated
here; the patch stage takes the typed objects and never reads the file again.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.core.arch import SM120
from builder.core.config import (
    SHA256,
    Target,
    is_integer,
    known_keys,
    read_toml,
    require,
    specifier,
    table_array,
)
from builder.core.errors import ConfigurationError
from builder.core.options import Options
from builder.patching.intent import IntentCheck, parse_intent_check


@dataclass(frozen=True)
class FuzzAllowance:
    """Permission for a patch to need fuzz on some upstream versions, with the reason."""

    versions: SpecifierSet
    max_fuzz: int
    reason: str


#: The checks a behaviour may run (``builder/behaviour/script/behaviour_checks.py``).
BEHAVIOUR_CHECKS = ("resolve", "dispatch", "serve")
#: ``models = ["zoo"]``: every checkpoint form of ``builder/behaviour/script/zoo_forms.py``
#: the release can load.
ZOO = "zoo"
#: What an invariant expects of every case on the patched code (``builder.behaviour.sm12x``:
#: never "crashes" or "wrong-numbers"; "unjudged" is reported with its reason).
INVARIANT_OUTCOMES = ("serves", "refused", "unjudged")


@dataclass(frozen=True)
class BehaviourCase:
    """One configuration a behaviour runs: a tiny model and the server arguments."""

    model: str
    args: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        """``model key=value ...``, for reports."""
        return " ".join([self.model, *(f"{k}={v}" for k, v in self.args)])


@dataclass(frozen=True)
class Behaviour:
    """What a patch must make the release's own code do, checked by running it.

    Attributes:
        name: one line saying the behaviour.
        check: ``resolve`` (the values the serving process selects), ``dispatch`` (the
            expert ids that reach the MoE runner on rank 1 of TP 2 / EP 2) or ``serve``
            (a zoo checkpoint's start-up and expert layer, judged by
            ``builder.behaviour.sm12x.judge``; ``expect = { outcome = ... }``).
        cases: every configuration (the product of the declared models and arguments).
        capabilities: the compute capabilities the device reports, each case on each.
        expect: observation -> value every case must show on the patched code; some case
            must miss it on upstream's code (else the patch proves nothing). ``refused =
            true`` means the release must refuse the configuration.
        unchanged: observations the patch must leave as upstream has them, in every case
            (for the GPUs and choices the patch must not touch).
        versions: the releases it is checked on (default: the patch's range).
        invariant: a series invariant (``[[invariant]]``): it holds when every case does on
            the patched code, whatever upstream's code does.
    """

    name: str
    check: str
    cases: tuple[BehaviourCase, ...]
    capabilities: tuple[tuple[int, int], ...]
    expect: tuple[tuple[str, Any], ...] = ()
    unchanged: tuple[str, ...] = ()
    versions: SpecifierSet | None = None
    invariant: bool = False


#: The checks a precondition may run (``builder/behaviour/preconditions.py``).
PRECONDITION_CHECKS = ("pinned-wheel-files",)


@dataclass(frozen=True)
class Precondition:
    """What a patch needs from the release's pinned dependencies, checked in their wheels.

    Attributes:
        name: one line saying what is needed.
        check: ``pinned-wheel-files``: the wheel of ``distribution`` at the version the
            release's ``Requires-Dist`` pins holds every one of ``files``.
        distribution: the pinned dependency (an index project name).
        files: paths inside that wheel.
        unmet: the name of the patch's behaviour that says what the patched code does when
            the precondition is not met; the behaviour stage requires it to be proven on
            every release whose pin misses the files.
    """

    name: str
    check: str
    distribution: str
    files: tuple[str, ...]
    unmet: str


def _parse_precondition(table: dict[str, Any], where: str) -> Precondition:
    known_keys(table, {"name", "check", "distribution", "files", "unmet"}, where)
    name = require(table, "name", str, where)
    where = f"{where} ({name})"
    check = require(table, "check", str, where)
    if check not in PRECONDITION_CHECKS:
        raise ConfigurationError(f"{where}: unknown check {check!r}",
                                 f"one of {', '.join(PRECONDITION_CHECKS)}")
    files = require(table, "files", list, where)
    if not files or not all(isinstance(f, str) and f for f in files):
        raise ConfigurationError(f"{where}: files must be a non-empty list of paths",
                                 "paths inside the dependency's wheel")
    return Precondition(name=name, check=check,
                        distribution=require(table, "distribution", str, where),
                        files=tuple(files), unmet=require(table, "unmet", str, where))


def _capability(text: Any, where: str) -> tuple[int, int]:
    if not isinstance(text, str) or not re.fullmatch(r"\d{1,2}\.\d", text):
        raise ConfigurationError(f"{where}: capability {text!r} is not like \"12.0\"",
                                 "write the compute capability as MAJOR.MINOR")
    major, minor = text.split(".")
    return int(major), int(minor)


def _parse_behaviour(table: dict[str, Any], where: str) -> Behaviour:
    known_keys(table, {"name", "check", "models", "args", "capability", "expect",
                       "unchanged", "versions"}, where)
    name = require(table, "name", str, where)
    where = f"{where} ({name})"
    check = require(table, "check", str, where)
    if check not in BEHAVIOUR_CHECKS:
        raise ConfigurationError(f"{where}: unknown check {check!r}",
                                 f"one of {', '.join(BEHAVIOUR_CHECKS)}")
    models = require(table, "models", list, where)
    if not models or not all(isinstance(m, str) for m in models):
        raise ConfigurationError(f"{where}: models must be a non-empty list of names",
                                 "see builder/behaviour/script/tiny_models.py")
    args = table.get("args", {})
    if not isinstance(args, dict):
        raise ConfigurationError(f"{where}: args must be a table", "")
    axes = [(key, value if isinstance(value, list) else [value]) for key, value in args.items()]
    combos: list[list[tuple[str, Any]]] = [[]]
    for key, choices in axes:
        combos = [[*c, (key, v)] for c in combos for v in choices]
    cases = []
    for model in models:
        for combo in combos:
            chosen = dict(combo)
            # ``ep_size = "tp"``: expert parallelism as wide as tensor parallelism
            if chosen.get("ep_size") == "tp":
                chosen["ep_size"] = chosen.get("tp_size", 1)
            case = BehaviourCase(model, tuple(chosen.items()))
            if case not in cases:  # tp 1 with ep [1, "tp"] names one case twice
                cases.append(case)
    raw = table.get("capability", SM120)
    capabilities = tuple(_capability(c, where) for c in (raw if isinstance(raw, list) else [raw]))
    expect = table.get("expect", {})
    unchanged = table.get("unchanged", [])
    if not isinstance(expect, dict) or not isinstance(unchanged, list) or \
            bool(expect) == bool(unchanged):
        raise ConfigurationError(f"{where}: give either expect (a table) or unchanged (a list)",
                                 "expect: what the patch makes happen; unchanged: what it "
                                 "must not touch")
    versions = table.get("versions")
    return Behaviour(name=name, check=check, cases=tuple(cases), capabilities=capabilities,
                     expect=tuple(expect.items()), unchanged=tuple(map(str, unchanged)),
                     versions=specifier(versions, where) if versions is not None else None)


@dataclass(frozen=True)
class KernelFit:
    """Kernels a patch selects on SM12x, to be compiled for sm_120 and held to its limits.

    The behaviour stage (``builder/behaviour/fit.py``) calls ``function`` of ``module``, the
    release's own dispatch, with the device reported as SM120, records each TileLang kernel
    it picks, and compiles each for sm_120.

    Attributes:
        name: one line saying which kernels.
        module: the dispatch's module (``sglang.kernels.ops.attention.dsa.tilelang_kernel``).
        function: the dispatch (``tilelang_sparse_fwd``).
        heads: the query heads per GPU it is called with (TP 1..8 of a 128-head model).
        kv: the KV cache dtypes it is called with (``bf16``, ``fp8``).
        tokens: the token counts it is called with.
        versions: the releases it is checked on (default: the patch's range).
    """

    name: str
    module: str
    function: str
    heads: tuple[int, ...]
    kv: tuple[str, ...]
    tokens: tuple[int, ...] = (1,)
    versions: SpecifierSet | None = None


#: The KV cache dtypes a kernel-fit declaration may name.
KERNEL_FIT_KV = ("bf16", "fp8")


def _ints(table: dict[str, Any], key: str, default: list[int], where: str) -> tuple[int, ...]:
    value = table.get(key, default)
    if not isinstance(value, list) or not value or \
            not all(is_integer(v) and v > 0 for v in value):
        raise ConfigurationError(f"{where}: {key} must be a non-empty list of positive integers",
                                 f"e.g. {key} = [16, 32, 64, 128]")
    return tuple(value)


def _parse_kernel_fit(table: dict[str, Any], where: str) -> KernelFit:
    known_keys(table, {"name", "dispatch", "heads", "kv", "tokens", "versions"}, where)
    name = require(table, "name", str, where)
    where = f"{where} ({name})"
    dispatch = require(table, "dispatch", str, where)
    if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", dispatch):
        raise ConfigurationError(f"{where}: dispatch {dispatch!r} is not MODULE:FUNCTION",
                                 "e.g. sglang.kernels.ops.attention.dsa.tilelang_kernel:"
                                 "tilelang_sparse_fwd")
    module, function = dispatch.split(":")
    kv = table.get("kv", ["bf16"])
    if not isinstance(kv, list) or not kv or any(k not in KERNEL_FIT_KV for k in kv):
        raise ConfigurationError(f"{where}: kv must be a non-empty list of "
                                 f"{' / '.join(KERNEL_FIT_KV)}", 'e.g. kv = ["bf16", "fp8"]')
    versions = table.get("versions")
    return KernelFit(name=name, module=module, function=function,
                     heads=_ints(table, "heads", [], where), kv=tuple(kv),
                     tokens=_ints(table, "tokens", [1], where),
                     versions=specifier(versions, where) if versions is not None else None)


@dataclass(frozen=True)
class SeriesEntry:
    """One patch of a series.

    Attributes:
        path: the patch file.
        sha256: the pinned hex sha256 of the file (``None`` for an ad-hoc ``--patch``).
        strip: the fixed strip level (``-p``), never guessed.
        versions: upstream versions the patch applies to (PEP 440 specifiers).
        max_fuzz: fuzz allowed everywhere in ``versions`` (default 0).
        allowances: more fuzz allowed on narrower version ranges, each with a reason.
        intents: checks that must hold on the patched tree.
        description: one line for reports.
        behaviours: what the patch must make the release's own code do
            (the behaviour stage, ``builder/behaviour``, runs them).
        preconditions: what the patch needs from the release's pinned dependencies
            (checked by the behaviour stage too).
        kernel_fits: the kernels it selects on SM12x, which must fit SM120.
    """

    path: Path
    sha256: str | None
    strip: int
    versions: SpecifierSet
    max_fuzz: int = 0
    allowances: tuple[FuzzAllowance, ...] = ()
    intents: tuple[IntentCheck, ...] = ()
    description: str = ""
    behaviours: tuple[Behaviour, ...] = ()
    preconditions: tuple[Precondition, ...] = ()
    kernel_fits: tuple[KernelFit, ...] = ()

    @property
    def name(self) -> str:
        """The patch's file name."""
        return self.path.name

    def applies_to(self, version: Version) -> bool:
        """True when ``version`` (pre-releases included) is inside the declared range."""
        return self.versions.contains(version, prereleases=True)

    def fuzz_limit(self, version: Version) -> tuple[int, str]:
        """Return ``(max fuzz, reason)`` in force for ``version``.

        The largest matching allowance wins; with none, the entry's ``max_fuzz`` applies
        and the reason is empty.
        """
        limit, reason = self.max_fuzz, ""
        for allowance in self.allowances:
            if allowance.versions.contains(version, prereleases=True) and \
                    allowance.max_fuzz > limit:
                limit, reason = allowance.max_fuzz, allowance.reason
        return limit, reason


@dataclass(frozen=True)
class Series:
    """An ordered patch series.

    Attributes:
        path: the series file (``None`` for an ad-hoc series built from ``--patch``).
        entries: the patches in application order.
        invariants: what every case must show on the patched code, whichever patch makes
            it so (``[[invariant]]``: the checkpoint zoo's serve check).
    """

    path: Path | None
    entries: tuple[SeriesEntry, ...] = field(default_factory=tuple)
    invariants: tuple[Behaviour, ...] = ()

    @classmethod
    def single(cls, patch: Path, *, strip: int = 1, max_fuzz: int = 0) -> Series:
        """Build an unpinned one-patch series for trying a patch (``patch --patch FILE``)."""
        entry = SeriesEntry(path=patch, sha256=None, strip=strip, versions=SpecifierSet(),
                            max_fuzz=max_fuzz, description="ad-hoc patch")
        return cls(path=None, entries=(entry,))



_ENTRY_KEYS = {"file", "sha256", "description", "strip", "versions", "max_fuzz",
               "fuzz_allowance", "intent", "behaviour"}


def _inside(base: Path, file_name: str, where: str) -> Path:
    """The patch file ``file_name`` of a series entry, resolved; it must stay in the
    series' folder, since refresh rewrites it in place.

    Args:
        base: the series file's folder.
        file_name: the entry's ``file``.
        where: the entry, for the message.

    Returns:
        The resolved path (links followed).

    An absolute ``file`` is taken as written (a series may read a patch kept elsewhere;
    ``refresh`` refuses to rewrite one outside the series' folder in place).

    Raises:
        ConfigurationError: ``file_name`` is empty, or is relative and leads out of
            ``base`` (``..``, or a symbolic link pointing elsewhere).
    """
    hint = ("keep the series' patches in its folder (a path relative to it, e.g. "
            "\"0001-fix.patch\"); copy the patch there")
    if not file_name or "\0" in file_name:
        raise ConfigurationError(f"{where}: file must name a patch file", hint)
    if Path(file_name).is_absolute():
        return Path(file_name).resolve()
    folder = base.resolve()
    path = (base / file_name).resolve()
    if not path.is_relative_to(folder) or path == folder:
        raise ConfigurationError(f"{where}: file leads out of the series folder {folder} "
                                 f"(to {path})", hint)
    return path


def _parse_entry(table: dict[str, Any], base: Path, where: str) -> SeriesEntry:
    known_keys(table, _ENTRY_KEYS, where)
    file_name = require(table, "file", str, where)
    where = f"{where} ({file_name})"
    path = _inside(base, file_name, where)
    sha = require(table, "sha256", str, where).lower()
    if not SHA256.match(sha):
        raise ConfigurationError(f"{where}: sha256 {sha!r} is not 64 hex digits",
                                 f"pin it with: sha256sum patches/{file_name}")
    strip = require(table, "strip", int, where)
    if strip < 0:
        raise ConfigurationError(f"{where}: strip level must be >= 0", "1 for a/ b/ prefixes")
    max_fuzz = table.get("max_fuzz", 0)
    if not is_integer(max_fuzz) or not 0 <= max_fuzz <= 3:
        raise ConfigurationError(f"{where}: max_fuzz must be an integer from 0 to 3",
                                 "GNU patch's fuzz is at most the context size, usually 3")
    versions = specifier(require(table, "versions", str, where), where)
    allowances = []
    for i, allowance in enumerate(table_array(table, "fuzz_allowance", where), 1):
        here = f"{where} fuzz_allowance #{i}"
        known_keys(allowance, {"versions", "max_fuzz", "reason"}, here)
        fuzz = require(allowance, "max_fuzz", int, here)
        if not 0 <= fuzz <= 3:
            raise ConfigurationError(f"{here}: max_fuzz must be from 0 to 3",
                                     "GNU patch's fuzz is at most the context size, usually 3")
        reason = require(allowance, "reason", str, here).strip()
        if not reason:
            raise ConfigurationError(
                f"{here}: a fuzz allowance needs a reason", "say why it is safe")
        allowances.append(FuzzAllowance(
            versions=specifier(require(allowance, "versions", str, here), here),
            max_fuzz=fuzz, reason=reason))
    intents = tuple(parse_intent_check(
        known_keys(t, {"check", "file", "value", "function", "assignment", "compared_with",
                        "pattern"}, f"{where} intent #{i}"), f"{where} intent #{i}")
        for i, t in enumerate(table_array(table, "intent", where), 1))
    return SeriesEntry(path=path, sha256=sha, strip=strip,
                       versions=versions,
                       max_fuzz=max_fuzz, allowances=tuple(allowances), intents=intents,
                       description=str(table.get("description", "")),
                       behaviours=tuple(
                           _parse_behaviour(t, f"{where} behaviour #{i}")
                           for i, t in enumerate(table_array(table, "behaviour", where), 1)))


def load_series(path: Path) -> Series:
    """Read and validate a series file.

    Args:
        path: the TOML series file; patch file names resolve against its folder.

    Returns:
        The series, in application order.

    Raises:
        BuilderError: the file is missing, not TOML, or an entry breaks the schema.
    """
    data = read_toml(path, "series file")
    known_keys(data, {"patch", "behaviour", "precondition", "kernel_fit", "invariant"},
               str(path))
    tables = table_array(data, "patch", str(path))
    entries = [_parse_entry(t, path.parent, f"{path} patch #{i}")
               for i, t in enumerate(tables, 1)]
    # A top-level [[behaviour]] or [[precondition]] belongs to every patch its `patches`
    # globs name (the per-release copies of one change share them).
    for i, table in enumerate(table_array(data, "behaviour", str(path)), 1):
        where = f"{path} behaviour #{i}"
        behaviour = _parse_behaviour({k: v for k, v in table.items() if k != "patches"},
                                     where)
        for n in _named(entries, require(table, "patches", list, where), where):
            entries[n] = replace(entries[n], behaviours=(*entries[n].behaviours, behaviour))
    for i, table in enumerate(table_array(data, "precondition", str(path)), 1):
        where = f"{path} precondition #{i}"
        precondition = _parse_precondition(
            {k: v for k, v in table.items() if k != "patches"}, where)
        for n in _named(entries, require(table, "patches", list, where), where):
            entries[n] = replace(entries[n],
                                 preconditions=(*entries[n].preconditions, precondition))
    # A top-level [[kernel_fit]] likewise belongs to every patch its globs name.
    for i, table in enumerate(table_array(data, "kernel_fit", str(path)), 1):
        where = f"{path} kernel_fit #{i}"
        fit = _parse_kernel_fit({k: v for k, v in table.items() if k != "patches"}, where)
        for n in _named(entries, require(table, "patches", list, where), where):
            entries[n] = replace(entries[n], kernel_fits=(*entries[n].kernel_fits, fit))
    invariants = tuple(_parse_invariant(t, f"{path} invariant #{i}")
                       for i, t in enumerate(table_array(data, "invariant", str(path)), 1))
    return Series(path=path, entries=tuple(entries), invariants=invariants)


def _parse_invariant(table: dict[str, Any], where: str) -> Behaviour:
    """``[[invariant]]``: a ``serve`` check over the zoo whose every patched case must be
    one of :data:`INVARIANT_OUTCOMES` (the table gives name, models, args, capability)."""
    known_keys(table, {"name", "models", "args", "capability", "versions"}, where)
    behaviour = _parse_behaviour({**table, "check": "serve",
                                  "expect": {"outcome": list(INVARIANT_OUTCOMES)}}, where)
    return replace(behaviour, invariant=True)


def _named(entries: list[SeriesEntry], globs: list[Any], where: str) -> list[int]:
    """The indexes of the entries ``globs`` name; a glob that names none is an error."""
    found: list[int] = []
    for glob in globs:
        hits = [n for n, e in enumerate(entries) if fnmatch.fnmatchcase(e.name, str(glob))]
        if not hits:
            raise ConfigurationError(f"{where}: patches {glob!r} names no patch of the "
                                     "series", "give a patch file name (globs allowed)")
        found += [n for n in hits if n not in found]
    return found


def select_series(options: Options, target: Target | None) -> Series:
    """Return the series to apply: ``--patch``, ``--series``, or the target's.

    Raises:
        BuilderError: both ``--patch`` and ``--series`` were given, or the file is invalid.
    """
    if options.patch and options.series:
        raise ConfigurationError("--patch and --series exclude each other", "give one of them")
    if options.patch:
        return Series.single(options.patch, strip=options.strip, max_fuzz=options.max_fuzz)
    if options.series:
        return load_series(options.series)
    if target is None:
        raise ConfigurationError("no series to apply", "pass --series FILE or --patch FILE")
    return load_series(target.series)


def _read_series_document(path: Path) -> tuple[bytes, tomlkit.TOMLDocument]:
    """The series file's bytes and its tomlkit document.

    Raises:
        BuilderError: the file cannot be read or is not TOML.
    """
    from builder.core.userfiles import read_input

    original = read_input(path, "the series", "give the series file (patches/series.toml)")
    try:
        return original, tomlkit.parse(original.decode("utf-8"))
    except (UnicodeDecodeError, tomlkit.exceptions.ParseError) as exc:
        raise ConfigurationError(f"{path}: {exc}", "fix the series file") from None


def append_entry(path: Path, entry: dict[str, Any], *,
                 patch_file: tuple[Path, bytes] | None = None) -> None:
    """Add one ``[[patch]]`` table at the end of the series file, rendered by tomlkit
    (the rest of the file byte for byte: tomlkit would regroup the ``[[patch]]`` tables the
    series interleaves with ``[[behaviour]]`` ones if the table went into the document).
    Every writer of a series file renders it with tomlkit (``tests/test_architecture.py``).

    Everything is checked before the first write: the series with the entry is loaded
    from a temporary file beside it (an error names the series file), and the series must
    be a file that can be replaced. Then ``patch_file`` is written, then the series; when
    the series cannot be written, ``patch_file`` is removed again. The added lines end as
    most of the file's lines do (:func:`builder.core.userfiles.newline_of`).

    Args:
        path: the series file.
        entry: the entry's keys (``file``, ``sha256``, ``description`` ...), in order.
        patch_file: the patch the entry names and its bytes, written with the entry.

    Raises:
        BuilderError: the file cannot be read or is not TOML, or does not load as a series
            with the entry, or cannot be replaced (hard links, not a file). Nothing is
            written then.
    """
    from builder.core.errors import BuilderError
    from builder.core.userfiles import (
        check_rewritable,
        newline_of,
        rewrite_user_file,
        temporary_beside,
    )

    original, _ = _read_series_document(path)
    table = tomlkit.table()
    for key, value in entry.items():
        table.add(key, value)
    patches = tomlkit.aot()
    patches.append(table)
    newline = newline_of(original)
    added = tomlkit.dumps({"patch": patches}).encode("utf-8").replace(b"\n", newline)
    data = original.rstrip(b"\r\n") + newline * 2 + added
    with temporary_beside(path, data) as temporary:
        try:
            load_series(temporary)
        except BuilderError as exc:
            raise exc.replaced(cause=exc.cause.replace(str(temporary), str(path))) from None
    check_rewritable(path)
    if patch_file is not None:
        rewrite_user_file(*patch_file)
    try:
        rewrite_user_file(path, data)
    except BaseException:
        if patch_file is not None:
            patch_file[0].unlink(missing_ok=True)
        raise


_PATCH_HEADER = re.compile(r"(?m)^[ \t]*\[\[[ \t]*patch[ \t]*\]\][ \t]*(?:#.*)?\r?$")
_ANY_HEADER = re.compile(r"(?m)^[ \t]*\[")


def repin_entries(path: Path, pins: list[tuple[int, str, str]], *,
                  patch_files: list[tuple[Path, bytes]] | None = None) -> None:
    """Move each named entry's ``sha256`` in the series file from an old to a new value.

    The new value is rendered by tomlkit and put in place of the old one at that entry's
    ``sha256`` key (between its ``[[patch]]`` header and the next table header): another
    entry that pins the same sha256 (a copy of the patch kept for other versions) keeps
    its pin. The rest of the file stays byte for byte. (tomlkit 0.15 cannot write this
    file back as it read it: ``dumps(parse(text))`` regroups the ``[[patch]]`` tables the
    series interleaves with ``[[behaviour]]`` ones.)

    Everything is checked before the first write (the new pins found, the series and
    each of ``patch_files`` replaceable); then the patches are written, then the series.
    A write that fails puts back what the ones before it replaced.

    Args:
        path: the series file.
        pins: ``(entry index, old sha256, new sha256)``: the index counts the file's
            ``[[patch]]`` entries from 0, in order.
        patch_files: the rewritten patches whose pins move, and their new bytes.

    Raises:
        BuilderError: the file cannot be read or is not TOML, or an entry's ``sha256`` is
            not the old value, or is not written as ``sha256 = "HEX"`` under its own
            ``[[patch]]`` header, or a file cannot be replaced. Nothing is written then.
    """
    from builder.core.userfiles import check_rewritable, read_input, rewrite_user_file

    original, document = _read_series_document(path)
    text = original.decode("utf-8")
    entries = [str(t.get("sha256", "")) for t in document.get("patch", [])]
    headers = list(_PATCH_HEADER.finditer(text))
    hint = "write each entry as a [[patch]] table with sha256 = \"HEX\""
    edits: list[tuple[int, int, str]] = []
    for index, old, new in pins:
        if not 0 <= index < len(entries) or entries[index] != old:
            raise ConfigurationError(f"{path}: sha256 {old} is not the pin of [[patch]] "
                                     f"entry #{index + 1}", hint)
        if len(headers) != len(entries):
            raise ConfigurationError(f"{path}: {len(entries)} [[patch]] entries but "
                                     f"{len(headers)} [[patch]] headers: cannot find "
                                     f"entry #{index + 1}'s pin", hint)
        start = headers[index].end()
        following = _ANY_HEADER.search(text, start)
        end = following.start() if following else len(text)
        key = re.compile(rf'(?m)^(sha256[ \t]*=[ \t]*)"{re.escape(old)}"')
        found = key.search(text, start, end)
        if found is None:
            raise ConfigurationError(f"{path}: [[patch]] entry #{index + 1} has no "
                                     f'sha256 = "{old}" line', hint)
        # The value as tomlkit renders it.
        edits.append((found.start(), found.end(),
                      found[1] + tomlkit.string(new).as_string()))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    writes = [*(patch_files or []), (path, text.encode("utf-8"))]
    for file, _ in writes:
        check_rewritable(file)
    done: list[tuple[Path, bytes]] = []
    try:
        for file, data in writes:
            before = read_input(file, "the file", "restore it from git")
            rewrite_user_file(file, data)
            done.append((file, before))
    except BaseException:
        for file, before in reversed(done):  # all or none
            rewrite_user_file(file, before)
        raise
