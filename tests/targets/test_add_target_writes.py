"""``add-target`` writes all of its files or none: every destination is checked before the
first write (a folder that is a file, a link to nothing, ``--body-file`` in a folder that
cannot be written), and a write that fails anyway puts back the files already written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.core.errors import ConfigurationError
from builder.targets.writes import Writes, check_writable
from tests.helpers.cli import run_cli


def test_a_failed_write_puts_back_the_files_written_before_it(tmp_path: Path) -> None:
    first = tmp_path / "targets.toml"
    first.write_bytes(b"# mine\r\nold = 1\r\n")
    (tmp_path / "images").write_text("notes")  # a file where the folder should be
    writes = Writes()
    writes.add(first, b"# mine\r\nnew = 1\r\n", "the targets file")
    writes.add(tmp_path / "new" / "made.toml", b"x = 1\n", "a new file")
    writes.add(tmp_path / "images" / "pins.toml", b"x = 1\n", "the base pins file")
    with pytest.raises(ConfigurationError, match="cannot write the base pins file"):
        writes.apply()  # not checked first: the third write fails
    assert first.read_bytes() == b"# mine\r\nold = 1\r\n"  # the user's bytes, CRLF kept
    assert not (tmp_path / "new").exists()  # the file and the folder it needed: gone
    assert (tmp_path / "images").read_text() == "notes"


def test_each_destination_is_checked_with_its_own_name(tmp_path: Path) -> None:
    (tmp_path / "images").write_text("notes")
    with pytest.raises(ConfigurationError, match=r"the launch profile .*images/profiles/x"
                       r"\.toml: .*images is not a folder"):
        check_writable(tmp_path / "images" / "profiles" / "x.toml", "the launch profile")
    (tmp_path / "link.toml").symlink_to(tmp_path / "gone" / "p.toml")
    with pytest.raises(ConfigurationError, match=r"link\.toml is a symbolic link to .*which "
                                                 r"does not exist"):
        check_writable(tmp_path / "link.toml", "the launch profile")
    (tmp_path / "dir.md").mkdir()
    with pytest.raises(ConfigurationError, match=r"--body-file .*dir\.md is not a regular file"):
        check_writable(tmp_path / "dir.md", "--body-file")
    check_writable(tmp_path / "a" / "b" / "new.toml", "a new file")  # folders made later


@pytest.mark.parametrize("variant", ["file", "dangling"])
def test_add_target_refused_before_anything_is_written(index: str, project: Path,
                                                       tmp_path: Path, variant: str) -> None:
    images = project / "images"
    images.mkdir()
    if variant == "file":
        (images / "profiles").write_text("notes")
    else:
        (images / "profiles").mkdir()
        (images / "profiles" / "sglang-0.5.16.toml").symlink_to(tmp_path / "gone.toml")
    before = (project / "targets.toml").read_bytes()
    done = run_cli("add-target", "0.5.16", "--index-url", index, "--json",
                   "--body-file", str(tmp_path / "body.md"), cwd=project,
                   cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.dumps(json.loads(done.stdout)) if done.stdout.strip() else done.stderr
    assert "the launch profile" in error and "nothing was written" in error
    assert (project / "targets.toml").read_bytes() == before
    assert sorted(p.name for p in images.iterdir()) == ["profiles"]  # no pins.toml
    assert not (tmp_path / "body.md").exists()
