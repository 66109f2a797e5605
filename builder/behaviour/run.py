"""The behaviour stage: each patch's declared behaviours, run on the release's own code.

For a target, the release's pinned wheel for this interpreter is installed with its pinned
dependencies (:mod:`builder.behaviour.env`); the series is applied to the same wheel by the
patch stage; then ``script/behaviour_checks.py`` runs every case twice in that environment,
once on upstream's code and once with the patched ``sglang`` package first on the path, with
the device reported as each declared compute capability. A behaviour is **proven** when
every case holds on the patched code and (for an ``expect`` behaviour) some case fails on
upstream's; an ``unchanged`` behaviour is proven when the patched code observes what
upstream's does in every case.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.tags import sys_tags
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from builder.behaviour.env import SIZES, BehaviourEnv, behaviour_env, disk_full
from builder.behaviour.fit import FitReport, check_fits, fits_of, require_fit
from builder.behaviour.preconditions import PreconditionResult, check_precondition
from builder.behaviour.sm12x import OUTCOMES, judge
from builder.core.cache import Cache, sha256_file, sha256_json
from builder.core.config import Target, WheelPin
from builder.core.errors import BuilderError, ConfigurationError, PatchError
from builder.core.options import Options, select_target
from builder.core.progress import Reporter
from builder.patching.series import (
    ZOO,
    Behaviour,
    BehaviourCase,
    Precondition,
    Series,
    SeriesEntry,
)

SCRIPT = Path(__file__).parent / "script" / "behaviour_checks.py"
_PREFIX = "BEHAVIOUR "


@dataclass(frozen=True)
class CaseResult:
    """One case on both codes.

    Attributes:
        case: the configuration.
        capability: the compute capability the device reported.
        upstream: what upstream's code observed (``{"error": ...}`` when it refused).
        patched: what the patched code observed.
        holds: the behaviour's rule holds on the patched code for this case.
        upstream_holds: the same rule on upstream's code.
    """

    case: BehaviourCase
    capability: tuple[int, int]
    upstream: dict[str, Any]
    patched: dict[str, Any]
    holds: bool
    upstream_holds: bool

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {"case": self.case.describe(), "capability": ".".join(map(str, self.capability)),
                "upstream": self.upstream, "patched": self.patched, "holds": self.holds,
                "upstream_holds": self.upstream_holds}


@dataclass(frozen=True)
class BehaviourResult:
    """One behaviour of one patch on one release."""

    patch: str
    behaviour: Behaviour
    cases: tuple[CaseResult, ...]

    @property
    def holds(self) -> bool:
        """Every case holds on the patched code."""
        return all(c.holds for c in self.cases)

    @property
    def fails_upstream(self) -> bool:
        """Some case fails on upstream's code (``unchanged`` behaviours and invariants:
        always True)."""
        return not self.behaviour.expect or self.behaviour.invariant or \
            not all(c.upstream_holds for c in self.cases)

    @property
    def proven(self) -> bool:
        """Holds patched and, for an ``expect`` behaviour, fails upstream."""
        return self.holds and self.fails_upstream

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {"patch": self.patch, "behaviour": self.behaviour.name,
                "check": self.behaviour.check, "proven": self.proven, "holds": self.holds,
                "fails_upstream": self.fails_upstream,
                "expect": dict(self.behaviour.expect),
                "unchanged": list(self.behaviour.unchanged),
                "cases": [c.to_json() for c in self.cases]}


@dataclass
class BehaviourReport:
    """Every behaviour of a target's series, run on its release.

    Attributes:
        target: the target's name.
        release: the upstream version.
        results: one per behaviour.
        not_installed: the release's requirements left out of the environment.
        standins: the compiled packages stood in for (import name -> pinned version).
        preconditions: the series' preconditions, checked in the release's pinned wheels.
        kernel_fit: the kernels the series selects on SM12x, compiled for sm_120.
    """

    target: str
    release: str
    results: list[BehaviourResult] = field(default_factory=list)
    not_installed: tuple[str, ...] = ()
    standins: dict[str, str] = field(default_factory=dict)
    preconditions: list[PreconditionResult] = field(default_factory=list)
    kernel_fit: FitReport = field(default_factory=FitReport)

    @property
    def unanswered(self) -> list[PreconditionResult]:
        """Unmet preconditions whose ``unmet`` behaviour is not proven on this release."""
        proven = {r.behaviour.name for r in self.results if r.proven}
        return [p for p in self.preconditions
                if not p.met and p.precondition.unmet not in proven]

    @property
    def proven(self) -> bool:
        """Every behaviour is proven, every unmet precondition is answered by one, and every
        kernel the patched code picks fits."""
        return all(r.proven for r in self.results) and not self.unanswered and \
            self.kernel_fit.fits

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {"target": self.target, "release": self.release, "proven": self.proven,
                "not_installed": list(self.not_installed), "standins": self.standins,
                "preconditions": [p.to_json() for p in self.preconditions],
                "results": [r.to_json() for r in self.results],
                "kernel_fit": self.kernel_fit.to_json()}

    def lines(self) -> list[str]:
        """One line per behaviour: its verdict, how many cases held, and the first miss."""
        out = []
        for result in self.results:
            verdict = "proven" if result.proven else \
                "NOT HELD" if not result.holds else "PASSES UPSTREAM TOO"
            held = sum(c.holds for c in result.cases)
            upstream = sum(c.upstream_holds for c in result.cases)
            line = (f"{verdict:<19} {result.patch}: {result.behaviour.name} "
                    f"(patched {held}/{len(result.cases)}, upstream {upstream}/"
                    f"{len(result.cases)})")
            miss = next((c for c in result.cases if not c.holds), None)
            if miss is not None:
                line += f"; first miss: {miss.case.describe()} -> {_short(miss.patched)}"
            if result.behaviour.check == "serve":
                line += "; outcomes upstream " + _counts(result, "upstream") + \
                    ", patched " + _counts(result, "patched")
            out.append(line)
        for pre in self.preconditions:
            state = "met" if pre.met else "UNANSWERED" if pre in self.unanswered else "unmet"
            line = (f"precondition {state:<10} {pre.precondition.name} "
                    f"({pre.precondition.distribution}=={pre.pin})")
            if not pre.met:
                line += (f"; missing {', '.join(pre.missing)}; the patched code must: "
                         f"{pre.precondition.unmet}")
            out.append(line)
        return out + self.kernel_fit.lines()


def _short(observed: dict[str, Any]) -> str:
    if "outcome" in observed:
        return f"{observed['outcome']}: {observed.get('why', '')}"[:240]
    return str(observed.get("error") or {k: v for k, v in observed.items()
                                         if k not in ("stood_in_calls",)})[:200]


def _counts(result: BehaviourResult, side: str) -> str:
    found: dict[str, int] = {}
    for case in result.cases:
        outcome = str(getattr(case, side).get("outcome"))
        found[outcome] = found.get(outcome, 0) + 1
    return " ".join(f"{k} {found[k]}" for k in OUTCOMES if k in found) or "-"


def _rule(behaviour: Behaviour, observed: dict[str, Any], upstream: dict[str, Any]) -> bool:
    if behaviour.check == "serve":
        return _serve_rule(behaviour, observed, upstream)
    if observed.get("stood_in_calls"):  # a decision that ran a stood-in kernel proves nothing
        return False
    if behaviour.unchanged:
        return all(observed.get(k) == upstream.get(k) for k in behaviour.unchanged) and \
            ("error" in observed) == ("error" in upstream)
    expect = dict(behaviour.expect)
    if expect.get("refused") is True:
        # ``refused_with``: the refusal must be this one (its message holds the text)
        return "error" in observed and str(expect.get("refused_with", "")) in \
            str(observed["error"])
    if "error" in observed:
        return False
    return all(observed.get(k) == v for k, v in expect.items())


def _serve_rule(behaviour: Behaviour, observed: dict[str, Any],
                upstream: dict[str, Any]) -> bool:
    """A ``serve`` case: its judged outcome is the expected one (or one of a list);
    ``refused_with`` must be in the refusal's message; ``unchanged`` compares outcomes."""
    if behaviour.unchanged:
        return all(observed.get(k) == upstream.get(k) for k in behaviour.unchanged)
    expect = dict(behaviour.expect)
    wanted = expect.get("outcome")
    allowed = wanted if isinstance(wanted, list) else [wanted]
    if observed.get("outcome") not in allowed:
        return False
    others = all(observed.get(k) == v for k, v in expect.items()
                 if k not in ("outcome", "refused_with"))
    return others and str(expect.get("refused_with", "")) in str(observed.get("why", ""))


