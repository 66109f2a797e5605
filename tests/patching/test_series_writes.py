"""The series file's two writers (add-patch's new entry, refresh's new pins) change only
what they mean to and render what they write with tomlkit."""

from __future__ import annotations

import shutil
from pathlib import Path

from builder.patching.series import append_entry, load_series, repin_entries
from tests.helpers.paths import REPO


def test_a_new_entry_is_added_at_the_end_and_the_rest_is_kept(tmp_path: Path) -> None:
    series = tmp_path / "series.toml"
    shutil.copy(REPO / "patches" / "series.toml", series)
    before = series.read_bytes()
    (tmp_path / 'x "y".patch').write_text("")
    append_entry(series, {"file": 'x "y".patch', "sha256": "a" * 64,
                           "description": 'quotes " and é', "strip": 1, "versions": ">=0.5.9"})
    assert series.read_bytes().startswith(before.rstrip(b"\n"))
    assert load_series(series).entries[-1].description == 'quotes " and é'


def test_a_repin_changes_only_the_pins_and_keeps_crlf(tmp_path: Path) -> None:
    original = (REPO / "patches" / "series.toml").read_bytes().replace(b"\n", b"\r\n")
    series = tmp_path / "series.toml"
    series.write_bytes(original)
    entries = load_series(REPO / "patches" / "series.toml").entries
    first, last = entries[0].sha256, entries[-1].sha256
    repin_entries(series, [(0, first, "b" * 64), (len(entries) - 1, last, "c" * 64)])
    assert series.read_bytes() == original.replace(first.encode(), b"b" * 64).replace(
        last.encode(), b"c" * 64)
