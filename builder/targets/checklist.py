"""The one path from a new upstream release to a served, CI-green target: the checklist
``add-target`` prints, and ``docs/new-release.md`` lists (a test holds the two together).

Each step is a command to run, in order: add → matrix → a refresh or a new copy of each
patch that fails → behaviour → the launch profile → ``serve-command --check --all`` →
base image digests → wheel → lock → what CI needs. Where ``add-target`` found a gap (a
patch that fails, a range that ended) the step names the patch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: The step titles, in order (docs/new-release.md has one section per title).
TITLES = ("add", "matrix", "patches", "behaviour", "profile", "check", "base", "wheel",
          "lock", "ci")


@dataclass(frozen=True)
class Step:
    """One step of the checklist.

    Attributes:
        title: one of :data:`TITLES`.
        what: what the step does, or why it is needed, in one sentence.
        commands: the commands to run, in order (copy-pasteable).
    """

    title: str
    what: str
    commands: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"title": self.title, "what": self.what, "commands": list(self.commands)}


def _patch_commands(name: str, version: str, failing: Iterable[str],
                    ended: Iterable[str]) -> tuple[str, ...]:
    commands: list[str] = []
    for patch in failing:
        stem = patch.removesuffix(".patch")
        commands += [
            f"python -m builder refresh --target {name} --patch patches/{patch} "
            "--output-dir refreshed",
            f"python -m builder add-patch refreshed/{patch} --name {stem}-{version}.patch "
            f"--versions '>={version}' --description '<its description> ({version})'",
        ]
    ended = tuple(ended)
    if ended:
        commands += [f"$EDITOR patches/series.toml  # widen the versions of "
                     f"{', '.join(ended)} where the change is still needed",
                     f"python -m builder matrix --versions {version}"]
    for patch in ended:  # a widened patch that needs fuzz there gets its own copy
        stem = patch.removesuffix(".patch")
        commands += [
            f"python -m builder refresh --target {name} --patch patches/{patch} "
            f"--output-dir refreshed  # only if the widened {patch} needs fuzz: review "
            "the placement, then add --accept-fuzz",
            f"python -m builder add-patch refreshed/{patch} --name {stem}-{version}.patch "
            f"--versions '>={version}' --description '<its description> ({version})'  # then "
            "put the widening back, and end this range before a later copy of the patch",
        ]
    if commands:
        commands.append(f"python -m builder matrix --versions {version}")
    return tuple(commands)


def checklist(name: str, version: str, *, failing: Iterable[str] = (),
              ended: Iterable[str] = (), recheck: Iterable[str] = (),
              derived_from: str | None = None) -> tuple[Step, ...]:
    """The steps that take target ``name`` (release ``version``) to a served, CI-green one.

    Args:
        name: the target's name (``sglang-0.5.24``).
        version: its upstream release.
        failing: patches that fail, are not reached, or whose intent checks fail there.
        ended: patches whose range ended before the release (``patch-range`` gaps).
        recheck: the profile's claims to re-check in the release's code (step ``profile``).
        derived_from: the target whose profile add-target copied.

    Returns:
        The steps, in the order of :data:`TITLES`.
    """
    failing, ended, recheck = tuple(failing), tuple(ended), tuple(recheck)
    profile = f"images/profiles/{name}.toml"
    patches = _patch_commands(name, version, failing, ended)
    return (
        Step("add", "pin the release: targets.toml, a [[base]] in images/pins.toml, the "
             "launch profile derived from its neighbour", (
                 f"python -m builder add-target {version}",)),
        Step("matrix", "the series on the new release (add-target printed it once)", (
            f"python -m builder matrix --versions {version}",)),
        Step("patches", "a refreshed copy of each patch that fails, as its own series entry "
             "(an in-place refresh is refused while another target uses the patch)"
             if failing else "decide each ended range: widen it where upstream lacks the "
             "change" if ended else "every patch applies: nothing to refresh",
             patches or (f"python -m builder patch --target {name} --dry-run",)),
        Step("behaviour", "every SM12x behaviour of the series proven on the release (the "
             "first run installs its environment: minutes, about 5 GB); its columns written in "
             "the checkpoint-zoo table of docs/upstream.md", (
                 f"python -m builder behaviour --target {name} --docs-table docs/upstream.md",)),
        Step("profile", (f"{profile} was derived from {derived_from}'s: check the "
                         f"{len(recheck)} claim(s) marked RE-CHECK in the release's code, "
                         "then remove the marks" if derived_from else
                         f"fill {profile} from the nearest release's profile and check "
                         "each value's evidence in the release's code"), (
                             f"$EDITOR {profile}",)),
        Step("check", "every GPU x TP of the profile parsed by the release's own server "
             "arguments, in one run", (
                 f"python -m builder serve-command --target {name} --check --all",)),
        Step("base", "upstream's runtime image pinned by digest (where docker.io is "
             "reachable)", (f"python -m builder pin-images --target {name}",)),
        Step("wheel", "the patched wheel, built once", (
            f"python -m builder wheel --target {name}",)),
        Step("lock", "the version's content recorded in versions.lock", (
            f"python -m builder lock --target {name}", "python -m builder lock --verify")),
        Step("ci", "commit targets.toml, versions.lock, images/pins.toml, the profile, "
             "docs/upstream.md and any new patch; the tests read the targets from "
             "targets.toml, and a per-release table a slow test lacks names its file and key", (
                 "python -m builder plan", "nox -s lint tests")),
    )


def checklist_lines(steps: Iterable[Step]) -> list[str]:
    """The checklist as numbered plain-text lines (the commands indented below each step).

    Args:
        steps: from :func:`checklist`.

    Returns:
        The lines.
    """
    lines: list[str] = []
    for number, step in enumerate(steps, 1):
        lines.append(f"{number:>2}. {step.title}: {step.what}")
        lines += [f"      {command}" for command in step.commands]
    return lines