def zoo_forms() -> Any:
    """The checkpoint zoo (``script/zoo_forms.py``, standard library only), loaded by path:
    the script folder is not a package, the releases' processes import it by name."""
    import importlib.util

    name = "sm120_zoo_forms"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT.parent / "zoo_forms.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module while the class is made
    spec.loader.exec_module(module)
    return module


def expand_zoo(behaviour: Behaviour, release: Any) -> Behaviour:
    """``models = ["zoo"]`` -> one case per zoo form the release can load, per arguments."""
    if behaviour.check != "serve":
        return behaviour
    known = {f.name: f for f in zoo_forms().FORMS}
    forms = [f.name for f in known.values() if f.buildable and f.in_release(str(release))]
    cases: list[BehaviourCase] = []
    for case in behaviour.cases:
        # a named form the release does not register (Glm5Next before 0.5.20) is left out
        names = forms if case.model == ZOO else \
            [case.model] if case.model not in known or case.model in forms else []
        for name in names:
            expanded = BehaviourCase(name, case.args)
            if expanded not in cases:
                cases.append(expanded)
    from dataclasses import replace

    return replace(behaviour, cases=tuple(cases))


def wheel_for_interpreter(target: Target) -> WheelPin:
    """The target's pinned wheel this interpreter installs.

    Raises:
        ConfigurationError: the target pins no wheel (sdist releases have no behaviours)
            or none for this Python.
    """
    pins = [p for p in target.sources if isinstance(p, WheelPin)]
    if not pins:
        raise ConfigurationError(f"target {target.name} pins no wheel",
                                 "give --target a wheel target (0.5.11 and later; `python -m "
                                 "builder targets` lists them): this step runs the release's "
                                 "own code")
    order = {str(tag): i for i, tag in enumerate(sys_tags())}
    ranked = sorted((min((order.get(str(t), 1 << 30) for t in
                         parse_wheel_filename(p.filename)[3]), default=1 << 30), p.filename, p)
                    for p in pins)
    if ranked[0][0] == 1 << 30:
        raise ConfigurationError(
            f"target {target.name} pins no wheel for Python {sys.version_info[0]}."
            f"{sys.version_info[1]} on this platform",
            "run with one of the pinned wheels' Pythons (see targets.toml)")
    return ranked[0][2]


