"""Authoring commands refuse what would write outside the project or silently mean a
default: ``add-patch`` names and text, ``add-target --body-file``, series entries that
lead out of the series folder, and empty paths. Every refusal is exit 2 with nothing
written."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.authoring import PATCH, SHIFTED, refused, snapshot
from tests.helpers.authoring import work as work  # the fixture: one copy of the case
from tests.helpers.cli import run_cli


def add_patch(work: Path, *args: str, patch: str | None = None) -> object:
    return run_cli("add-patch", patch if patch is not None else str(work / "mine.patch"),
                   "--targets-file", "targets.toml", "--versions", ">=0.5.9", *args,
                   cwd=work / "refresh", cache=work / "cache")


# ------------------------------------------------------------ 1. add-patch --name


@pytest.mark.parametrize("name", ["../../evil.patch", "ABS", "sub/x.patch", "..", ".", "",
                                  "a\\b.patch"])
def test_add_patch_name_must_be_a_plain_file_name(work: Path, tmp_path: Path,
                                                  name: str) -> None:
    if name == "ABS":
        name = str(tmp_path / "abs.patch")
    before = snapshot(tmp_path)
    done = add_patch(work, "--description", "x", "--name", name)
    refused(done, "is not a plain file name")
    assert snapshot(tmp_path) == before  # neither the patch nor the entry was written


def test_add_patch_plain_name_still_works(work: Path) -> None:
    done = add_patch(work, "--description", "mine", "--name", "0002-mine.patch")
    assert done.returncode == 0, done.stderr  # type: ignore[attr-defined]
    assert (work / "refresh/patches/0002-mine.patch").read_text() == PATCH
    assert 'file = "0002-mine.patch"' in (work / "refresh/patches/series.toml").read_text()


# ------------------------------------------------------------ 2. add-patch text and input


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--description", "caf\udcff", "is not UTF-8 text"),  # what Python makes of b"\xff"
    ("--description", "one\ntwo", "holds a line break"),
    ("--description", "one\rtwo", "holds a line break"),
    ("--name", "\udcff.patch", "is not UTF-8 text"),
])
def test_add_patch_text_must_be_one_line_of_utf8(work: Path, flag: str, value: str,
                                                 message: str) -> None:
    args = ["--description", "x", "--name", "ok.patch"]
    args[args.index(flag) + 1] = value
    before = snapshot(work)
    done = add_patch(work, *args)
    refused(done, flag, message)
    assert "Traceback" not in done.stderr  # type: ignore[attr-defined]
    assert snapshot(work) == before


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A named pipe; if a reader blocks on it for 10 s, it is opened for writing and
    closed, so that the reader gets end of file and the test fails rather than hangs."""
    path = tmp_path / "pipe.patch"
    os.mkfifo(path)
    done = threading.Event()

    def unblock() -> None:
        if done.wait(10):
            return
        while not done.is_set():
            with contextlib.suppress(OSError):  # no reader (yet)
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            done.wait(0.1)

    watchdog = threading.Thread(target=unblock, daemon=True)
    watchdog.start()
    yield path
    done.set()
    watchdog.join()


def test_add_patch_refuses_a_named_pipe_at_once(work: Path, fifo: Path) -> None:
    before = snapshot(work)
    done = add_patch(work, "--description", "x", patch=str(fifo))
    refused(done, str(fifo), "is a named pipe")
    assert snapshot(work) == before


# ------------------------------------------------------------ 3. add-target --body-file


def _body_targets(work: Path, kind: str) -> Path:
    outside = work / "outside"
    outside.mkdir()
    body = work / "body.md"
    if kind == "folder":
        body.mkdir()
    elif kind == "fifo":
        os.mkfifo(body)
    elif kind == "link-to-folder":
        body.symlink_to(outside)
    elif kind == "link-to-file":
        (outside / "victim.md").write_text("keep")
        body.symlink_to(outside / "victim.md")
    elif kind == "no-folder":
        body = work / "missing" / "body.md"
    return body


@pytest.mark.parametrize(("kind", "message"), [
    ("folder", "is a folder"), ("fifo", "a device, pipe or socket"),
    ("link-to-folder", "is a symbolic link"), ("link-to-file", "is a symbolic link"),
    ("no-folder", "does not exist"),
])
def test_add_target_checks_body_file_before_writing(work: Path, kind: str,
                                                    message: str) -> None:
    body = _body_targets(work, kind)
    before = snapshot(work)
    # Nothing listens on port 9: the old code got as far as the index (exit 4).
    done = run_cli("add-target", "0.5.9", "--replace", "--cuda-lane", "12.9",
                   "--index-url", "http://127.0.0.1:9/simple", "--targets-file",
                   "targets.toml", "--body-file", str(body), cwd=work / "refresh",
                   cache=work / "cache")
    refused(done, "--body-file", message)
    assert snapshot(work) == before


