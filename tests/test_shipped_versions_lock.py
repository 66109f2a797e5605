"""The repository's own versions.lock is up to date for every pinned target: a change to a
target's series, pins or builder that changes its wheel's content must raise its label (or,
for a version never published, replace the entry) in the same change, as `lock --verify`
tells a user. Otherwise `wheel --target T` on a clean clone stops with "one version must
always mean one content"."""

from __future__ import annotations

import json

import pytest

from builder import load_targets
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO

TARGETS = sorted(load_targets(REPO / "targets.toml").targets)


@pytest.mark.parametrize("target", TARGETS)
def test_the_repository_lock_records_every_target_as_it_is_built_now(target: str) -> None:
    done = run_cli("lock", "--verify", "--target", target, "--json")
    assert done.returncode == 0, json.loads(done.stdout).get("error", done.stdout)