def behaviours_of(series: Series, release: Any) -> list[tuple[SeriesEntry | None, Behaviour]]:
    """The behaviours of the patches that apply to ``release``, in series order, then the
    series' invariants (entry ``None``); zoo cases expanded for the release."""
    pairs: list[tuple[SeriesEntry | None, Behaviour]] = [
        (entry, b) for entry in series.entries if entry.applies_to(release)
        for b in entry.behaviours
        if b.versions is None or b.versions.contains(release, prereleases=True)]
    pairs += [(None, b) for b in series.invariants
              if b.versions is None or b.versions.contains(release, prereleases=True)]
    return [(entry, expand_zoo(b, release)) for entry, b in pairs]


#: The name a series invariant reports under.
INVARIANT = "series invariant"


def _run_script(env: BehaviourEnv, cases: list[dict[str, Any]], capability: tuple[int, int],
                overlay: Path | None, models: Path) -> dict[str, dict[str, Any]]:
    request = {"cases": cases, "standins": env.standins, "models": str(models)}
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    environ["SM120_CAPABILITY"] = f"{capability[0]}.{capability[1]}"
    # The overlay is a cache entry, checked by digest before a wheel is built from it:
    # importing it must not write __pycache__ into it.
    environ["PYTHONDONTWRITEBYTECODE"] = "1"
    if overlay is not None:
        environ["PYTHONPATH"] = str(overlay)
    done = subprocess.run([str(env.python), str(SCRIPT)], input=json.dumps(request),
                          capture_output=True, text=True, env=environ, check=False,
                          timeout=3600)
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith(_PREFIX):
            record = json.loads(line[len(_PREFIX):])
            observed = record.get("observed") or {"error": record.get("error", "no result")}
            observed["stood_in_calls"] = record.get("stood_in_calls", [])
            found[record["id"]] = observed
    missing = [c["id"] for c in cases if c["id"] not in found]
    if missing:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise PatchError(f"the behaviour checks printed no result for {len(missing)} case(s) "
                         f"(exit {done.returncode}):\n{tail}",
                         "run the script by hand in the behaviour environment to see why")
    return found


def _case_id(behaviour: int, case: int, capability: tuple[int, int]) -> str:
    return f"b{behaviour}-c{case}-{capability[0]}{capability[1]}"


