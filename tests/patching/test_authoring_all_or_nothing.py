"""Issue 38, class C: authoring checks everything before its first write and writes all
its files or none. ``add-patch`` leaves no copy behind when it fails, names the flag (not
the user's series) for a bad value of its own entry and writes a CRLF series' new lines
with CRLF; ``refresh`` repins only the entry it rewrote, even where another entry pins the
same sha256; ``add-target --local-label`` is checked before anything is fetched or written.
The CLI runs as a user runs it, on copies of tests/cases/refresh-new-file-mode."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.helpers.authoring import SHIFTED, refused, snapshot
from tests.helpers.authoring import work as work  # the fixture: one copy of the case
from tests.helpers.cli import run_cli


def _add_patch(work: Path, *args: str) -> object:
    return run_cli("add-patch", str(work / "mine.patch"), "--targets-file", "targets.toml",
                   "--versions", ">=0.5.9", "--description", "mine", *args,
                   cwd=work / "refresh", cache=work / "cache")


@pytest.mark.parametrize("case", ["not-a-diff", "strip-too-deep", "strip-negative",
                                  "series-hard-linked"])
def test_a_failing_add_patch_writes_nothing(work: Path, case: str) -> None:
    """Each failure leaves the project byte for byte (no stored copy, series unchanged),
    and the message names what the user gave."""
    args: tuple[str, ...] = ()
    if case == "not-a-diff":
        (work / "mine.patch").write_text("not a patch\n")
        args = ("--layout", "git")
    elif case == "strip-too-deep":
        args = ("--layout", "git", "--strip", "5")
    elif case == "strip-negative":
        args = ("--strip", "-1")
    else:
        os.link(work / "refresh" / "patches" / "series.toml", work / "series-copy.toml")
    before = snapshot(work)
    done = _add_patch(work, *args)
    assert done.returncode != 0, done.stdout  # type: ignore[attr-defined]
    assert snapshot(work) == before
    text = " ".join(done.stderr.split())  # type: ignore[attr-defined]
    assert "Traceback" not in text
    expected = {"not-a-diff": "mine.patch contains no diff",
                "strip-too-deep": "mine.patch: path",
                "strip-negative": "--strip -1",
                "series-hard-linked": "hard links"}[case]
    assert expected in text, text
    assert "series.toml patch #" not in text  # never the user's series for our entry


@pytest.mark.parametrize("mixed", [False, True], ids=["crlf", "crlf-with-one-lf-line"])
def test_add_patch_writes_crlf_into_a_crlf_series(work: Path, mixed: bool) -> None:
    """The new entry's lines end as the series' lines do (CRLF, even where a merge left
    one LF line), and every byte already there stays."""
    series = work / "refresh" / "patches" / "series.toml"
    original = series.read_bytes().replace(b"\n", b"\r\n")
    if mixed:
        original = original.replace(b'strip = 1\r\n', b'strip = 1\n')
    series.write_bytes(original)
    done = _add_patch(work)
    assert done.returncode == 0, done.stderr  # type: ignore[attr-defined]
    data = series.read_bytes()
    assert data.startswith(original.rstrip(b"\r\n"))
    added = data[len(original.rstrip(b"\r\n")):]
    assert b"mine.patch" in added and added.count(b"\n") == added.count(b"\r\n") > 5


def test_refresh_repins_only_its_own_entry_when_two_share_a_sha256(work: Path) -> None:
    """Two entries whose patches have one content (a copy kept for other versions): the
    refresh of the one that applies rewrites its file and its pin; the other's pin, and
    its file, stay."""
    patches = work / "refresh" / "patches"
    for name in ("a.patch", "b.patch"):
        (patches / name).write_text(SHIFTED)
    sha = hashlib.sha256(SHIFTED.encode()).hexdigest()
    series = patches / "s2.toml"
    series.write_text(f'[[patch]]\nfile = "a.patch"\nsha256 = "{sha}"\ndescription = "a"\n'
                      'strip = 1\nversions = ">=0.5.9"\n\n'
                      f'[[patch]]\nfile = "b.patch"\nsha256 = "{sha}"\ndescription = "b"\n'
                      'strip = 1\nversions = "<0.5.9"\n')
    done = run_cli("refresh", "--targets-file", "targets.toml", "--source-dir", "../tree",
                   "--upstream-version", "0.5.9", "--series", "patches/s2.toml",
                   cwd=work / "refresh", cache=work / "cache")
    assert done.returncode == 0, done.stderr
    new = hashlib.sha256((patches / "a.patch").read_bytes()).hexdigest()
    assert new != sha and (patches / "b.patch").read_text() == SHIFTED
    pins = [line.split('"')[1] for line in series.read_text().splitlines()
            if line.startswith("sha256")]
    assert pins == [new, sha]


def test_refresh_in_place_refuses_a_file_two_entries_name(work: Path) -> None:
    """One file named by two entries (other version ranges): rewriting it would leave the
    other entry's pin stale, so the in-place refresh is refused and nothing is written."""
    patches = work / "refresh" / "patches"
    (patches / "a.patch").write_text(SHIFTED)
    sha = hashlib.sha256(SHIFTED.encode()).hexdigest()
    (patches / "s2.toml").write_text(
        "".join(f'[[patch]]\nfile = "a.patch"\nsha256 = "{sha}"\ndescription = "a"\n'
                f'strip = 1\nversions = "{versions}"\n\n' for versions in (">=0.5.9", "<0.5.9")))
    before = snapshot(work)
    done = run_cli("refresh", "--targets-file", "targets.toml", "--source-dir", "../tree",
                   "--upstream-version", "0.5.9", "--series", "patches/s2.toml",
                   cwd=work / "refresh", cache=work / "cache")
    refused(done, "a.patch is also the file of another entry", "--output-dir")
    assert snapshot(work) == before


def test_refresh_that_cannot_repin_writes_no_patch(work: Path) -> None:
    """A series that cannot be replaced (hard links) is refused before the refreshed
    patch is written: never a patch whose pin was not moved with it."""
    patches = work / "refresh" / "patches"
    (patches / "a.patch").write_text(SHIFTED)
    sha = hashlib.sha256(SHIFTED.encode()).hexdigest()
    (patches / "s2.toml").write_text(f'[[patch]]\nfile = "a.patch"\nsha256 = "{sha}"\n'
                                     'description = "a"\nstrip = 1\nversions = ">=0.5.9"\n')
    os.link(patches / "s2.toml", work / "s2-copy.toml")
    before = snapshot(work)
    done = run_cli("refresh", "--targets-file", "targets.toml", "--source-dir", "../tree",
                   "--upstream-version", "0.5.9", "--series", "patches/s2.toml",
                   cwd=work / "refresh", cache=work / "cache")
    refused(done, "s2.toml has 2 hard links")
    assert snapshot(work) == before


def test_add_target_checks_local_label_before_anything(work: Path) -> None:
    """A --local-label that makes no PEP 440 version is the flag's error (exit 2), before
    the index is asked (port 9: nothing listens) or any file is written."""
    before = snapshot(work)
    done = run_cli("add-target", "0.5.9", "--cuda-lane", "12.9", "--local-label", "bad!",
                   "--index-url", "http://127.0.0.1:9/simple", "--targets-file", "targets.toml",
                   cwd=work / "refresh", cache=work / "cache")
    refused(done, "--local-label", "'bad!' is not a PEP 440 local label")
    assert snapshot(work) == before
