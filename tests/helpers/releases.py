"""The real SGLang releases the tests use, pinned by sha256, and their download."""

from __future__ import annotations

import hashlib
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.paths import TEST_CACHE


@dataclass(frozen=True)
class Release:
    """One release file on PyPI: its version, sha256 (the pin) and URL."""

    version: str
    sha256: str
    url: str


# The real sdists on PyPI (files.pythonhosted.org), the sha256 being the pin.
RELEASES = {
    "0.5.7": Release("0.5.7", "930e00658128016838d14dddb4527a0948d512cd1f265d465de98d32414b89ed",
                     "https://files.pythonhosted.org/packages/d7/bd/1943cac907b2aa575853bf9d2a95c315caf3473ec6edd826e96d7e3adf7d/sglang-0.5.7.tar.gz"),
    "0.5.9": Release("0.5.9", "11b1445bfb039c20217783850fda66a71b814391b2cf313f4e6cadc3b9fea41b",
                     "https://files.pythonhosted.org/packages/3b/a8/2e75eae9f5817510175c299016b9c2fc324d06a9fa56944322a2e731ef59/sglang-0.5.9.tar.gz"),
    "0.5.10.post1": Release(
        "0.5.10.post1", "01f7adfe7cde85b238fb0e1bae4b31d494e19d1471cf35ff3c5489a02f9d2263",
        "https://files.pythonhosted.org/packages/42/38/feb04f6478b90315606fcd62b798917e7fcee9f1d7d84b01cf477398045e/sglang-0.5.10.post1.tar.gz"),
}


# Later releases, for the compatibility matrix: 0.5.10rc0 is the last sdist before
# 0.5.10.post1; from 0.5.11 PyPI has only wheels (cp311 x86_64 pinned here).
FILES = "https://files.pythonhosted.org/packages"
MATRIX_RELEASES = {
    "0.5.10rc0": Release("0.5.10rc0",
                         "ae471aa262a5605329e557dc17e422876f27c1827dc8950cb8911a1c08c640d7",
                         f"{FILES}/cd/1f/aebf2398c1a81e1d1dd81d69f6e719e676b17bf9d263416e1768bef5c3ed/sglang-0.5.10rc0.tar.gz"),
    "0.5.11": Release("0.5.11",
                      "fe0748beaff218d3e16c9018a5e19f018db06fc3c7ac4f90d2f93da1cf074b6f",
                      f"{FILES}/22/38/69c189787023034a3c594d8bb9eefbac86cfa5cd4114c29836b97fce8a10/sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl"),
    "0.5.12.post1": Release(
        "0.5.12.post1", "94b3f3cc6b97f1364f247b8d9c1d106ec63cf22c55d6b65bc40ff29b0206ef5f",
        f"{FILES}/0a/72/705194e7ad564a578251307b51bf3a8275668ab2c534a17ca0dc45767204/sglang-0.5.12.post1-cp311-cp311-manylinux_2_34_x86_64.whl"),
    "0.5.13": Release("0.5.13",
                      "9d26266ab7e99165098f9e173f4a5a0ef6a0b64a6f30ef0b5ee859eead37e75a",
                      f"{FILES}/34/a3/b1e44dc83ba5230943fc54f369b7e3f686e81ede86a757cf9e4845890b97/sglang-0.5.13-cp311-cp311-manylinux_2_34_x86_64.whl"),
    "0.5.16": Release("0.5.16",
                      "d5f345a18953dd35df568ac56bdcb7f5ee910ab39efea4469b714556d1070713",
                      f"{FILES}/1f/ae/b7c8395c265a93bb73618a694594ad1e042ff9f43259d45e54a77a2a4bdf/sglang-0.5.16-cp311-cp311-manylinux_2_34_x86_64.whl"),
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Targets' files the other tables lack, pinned here so that no test asks PyPI for their
# URL (tests.helpers.targets.release_file reads any other target's from targets.toml).
TARGET_RELEASES = {
    "0.5.20": Release("0.5.20",
                      "1573527042f4f6b4ead838302818595fc77fdc611dbcc2e40cd150fbc8f8513c",
                      f"{FILES}/9e/5e/63895828d22998545df27d62bc030d15d13055ac8d1ff2031d1c9a1e54a1/sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl"),
    "0.5.23": Release("0.5.23",
                      "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
                      f"{FILES}/57/dd/0206d00b2ea5b163bbdd216e91cc4f23ea90fde8620db0a6272d4236b68e/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"),
}

def download(release: Release) -> Path:
    """The verified file of ``release`` in the download cache, fetched once."""
    folder = TEST_CACHE / "sdists"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / release.url.rsplit("/", 1)[1]
    if path.is_file() and sha256(path) == release.sha256:
        return path
    tmp = path.with_suffix(".part")
    with urllib.request.urlopen(release.url, timeout=120) as response, tmp.open("wb") as out:
        shutil.copyfileobj(response, out)
    assert sha256(tmp) == release.sha256, f"PyPI served other bytes for {release.url}"
    tmp.replace(path)
    return path



@dataclass(frozen=True)
class UpstreamRepo:
    """A real git repository whose python/ folder holds each release in turn."""

    path: Path
    commits: dict[str, str]  # version -> 40-hex commit


@dataclass(frozen=True)
class UpstreamRelease:
    """A current target's upstream release, unpatched, with its behaviour environment: the
    failing runs of the behaviour and kernel-fit checks use its tree as the 'patched' one."""

    target: Any
    cache: Any
    source: Any
    env: Any


@dataclass(frozen=True)
class PatchedRelease:
    """A current target's release as the tests' cache holds it, with the series applied."""

    env: Any  # its behaviour environment
    archive: Path  # the release's wheel
    series: Any  # the series that applies to it
    tree: Path  # the patched tree
    cache: Any  # the builder Cache over the tests' cache


def patched_release(shared_cache: Path, name: str) -> PatchedRelease:
    """The target ``name``'s wheel, series, patched tree and behaviour environment (each
    made once in ``shared_cache`` and found there afterwards)."""
    from builder.behaviour.env import behaviour_env
    from builder.behaviour.run import wheel_for_interpreter
    from builder.core.cache import Cache
    from builder.core.config import load_targets
    from builder.core.options import Options
    from builder.patching.apply import apply_series
    from builder.patching.series import select_series
    from builder.source.fetch import fetch_pin
    from tests.helpers.paths import REPO

    cache = Cache(shared_cache)
    target = load_targets(REPO / "targets.toml").get(name)
    source = fetch_pin(wheel_for_interpreter(target), target.upstream_version, cache=cache)
    assert source.archive is not None
    options = Options(targets_file=REPO / "targets.toml", target=name, cache_dir=shared_cache)
    series = select_series(options, target)
    patched = apply_series(source, series, cache=cache)
    env = behaviour_env(source.archive, str(target.upstream_version), cache=cache)
    return PatchedRelease(env, source.archive, series, patched.tree, cache)