def _observe(env: BehaviourEnv, cases: list[dict[str, Any]], capability: tuple[int, int],
             overlay: Path | None, overlay_key: str, models: Path, cache: Cache | None
             ) -> dict[str, dict[str, Any]]:
    """:func:`_run_script`, its answer kept in the cache under everything it depends on
    (the environment, the code run, the script, the cases, the device), so an unchanged
    series on an unchanged release runs nothing the second time."""
    if cache is None or not env.key:
        return _run_script(env, cases, capability, overlay, models)
    # kernel_fit.py is the kernel-fit check's (builder.behaviour.fit keys its own runs),
    # select_backends.py the kernel derivation's (builder.kernels.derive), autotune_path.py
    # warm-cache's (builder.smoke.autotune_path): none runs here
    script = {p.name: sha256_file(p) for p in sorted(SCRIPT.parent.glob("*.py"))
              if p.name not in ("kernel_fit.py", "select_backends.py", "autotune_path.py")}
    key = sha256_json({"env": env.key, "code": overlay_key, "script": script, "cases": cases,
                       "standins": env.standins, "capability": list(capability)})

    def run(folder: Path) -> dict[str, Any]:
        return {"observed": _run_script(env, cases, capability, overlay, models)}

    entry = cache.artifact("behaviour-observed", key, run, record="",
                           valid=lambda meta: "observed" in meta)
    observed: dict[str, dict[str, Any]] = entry.meta["observed"]
    return observed


def check_behaviours(behaviours: Iterable[tuple[SeriesEntry | None, Behaviour]],
                     env: BehaviourEnv,
                     patched: Path, *, models: Path, reporter: Reporter | None = None,
                     cache: Cache | None = None, patched_key: str = ""
                     ) -> list[BehaviourResult]:
    """Run ``behaviours`` on upstream's code and on the patched tree; judge each.

    Args:
        behaviours: (patch, behaviour) pairs, as :func:`behaviours_of` gives them.
        env: the release's behaviour environment.
        patched: the patched tree (holds the patched ``sglang`` package).
        models: a folder for the tiny model configurations.
        reporter: progress.
        cache: keep each run's observations here (``None``: run every time).
        patched_key: the patched tree's content key (names its observations in the cache).

    Raises:
        PatchError: the script gave no result for a case (it crashed).
    """
    reporter = reporter or Reporter(quiet=True)
    pairs = list(behaviours)
    jobs: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for b_index, (_entry, behaviour) in enumerate(pairs):
        for capability in behaviour.capabilities:
            for c_index, case in enumerate(behaviour.cases):
                case_id = _case_id(b_index, c_index, capability)
                jobs.setdefault(capability, []).append(
                    {"id": case_id, "check": behaviour.check, "model": case.model,
                     "args": dict(case.args)})
    observed: dict[str, dict[str, dict[str, Any]]] = {"upstream": {}, "patched": {}}
    for capability, cases in sorted(jobs.items()):
        for variant, overlay, code in (("upstream", None, "upstream"),
                                       ("patched", patched, patched_key)):
            reporter.info(f"behaviour checks: {len(cases)} case(s) on {variant} code, device "
                          f"sm_{capability[0]}{capability[1]}")
            found = _observe(env, cases, capability, overlay, code if code else "",
                             models, cache if code else None)
            for job in cases:
                if job["check"] == "serve":
                    verdict = judge(found[job["id"]])
                    found[job["id"]].update(outcome=verdict.outcome, why=verdict.why)
            observed[variant].update(found)
    results = []
    for b_index, (entry, behaviour) in enumerate(pairs):
        cases_out = []
        for capability in behaviour.capabilities:
            for c_index, case in enumerate(behaviour.cases):
                case_id = _case_id(b_index, c_index, capability)
                up, new = observed["upstream"][case_id], observed["patched"][case_id]
                cases_out.append(CaseResult(case, capability, up, new,
                                            _rule(behaviour, new, up),
                                            _rule(behaviour, up, up)))
        results.append(BehaviourResult(entry.name if entry else INVARIANT, behaviour,
                                       tuple(cases_out)))
    return results


