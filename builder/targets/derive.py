"""The launch profile of a new target, derived from its neighbour's, with the claims to
re-check marked.

A profile's values rest on facts of its release's code (a default, what a patch makes
``auto`` resolve to, an upstream issue's figure), written as comments beside them. Copying
the nearest profile by hand copied its stale claims too. :func:`derive_profile` picks the
neighbour whose patches in effect match the new release's (the same ``NNNN-`` families;
else the most in common, then the nearest release), copies it with the new target's name
and release, and marks with ``# RE-CHECK`` every comment that states such a fact (it names
the neighbour's release, a patch, an upstream issue or pull request, or a default /
``auto``), so that each is checked in the new release's code before the mark is removed.
"""

from __future__ import annotations

import bisect
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from builder.core.config import Target
from builder.patching.series import Series

#: The mark put before each claim to re-check (``_profile_gaps`` counts them).
MARK = "# RE-CHECK"


@dataclass(frozen=True)
class DerivedProfile:
    """A profile derived from a neighbour's.

    Attributes:
        neighbour: the target whose profile was copied.
        same_patches: whether its patches in effect (by ``NNNN-`` family) are the new
            release's.
        differ: the families in effect on one release and not the other (``+NNNN`` new,
            ``-NNNN`` gone).
        text: the new profile.
        recheck: one line per marked claim (``[table] the claim's first words``).
    """

    neighbour: str
    same_patches: bool
    differ: tuple[str, ...]
    text: str
    recheck: tuple[str, ...]


def _family(name: str) -> str:
    found = re.match(r"(\d+)-", name)
    return found.group(1) if found else name


def families_in_effect(series: Series, version: Version) -> frozenset[str]:
    """The ``NNNN`` families of the patches whose range contains ``version``."""
    return frozenset(_family(e.name) for e in series.entries if e.applies_to(version))


def _why(claim: str, version: str) -> str | None:
    # What makes a comment a fact of one release's code.
    if re.search(rf"(?<![\d.]){re.escape(version)}(?![\d])", claim):
        return f"names {version}"
    found = re.search(r"\bpatch(?:es)? (0\d{3})|\((0\d{3})\)", claim)
    if found:
        return f"names patch {found.group(1) or found.group(2)}"
    found = re.search(r"(?:issue|PR|pull request) #?(\d{3,})|#(\d{4,})", claim)
    if found:
        return f"names upstream #{found.group(1) or found.group(2)}"
    if re.search(r"\b(default|auto)\b", claim):
        return "a default of the release"
    return None


def mark_claims(text: str, version: str) -> tuple[str, tuple[str, ...]]:
    """``text`` with a ``# RE-CHECK`` line before each comment claim about ``version``.

    A claim is a ``# - `` bullet (with its indented continuation lines) or a run of
    comment lines; it is marked when :func:`_why` finds a release-specific fact in it.

    Args:
        text: the neighbour's profile.
        version: the neighbour's release.

    Returns:
        The marked text, and one line per marked claim (``[table] its first words (why)``).
    """
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if text.count("\r\n") == text.count("\n") and "\r\n" in text else "\n"
    out: list[str] = []
    found: list[str] = []
    table = "top"
    index = 0
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        if stripped.startswith("[") and not stripped.startswith("#"):
            table = stripped
        if not stripped.startswith("#"):
            out.append(line)
            index += 1
            continue
        end = index + 1
        bullet = stripped.startswith("# - ")
        while end < len(lines):
            following = lines[end].strip()
            if not following.startswith("#") or following.startswith("# - ") or (
                    not bullet and following == "#"):
                break
            if bullet and not following.startswith("#  "):
                break
            end += 1
        claim = " ".join(x.strip().lstrip("#").strip() for x in lines[index:end])
        why = _why(claim, version)
        if why is not None:
            indent = line[:len(line) - len(line.lstrip())]
            out.append(f"{indent}{MARK} ({why}): check it in the new release's code, then "
                       f"remove this line{newline}")
            words = claim.removeprefix("- ")
            found.append(f"{table} {words[:90]}{'...' if len(words) > 90 else ''} ({why})")
        out.extend(lines[index:end])
        index = end
    return "".join(out), tuple(found)


def derive_profile(*, name: str, version: str, in_effect: Iterable[str], series: Series,
                   targets: Iterable[Target], profiles: Path) -> DerivedProfile | None:
    """The new target's profile, from the neighbour whose patches in effect match.

    Args:
        name: the new target's name.
        version: its release.
        in_effect: the patches in effect on it (the matrix's column).
        series: the series (the neighbours' patches in effect are read from its ranges).
        targets: the other targets.
        profiles: the profiles folder (``images/profiles``).

    Returns:
        The derived profile, or ``None`` when no other target has a profile with per-GPU
        values to start from.
    """
    release = Version(version)
    wanted = frozenset(_family(p) for p in in_effect)
    candidates = []
    for target in targets:
        path = profiles / f"{target.name}.toml"
        try:
            text = path.read_text()
            data = tomllib.loads(text)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        if target.upstream_version == release or not data.get("gpu"):
            continue
        theirs = families_in_effect(series, target.upstream_version)
        candidates.append((target, text, theirs))
    if not candidates:
        return None
    # Nearest by rank among the candidates' releases; an older one before a newer one.
    ordered = sorted(c[0].upstream_version for c in candidates)
    at = bisect.bisect_left(ordered, release)

    def key(candidate: tuple[Target, str, frozenset[str]]) -> tuple[bool, int, int, bool]:
        target, _, theirs = candidate
        rank = ordered.index(target.upstream_version)
        near = -(at - rank) if rank < at else -(rank - at + 1)
        return (theirs == wanted, len(wanted & theirs) - len(wanted ^ theirs), near,
                target.upstream_version < release)

    target, text, theirs = max(candidates, key=key)
    differ = tuple(sorted([f"+{f}" for f in wanted - theirs] + [f"-{f}" for f in theirs - wanted]))
    old = str(target.upstream_version)
    body, recheck = mark_claims(text, old)
    body = re.sub(r'(?m)^target = ".*"', f'target = "{name}"', body, count=1)
    body = re.sub(r'(?m)^upstream_version = ".*"', f'upstream_version = "{version}"', body,
                  count=1)
    newline = "\r\n" if "\r\n" in text else "\n"
    same = (f"are {version}'s" if theirs == wanted
            else f"differ from {version}'s ({', '.join(differ)})")
    header = (f"# Derived by `python -m builder add-target` from {target.name}.toml: its "
              f"patches in effect{newline}# {same}. Each {MARK} line marks "
              f"a claim about {old}'s code: check it in{newline}# {version}'s, then remove "
              "the line; `serve-command --target "
              f"{name} --check --all` parses the values.{newline}")
    return DerivedProfile(target.name, theirs == wanted, differ, header + body, recheck)
