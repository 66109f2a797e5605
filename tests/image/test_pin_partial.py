"""``pin-images``: one base that cannot be resolved leaves the others pinned, and
``--target NAME`` pins only that target's bases. The registry is a stand-in resolver
(the registry tests are tests/image/test_pin.py); what is tested is which entries are
resolved, written and named."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from builder.core.basepins import load_base_pins
from builder.core.config import load_targets
from builder.core.errors import ConfigurationError, SourceError
from builder.image.pin import run_pin_images
from builder.image.registry import Resolution
from tests.helpers.paths import REPO

PUBLISHED = {"docker.io/lmsysorg/sglang:v0.5.16-cu130-runtime": "1",
             "docker.io/lmsysorg/sglang:v0.5.23-cu130-runtime": "2",
             "docker.io/nvidia/cuda:13.0.1-devel-ubuntu24.04": "3"}


def resolver(name: str, *, platform: str) -> Resolution:
    """The registry as it might answer on a release day: one tag not published yet."""
    if name not in PUBLISHED:
        raise SourceError(f"{name} does not exist in its registry (HTTP 404)",
                          "check the tag")
    return Resolution("sha256:" + PUBLISHED[name] * 64, "", platform, "")


def _pins(tmp_path: Path) -> Path:
    path = tmp_path / "pins.toml"
    path.write_bytes((REPO / "images/pins.toml").read_bytes())
    return path


def test_one_base_not_published_leaves_the_others_pinned(tmp_path: Path) -> None:
    path = _pins(tmp_path)
    with pytest.raises(SourceError) as raised:
        run_pin_images(path, resolver=resolver)
    message = f"{raised.value.cause} {raised.value.hint}"
    assert "v0.5.9-cu129-amd64-runtime does not exist in its registry" in message
    assert "v0.5.20-cu130-runtime does not exist" in message  # every failure named
    assert f"the 3 other entries resolved and were written to {path}" in message
    digests = {p.name: p.digest for p in load_base_pins(path).pins}
    assert {n: d for n, d in digests.items() if d} == {
        n: "sha256:" + v * 64 for n, v in PUBLISHED.items()}
    assert "# Every base image the targets build on" in path.read_text()  # comments kept


def test_pin_images_target_pins_that_targets_bases_only(tmp_path: Path) -> None:
    path = _pins(tmp_path)
    target = load_targets(REPO / "targets.toml").get("sglang-0.5.23")
    report = run_pin_images(path, resolver=resolver, target=target)
    assert [o.pin.name for o in report.outcomes] == [
        "docker.io/lmsysorg/sglang:v0.5.23-cu130-runtime",
        "docker.io/nvidia/cuda:13.0.1-devel-ubuntu24.04"]
    written = {b["name"]: b["digest"] for b in tomllib.loads(path.read_text())["base"]}
    assert written["docker.io/lmsysorg/sglang:v0.5.23-cu130-runtime"].startswith("sha256:")
    assert written["docker.io/lmsysorg/sglang:v0.5.16-cu130-runtime"] == ""  # not its own
    # A target without an entry is refused before any registry is asked.
    other = load_targets(REPO / "targets.toml").get("sglang-0.5.11")
    with pytest.raises(ConfigurationError, match=r"no \[\[base\]\] for target sglang-0\.5\.11"):
        run_pin_images(path, resolver=resolver, target=other)