def run_behaviour(options: Options) -> BehaviourReport:
    """Source, patch and behaviour stages for a target.

    Returns:
        The report; :attr:`BehaviourReport.proven` says whether every behaviour is.

    Raises:
        ConfigurationError: the target pins no wheel for this interpreter.
        PatchError: the series does not apply, a behaviour is not proven, an unmet
            precondition is not answered by its proven behaviour, or a kernel the patched
            code picks on SM12x does not fit SM120 (the report is attached).
        MissingToolError: a kernel fit is declared and nvcc is missing.
        BuildError: the environment could not be installed.
    """
    from builder.patching.apply import apply_series, read_series
    from builder.patching.series import select_series
    from builder.source.fetch import fetch_pin

    target = select_target(options)
    series = select_series(options, target)
    read_series(series)  # a bad series fails before any download
    release = target.upstream_version
    pairs = behaviours_of(series, release)
    pin = wheel_for_interpreter(target)
    source = fetch_pin(pin, release, cache=options.cache, index_url=options.index_url,
                       reporter=options.reporter)
    assert source.archive is not None  # a wheel pin always has its file
    patched = apply_series(source, series, cache=options.cache)
    report = BehaviourReport(target.name, str(release))
    seen: set[Precondition] = set()
    for entry in series.entries:
        for pre in entry.preconditions if entry.applies_to(release) else ():
            if pre not in seen:
                seen.add(pre)
                report.preconditions.append(check_precondition(
                    pre, source.archive, cache=options.cache, index_url=options.index_url,
                    reporter=options.reporter))
    fit_pairs = fits_of(series, release)
    if pairs or fit_pairs:
        step = f"the behaviour environment of sglang {release}"
        try:
            env = behaviour_env(source.archive, str(release), cache=options.cache,
                                reporter=options.reporter)
            report.not_installed, report.standins = env.not_installed, env.standins
            models = options.cache.root / "behaviour-models"
            models.mkdir(parents=True, exist_ok=True)
            step = "the behaviour checks' results"
            report.results = check_behaviours(pairs, env, patched.tree, models=models,
                                              reporter=options.reporter, cache=options.cache,
                                              patched_key=patched.key)
            step = "the kernel-fit check (its TileLang install)"
            report.kernel_fit = check_fits(fit_pairs, env, source.archive, patched.tree,
                                           cache=options.cache, patched_key=patched.key,
                                           reporter=options.reporter)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            need = SIZES["tilelang"] if "kernel-fit" in step else SIZES["environment"]
            raise disk_full(options.cache.root, step, need).replaced(report=report) from None
        except BuilderError as exc:
            if exc.report is not None:
                raise
            # The verdicts computed before the failure are printed with it (and in --json).
            raise exc.replaced(report=report) from None
    unproven = [r.behaviour.name for r in report.results if not r.proven] + \
        [f"precondition {p.precondition.name!r} is not met by {p.precondition.distribution}"
         f"=={p.pin} and no proven behaviour says {p.precondition.unmet!r}"
         for p in report.unanswered]
    if unproven:
        raise PatchError(f"{len(unproven)} behaviour(s) of the series are not proven on "
                         f"{target.name}: {'; '.join(unproven)}",
                         "each line of the summary says which case missed", report=report)
    try:
        require_fit(report.kernel_fit, target.name)
    except PatchError as exc:
        raise exc.replaced(report=report) from None
    return report


#: Outcomes from worst to best, the order a table cell lists them in.
_SEVERITY = ("crashes", "wrong-numbers", "unjudged", "refused", "serves")


def checkpoint_cells(report: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Per zoo form: (upstream, patched) outcomes over every invariant case of a report.

    Args:
        report: :meth:`BehaviourReport.to_json` of one target.

    Returns:
        form name -> two cells, each the outcomes seen with their case counts, worst first
        (``"crashes 3"``, ``"serves 5, refused 1"``).
    """
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for result in report.get("results", []):
        if result.get("patch") != INVARIANT:
            continue
        for case in result["cases"]:
            form = str(case["case"]).split(" ", 1)[0]
            sides = counts.setdefault(form, {"upstream": {}, "patched": {}})
            for side in ("upstream", "patched"):
                outcome = str(case[side].get("outcome"))
                sides[side][outcome] = sides[side].get(outcome, 0) + 1

    def cell(found: dict[str, int]) -> str:
        order = [o for o in _SEVERITY if o in found] + sorted(set(found) - set(_SEVERITY))
        return ", ".join(f"{o} {found[o]}" for o in order)

    return {form: (cell(sides["upstream"]), cell(sides["patched"]))
            for form, sides in sorted(counts.items())}


def checkpoint_table(reports: list[dict[str, Any]]) -> str:
    """The docs' table: checkpoint form x target x (upstream, patched), from the reports."""
    return _render_table({r["target"]: checkpoint_cells(r) for r in reports},
                         [r["target"] for r in reports])


def _render_table(cells: dict[str, dict[str, tuple[str, str]]], targets: list[str]) -> str:
    forms = zoo_forms().FORMS
    head = "| form (stands for) | " + " | ".join(
        f"{t} upstream | {t} patched" for t in targets) + " |"
    rule = "| --- |" + " --- | --- |" * len(targets)
    rows = [head, rule]
    for form in forms:
        stands_for = form.stands_for if form.stands_for.startswith("(") else \
            f"({form.stands_for})"
        row = [f"`{form.name}` {stands_for}"]
        for target in targets:
            upstream, patched = cells[target].get(form.name, ("not loaded", "not loaded"))
            row += [upstream, patched]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows) + "\n"