# ------------------------------------------------------------ 4. series entries stay inside


def _outside_series(work: Path, file: str) -> Path:
    outside = work / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "ok.patch").write_text(SHIFTED)
    sha = hashlib.sha256(SHIFTED.encode()).hexdigest()
    series = work / "refresh" / "patches" / "s2.toml"
    series.write_text(f'[[patch]]\nfile = "{file}"\nsha256 = "{sha}"\ndescription = "x"\n'
                      'strip = 1\nversions = ">=0.5.9"\n')
    return series


def _refresh(work: Path, *args: str) -> object:
    return run_cli("refresh", "--targets-file", "targets.toml", "--source-dir", "../tree",
                   "--upstream-version", "0.5.9", "--series", "patches/s2.toml", *args,
                   cwd=work / "refresh", cache=work / "cache")


@pytest.mark.parametrize("file", ["../../outside/ok.patch", "link.patch",
                                  "sub/../../../outside/ok.patch"])
def test_series_entry_must_stay_in_the_series_folder(work: Path, file: str) -> None:
    if file == "link.patch":
        (work / "refresh" / "patches" / "link.patch").symlink_to(work / "outside" / "ok.patch")
    _outside_series(work, file)
    before = snapshot(work)
    for command in (["refresh"], ["patch", "--dry-run"]):
        done = run_cli(*command, "--targets-file", "targets.toml", "--source-dir", "../tree",
                       "--upstream-version", "0.5.9", "--series", "patches/s2.toml",
                       cwd=work / "refresh", cache=work / "cache")
        refused(done, "s2.toml patch #1", f"({file})")
        assert snapshot(work) == before  # the outside patch was not rewritten


def test_an_absolute_entry_outside_is_read_but_never_refreshed_in_place(work: Path) -> None:
    # Absolute entries are explicit (existing series read shared patches so): loaded,
    # applied, refreshed into --output-dir, but never rewritten where they are.
    outside = work / "outside" / "ok.patch"
    _outside_series(work, str(outside))
    before = snapshot(work)
    refused(_refresh(work), "ok.patch is", "outside the series folder", "--output-dir")
    assert snapshot(work) == before
    done = _refresh(work, "--output-dir", str(work / "copies"))
    assert done.returncode == 0, done.stderr  # type: ignore[attr-defined]
    assert outside.read_text() == SHIFTED
    assert "@@ -1,3 +1,3 @@" in (work / "copies" / "ok.patch").read_text()


def test_series_entry_in_a_subfolder_is_refreshed(work: Path) -> None:
    (work / "refresh" / "patches" / "sub").mkdir()
    (work / "refresh" / "patches" / "sub" / "ok.patch").write_text(SHIFTED)
    series = _outside_series(work, "sub/ok.patch")
    done = run_cli("refresh", "--targets-file", "targets.toml", "--source-dir", "../tree",
                   "--upstream-version", "0.5.9", "--series", "patches/s2.toml",
                   cwd=work / "refresh", cache=work / "cache")
    assert done.returncode == 0, done.stderr
    text = (work / "refresh" / "patches" / "sub" / "ok.patch").read_text()
    assert text.startswith("my message\n\n") and "@@ -1,3 +1,3 @@" in text
    assert hashlib.sha256(text.encode()).hexdigest() in series.read_text()


# ------------------------------------------------------------ 5. empty paths


@pytest.mark.parametrize("args", [
    ["refresh", "--output-dir", ""], ["refresh", "--series", ""], ["refresh", "--patch", ""],
    ["matrix", "--series", ""], ["add-patch", "", "--versions", ">=0.5.9",
                                 "--description", "x"],
    ["add-patch", "../mine.patch", "--versions", ">=0.5.9", "--description", "x",
     "--series", ""],
    ["add-patch", "../mine.patch", "--versions", ">=0.5.9", "--description", "x",
     "--name", ""],
    ["add-target", "0.5.9", "--cuda-lane", "12.9", "--index-url",
     "http://127.0.0.1:9/simple", "--body-file", ""],
])
def test_an_empty_path_is_refused(work: Path, args: list[str]) -> None:
    extra = [] if args[0] in ("add-patch", "add-target", "matrix") else [
        "--source-dir", "../tree", "--upstream-version", "0.5.9"]
    before = snapshot(work)
    done = run_cli(*args, "--targets-file", "targets.toml", *extra, cwd=work / "refresh",
                   cache=work / "cache")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "empty" in done.stderr or "is not a plain file name" in done.stderr, done.stderr
    assert snapshot(work) == before  # nothing written into the current folder
