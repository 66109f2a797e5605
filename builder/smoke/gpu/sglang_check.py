"""Check 2, judged here from the probe's ``sglang-data``: the installed sglang carries our
provenance, its files equal its RECORD, the provenance (and RECORD) equal the artifact's,
and every intent check of the series holds in the installed files."""

from __future__ import annotations

import csv
import io
import zipfile
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from builder.core.cache import sha256_json
from builder.core.errors import ConfigurationError
from builder.core.layout import Layout
from builder.core.userfiles import parse_json
from builder.patching.series import Series
from builder.smoke.gpu.report import CheckResult
from builder.smoke.shared import ProbeCheck, SglangData, Status
from builder.wheel.build import PROVENANCE_FILE


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
            provenance = parse_json(archive.read(info))
            record = archive.read(record_name).decode()
    except (OSError, ValueError, RecursionError, zipfile.BadZipFile) as exc:
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

    Raises:
        ProbeOutputError: the collection's data is not what the probe writes
            (:meth:`~builder.smoke.shared.ProbeData.check`).
    """
    name = "sglang"
    info = SglangData.read(data) if data is not None and data.status == Status.PASSED \
        else None
    if info is None:
        return CheckResult(name, Status.FAILED, data.detail if data and data.detail else
                           "no data from the probe")
    if info.provenance is None:
        return CheckResult(name, Status.FAILED, f"sglang {info.version} has no "
                           f"{PROVENANCE_FILE}: it is not a wheel of this project",
                           data={"version": info.version})
    provenance, unusable = _provenance_record(info.provenance)
    if unusable:
        return CheckResult(name, Status.FAILED, f"sglang {info.version}'s {PROVENANCE_FILE} "
                           f"{unusable}: it is not a provenance record of this project",
                           data={"version": info.version})
    problems = _artifact_problems(info, provenance, expected, expected_record)
    intents = _intents(series, provenance, InstalledTree(info.record, info.texts), problems)
    if not intents and not problems:
        problems.append(f"no patch of {series.path} applies to the installed sglang "
                        f"{provenance.get('upstream_version')}: its intent was not checked")
    summary = {"version": info.version, "provenance_sha256": sha256_json(provenance),
               "target": provenance.get("target"),
               "upstream_version": provenance.get("upstream_version"), "intents": intents,
               "compared_with": "artifact" if expected is not None else None}
    if problems:
        return CheckResult(name, Status.FAILED, "; ".join(problems), data=summary)
    held = "; ".join(f"{i['patch']}: {i['detail']}" for i in intents)
    detail = f"sglang {info.version} ({provenance.get('target')}); intent holds: {held}"
    if expected is None:
        return CheckResult(name, Status.WARNING, detail + "; not compared with an artifact "
                           "(give --sglang-wheel or --expect-provenance)", data=summary)
    return CheckResult(name, Status.PASSED, detail + "; provenance equals the artifact's",
                       data=summary)


def _artifact_problems(info: SglangData, provenance: Mapping[str, Any],
                       expected: Mapping[str, Any] | None,
                       expected_record: Mapping[str, str] | None) -> list[str]:
    """What differs between the installed sglang, its own records and the artifact's."""
    problems = []
    if provenance.get("version") != info.version:
        problems.append(f"installed version {info.version} but the provenance says "
                        f"{provenance.get('version')}")
    if info.mismatched or info.missing:
        changed = [*info.mismatched, *info.missing]
        problems.append(f"{len(changed)} installed files differ from the RECORD "
                        f"(edited after install?): {', '.join(changed[:3])}")
    if expected is not None and dict(expected) != provenance:
        keys = sorted(k for k in set(expected) | set(provenance)
                      if expected.get(k) != provenance.get(k))
        problems.append(f"the provenance differs from the artifact's in {', '.join(keys)}")
    if expected_record is not None:
        installed = {k: v for k, v in info.record.items() if v}
        differ = sorted(k for k in set(expected_record) | set(installed)
                        if expected_record.get(k) != installed.get(k))
        if differ:
            problems.append(f"{len(differ)} installed files differ from the wheel's: "
                            f"{', '.join(differ[:3])}")
    return problems


def _intents(series: Series, provenance: Mapping[str, Any], reader: InstalledTree,
             problems: list[str]) -> list[dict[str, Any]]:
    """Evaluate the intent checks of every patch the wheel applied; each failure (and a
    patch built from other bytes than the series pins) is added to ``problems``."""
    intents: list[dict[str, Any]] = []
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
    return intents


def _provenance_record(text: str) -> tuple[dict[str, Any], str | None]:
    """The installed provenance record parsed, or why it cannot be judged.

    Returns:
        The record and ``None``, or ``{}`` and what is wrong with it (not JSON, not an
        object, ``patches`` not a list of objects with a string ``name``).
    """
    try:
        provenance = parse_json(text)
    except (ValueError, RecursionError) as exc:
        return {}, f"is not JSON ({exc})"
    if not isinstance(provenance, dict):
        return {}, f"is a JSON {type(provenance).__name__}, not an object"
    patches = provenance.get("patches", [])
    if not isinstance(patches, list) or not all(
            isinstance(p, dict) and isinstance(p.get("name"), str) for p in patches):
        return {}, "has patches that are not a list of objects with a string name"
    return provenance, None