#: The markers around the zoo table in docs/upstream.md.
ZOO_TABLE_MARKERS = ("<!-- zoo-table:start -->\n", "<!-- zoo-table:end -->")


def read_checkpoint_table(markdown: str) -> dict[str, dict[str, tuple[str, str]]]:
    """The zoo table between :data:`ZOO_TABLE_MARKERS` of a page, as :func:`checkpoint_cells`
    gives one target's.

    Args:
        markdown: the page (docs/upstream.md).

    Returns:
        target -> form name -> (upstream, patched) cells, in the table's column order;
        a form the target did not load ("not loaded") is left out.

    Raises:
        ConfigurationError: the page has no table between the markers, or a row of it is not
            a form name in backticks with two cells per target of the header.
    """
    start, end = ZOO_TABLE_MARKERS
    if start not in markdown or end not in markdown.split(start, 1)[1]:
        raise ConfigurationError(f"no zoo table between {start.strip()} and {end} in the page",
                                 "give the page that has it (docs/upstream.md)")
    table = markdown.split(start, 1)[1].split(end, 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in table.splitlines() if line.startswith("|")]
    fix = "write the table as docs/upstream.md has it, or restore it from git"
    if len(rows) < 2 or len(rows[0]) % 2 != 1:
        raise ConfigurationError("the zoo table has no header of a form column and two "
                                 "columns per target", fix)
    head, body = rows[0], rows[2:]
    for row in body:
        if len(row) != len(head) or row[0].count("`") < 2:
            raise ConfigurationError(f"the zoo table's row {' | '.join(row)!r} is not a form "
                                     f"name in backticks and {len(head) - 1} cells", fix)
    targets = [h.removesuffix(" upstream") for h in head[1::2]]
    return {target: {row[0].split("`")[1]: (row[1 + 2 * i], row[2 + 2 * i]) for row in body
                     if row[1 + 2 * i] != "not loaded"}
            for i, target in enumerate(targets)}


def read_docs_table(path: Path) -> str:
    """The page at ``path`` (``behaviour --docs-table``), checked to hold a zoo table that
    :func:`with_checkpoint_columns` can rewrite.

    Raises:
        ConfigurationError: it is a link, folder or special file (the run replaces it whole:
            ``builder.core.cache.replaceable``), it cannot be read as UTF-8 text, or its
            table is missing or malformed (:func:`read_checkpoint_table`).
    """
    from builder.core.cache import replaceable

    replaceable(path)  # refused before the run, not after it
    try:
        page = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigurationError(f"cannot read --docs-table {path}: {error}",
                                 "give the page with the zoo table (docs/upstream.md)"
                                 ) from None
    read_checkpoint_table(page)
    return page


def with_checkpoint_columns(markdown: str, report: dict[str, Any],
                            releases: dict[str, str]) -> str:
    """A page whose zoo table has the report's target's two columns from the report.

    A new release's run adds its columns (docs/new-release.md, step 4); a target's run
    again replaces them; the other targets' columns are kept as they are.

    Args:
        markdown: the page (docs/upstream.md).
        report: :meth:`BehaviourReport.to_json` of one target.
        releases: target -> upstream version, the order of the columns (a target that is
            not in it keeps its place after those that are).

    Returns:
        The page, the table between :data:`ZOO_TABLE_MARKERS` rewritten.

    Raises:
        ConfigurationError: the page has no zoo table between the markers, or a malformed
            one (:func:`read_checkpoint_table`).
    """
    cells = read_checkpoint_table(markdown)
    cells[report["target"]] = checkpoint_cells(report)
    releases = {**releases, report["target"]: report["release"]}
    known = sorted((t for t in cells if t in releases), key=lambda t: Version(releases[t]))
    targets = known + [t for t in cells if t not in releases]
    start, end = ZOO_TABLE_MARKERS
    before, rest = markdown.split(start, 1)
    return before + start + _render_table(cells, targets) + end + rest.split(end, 1)[1]
