"""Targets and series files: the shipped ones parse; every malformed one is one message."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from builder import BuilderError, ConfigurationError, load_targets
from builder.core.config import WheelPin
from builder.patching.series import load_series
from tests.helpers.paths import REPO
from tests.helpers.targets import target_names

ENTRY = '''
[[patch]]
file = "x.patch"
sha256 = "{sha}"
strip = 1
{extra}
'''
SHA = "0" * 64


def test_shipped_files_parse() -> None:
    targets = load_targets(REPO / "targets.toml")
    assert targets.default == "sglang-0.5.9"
    assert targets.get(None).version == "0.5.9+sm120.1"
    series = load_series(REPO / "patches" / "series.toml")
    # The loader keeps the file's [[patch]] tables, in order (read here with tomllib alone),
    # and the series and patches/ name the same files: a new copy needs no edit here.
    raw = tomllib.loads((REPO / "patches" / "series.toml").read_text())
    assert [e.name for e in series.entries] == [p["file"] for p in raw["patch"]]
    assert sorted(e.name for e in series.entries) == sorted(
        p.name for p in (REPO / "patches").glob("*.patch"))
    assert len(series.entries) >= 22  # 0001-0007 and their copies (2026-12-03)
    # Every target of the file, those written by python -m builder add-target included, in
    # the file's order (read from the file: a new target needs no edit here).
    assert list(targets.targets) == target_names()
    assert all(t.name.endswith(str(t.upstream_version)) for t in targets.targets.values())


@pytest.mark.parametrize(("extra", "message"), [
    ("", "missing key 'versions'"),
    ('versions = ""', "is empty or has an empty clause"),
    ('versions = ">=0.5.7,,<0.5.11"', "is empty or has an empty clause"),
    ("versions = 5", "'versions' must be a string"),
    ('versions = "0.5.7 - 0.5.11"', "is not a PEP 440 version range"),
    ('versions = ">=0.5"\ndescripton = "typo"', "unknown key(s) descripton"),
    ('versions = ">=0.5"\n[patch.intent]\ncheck = "regex-present"',
     "'intent' must be an array of tables"),
    ('versions = ">=0.5"\n[patch.fuzz_allowance]\nmax_fuzz = 1',
     "'fuzz_allowance' must be an array of tables"),
    ('versions = ">=0.5"\nmax_fuzz = 9', "max_fuzz must be an integer from 0 to 3"),
    ('versions = ">=0.5"\n[[patch.fuzz_allowance]]\nversions = ">=0.5"\nmax_fuzz = 1\n'
     'reason = " "', "a fuzz allowance needs a reason"),
    ('versions = ">=0.5"\n[[patch.intent]]\ncheck = "regex-present"\nfile = "a.py"\n'
     'pattern = "("', "bad regular expression"),
    ('versions = ">=0.5"\n[[patch.intent]]\ncheck = "ast"\nfile = "a.py"',
     "unknown intent check 'ast'"),
])
def test_malformed_series_entries(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "series.toml"
    path.write_text(ENTRY.format(sha=SHA, extra=extra))
    with pytest.raises(ConfigurationError) as caught:  # the user's file: exit 2
        load_series(path)
    assert message in caught.value.cause
    assert caught.value.hint


TARGET = '''
[[target]]
name = "t"
upstream_version = "0.5.11"
local_label = "sm120.1"
series = "s.toml"
cuda_lane = "12.9"
arch_list = ["12.0f"]
{extra}
'''


def test_wheel_pin(tmp_path: Path) -> None:
    path = tmp_path / "targets.toml"
    path.write_text(TARGET.format(extra=f'''
[[target.source]]
kind = "wheel"
project = "sglang"
version = "0.5.11"
filename = "sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl"
sha256 = "{SHA}"
'''))
    target = load_targets(path).get("t")
    assert isinstance(target.pin(), WheelPin) and target.prefer == "wheel"
    with pytest.raises(BuilderError, match="declares no sdist source"):
        target.pin("sdist")


@pytest.mark.parametrize(("extra", "message"), [
    ("", "declares no source"),
    ('[[target.source]]\nkind = "svn"', "unknown source kind 'svn'"),
    (f'[[target.source]]\nkind = "sdist"\nproject = "sglang"\nversion = "0.5.9"\nsha256 = "{SHA}"',
     "sdist version 0.5.9 differs from upstream_version 0.5.11"),
    (f'[[target.source]]\nkind = "git"\nurl = "u"\ncommit = "{"a" * 40}"\nbranch = "main"',
     "unknown key(s) branch"),
    ('[target.source]\nkind = "git"', "'source' must be an array of tables"),
])
def test_malformed_targets(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "targets.toml"
    path.write_text(TARGET.format(extra=extra))
    with pytest.raises(BuilderError) as caught:
        load_targets(path)
    assert message in caught.value.cause
    assert caught.value.hint
