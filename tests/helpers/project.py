"""Small projects (``targets.toml``, ``patches/``) written for one test."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from tests.helpers.paths import REPO, TEST_CACHE
from tests.helpers.releases import MATRIX_RELEASES, RELEASES


def target_toml(name: str, version: str, source: str, *, series: str = "patches/series.toml",
                label: str = "sm120.7") -> str:
    """One ``[[target]]`` table; ``source`` is its ``[[target.source]]`` table's body."""
    return f"""
[[target]]
name = "{name}"
upstream_version = "{version}"
local_label = "{label}"
series = "{series}"
cuda_lane = "12.9"
arch_list = ["12.0a"]

[[target.source]]
{source}
"""


def sdist_source(version: str, archive: Path | None = None, sha256: str | None = None) -> str:
    """A ``[[target.source]]`` body pinning the real sdist of ``version`` (local URL)."""
    sha = sha256 or {**RELEASES, **MATRIX_RELEASES}[version].sha256
    url = f'url = "{archive.as_uri()}"' if archive else ""
    return f'kind = "sdist"\nproject = "sglang"\nversion = "{version}"\nsha256 = "{sha}"\n{url}'


def git_source(url: Path | str, commit: str) -> str:
    """A ``[[target.source]]`` body pinning a git commit."""
    return f'kind = "git"\nurl = "{url}"\ncommit = "{commit}"'


def write_project(root: Path, *, sdist: Path | None = None, version: str = "0.5.9",
                  sha256: str | None = None, patches: dict[str, str] | None = None,
                  series: str | None = None, extra_target: str = "") -> Path:
    """Write a small project (targets.toml, patches/) that builds from a local sdist URL.

    Returns the folder; ``dist/`` inside it is where wheels would go.
    """
    root.mkdir(parents=True, exist_ok=True)
    (root / "patches").mkdir(exist_ok=True)
    for shipped in (REPO / "patches").glob("*.patch"):
        shutil.copy(shipped, root / "patches")
    for name, text in (patches or {}).items():
        (root / "patches" / name).write_text(text)
    if series is None:
        series = (REPO / "patches" / "series.toml").read_text()
    (root / "patches" / "series.toml").write_text(series)
    (root / "targets.toml").write_text('default = "t"\n' + target_toml(
        "t", version, sdist_source(version, sdist, sha256)) + extra_target)
    return root


def with_images(root: Path) -> Path:
    """Copy the repository's ``images/`` into the project at ``root``, with the launch
    profile of the real 0.5.9 target as target ``t``'s (a profile names its target).

    Returns ``root``.
    """
    shutil.copytree(REPO / "images", root / "images")
    shipped = (root / "images/profiles/sglang-0.5.9.toml").read_text()
    (root / "images/profiles/t.toml").write_text(
        shipped.replace('target = "sglang-0.5.9"', 'target = "t"'))
    return root


def patch_sha(text: str) -> str:
    """sha256 of a patch text as written by :func:`write_project`."""
    return hashlib.sha256(text.encode()).hexdigest()


WHEEL_0_5_23 = "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"


def project_0_5_23(root: Path) -> Path:
    """The repo's 0.5.23 target with its cp311 wheel only (the stand-in's Python), read from
    the test cache's copy when it is there (verified by its sha256 either way), else from
    the index; the repo's patches and images."""
    root.mkdir()
    shutil.copytree(REPO / "patches", root / "patches")
    shutil.copytree(REPO / "images", root / "images")
    text = (REPO / "targets.toml").read_text()
    start = text.rindex("[[target]]", 0, text.index('name = "sglang-0.5.23"'))
    block = text[start:text.index("[[target]]", start + 1)]
    source = block.index("[[target.source]]")
    cp312 = block.index("[[target.source]]", source + 1)
    copy = TEST_CACHE / "sdists" / WHEEL_0_5_23
    url = f'url = "{copy.as_uri()}"\n' if copy.is_file() else ""
    (root / "targets.toml").write_text('default = "sglang-0.5.23"\n\n'
                                       + block[:cp312].rstrip("\n") + "\n" + url)
    return root
