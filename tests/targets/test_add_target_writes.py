"""``add-target`` writes all of its files or none: every destination is checked before the
first write (a folder that is a file, a link to nothing, ``--body-file`` in a folder that
cannot be written), and a write that fails anyway puts back the files already written."""

from __future__ import annotations

import json
import os
import shlex
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from builder.core.errors import ConfigurationError
from builder.patching.matrix import Cell, CellStatus, Column, Matrix
from builder.targets.checklist import TITLES, checklist
from builder.targets.derive import MARK, derive_profile, mark_claims
from builder.targets.gaps import target_gaps
from builder.targets.writes import Writes, check_writable
from tests.helpers import targets as shipped
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO


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


@pytest.mark.parametrize("variant", ["file", "dangling", "fifo", "folder"])
def test_add_target_refused_before_anything_is_written(index: str, project: Path,
                                                       tmp_path: Path, variant: str) -> None:
    images = project / "images"
    images.mkdir()
    profile = images / "profiles" / "sglang-0.5.16.toml"
    if variant == "file":
        (images / "profiles").write_text("notes")
    else:
        (images / "profiles").mkdir()
    if variant == "dangling":
        profile.symlink_to(tmp_path / "gone.toml")
    elif variant == "fifo":  # it once blocked reading it
        os.mkfifo(profile)
    elif variant == "folder":
        profile.mkdir()
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


def _one_column(version: str, statuses: dict[str, str]) -> Matrix:
    """A compatibility matrix of the repo's series with one column, every cell
    ``not-applicable`` but those given (the statuses the matrix gives; no source read)."""
    names = tuple(e.name for e in shipped.series().entries)
    cells = tuple((Cell(CellStatus(statuses.get(n, "not-applicable")),
                        statuses.get(n, "not-applicable"), None),) for n in names)
    return Matrix(names, (Column(version, None, None),), cells, ())  # type: ignore[arg-type]


def test_no_range_ended_gap_where_another_copy_is_obsolete(tmp_path: Path) -> None:
    # 0001's first copy ends before 0.5.11 (in effect on the 0.5.9 target); on 0.5.16 its
    # 0.5.11 copy is in range. When upstream has the change there (the matrix says
    # obsolete), the first copy's range ended rightly: no gap.
    copy = "0001-enable-flashinfer-cutlass-autotune-0.5.11.patch"

    def ranges(status: str) -> list[str]:
        gaps = target_gaps(series=shipped.series(), matrix=_one_column("0.5.16", {
            copy: status}), version="0.5.16", lane="13.0", name="sglang-0.5.16",
            root=tmp_path, older=[Version("0.5.9")])
        return [g.subject for g in gaps if g.kind == "patch-range"]

    assert ranges("obsolete") == []
    assert ranges("clean") == []
    # the gap itself still comes where no copy of 0001 is in effect or obsolete
    assert ranges("not-applicable") == ["0001-enable-flashinfer-cutlass-autotune.patch"]


def test_no_range_ended_gap_where_a_newer_target_lacks_the_patch_too(tmp_path: Path) -> None:
    # 0.5.22 (between the 0.5.20 and 0.5.23 targets): 0004 and 0006 end before it and the
    # 0.5.23 target has no copy either (ended for good); 0007 resumes on 0.5.23, so its
    # end before 0.5.22 is a question, asked once (its latest copy so ended).
    effect = ["0002-sm12x-nvfp4-moe-auto-flashinfer-cutlass-0.5.23.patch",
              "0003-sm12x-dsa-backends-tilelang-0.5.23.patch",
              "0005-sm12x-fp4-gemm-auto-b12x.patch"]
    gaps = target_gaps(series=shipped.series(), matrix=_one_column("0.5.22", dict.fromkeys(
        effect, "clean")), version="0.5.22", lane="13.0", name="sglang-0.5.22", root=tmp_path,
        older=[Version(v) for v in ("0.5.16", "0.5.20", "0.5.23")])
    assert [g.subject for g in gaps if g.kind == "patch-range"] == [
        "0007-sm12x-refuse-backends-without-kernels-0.5.20.patch"]


def test_no_range_ended_gap_for_patches_upstream_absorbed_on_a_release_after_every_target(
        tmp_path: Path) -> None:
    # 0.5.24, newer than every pinned target: 0004 and 0006 end before 0.5.21 (upstream
    # has both from 0.5.21) and the 0.5.23 target carries no copy of either, as between
    # targets (above). A fresh walk of add-target found both asked again here.
    release = Version("0.5.24")
    effect = {e.name: "clean" for e in shipped.series().entries if e.applies_to(release)}
    gaps = target_gaps(series=shipped.series(), matrix=_one_column("0.5.24", effect),
                       version="0.5.24", lane="13.0", name="sglang-0.5.24", root=tmp_path,
                       older=[Version(v) for v in ("0.5.16", "0.5.20", "0.5.23")])
    ended = [g.subject for g in gaps if g.kind == "patch-range"]
    assert not [n for n in ended if n.startswith(("0004-", "0006-"))], ended
    # a patch whose last copy ends at the newest target is still asked about
    older = [Version(v) for v in ("0.5.16", "0.5.20")]
    gaps = target_gaps(series=shipped.series(), matrix=_one_column("0.5.24", effect),
                       version="0.5.24", lane="13.0", name="sglang-0.5.24", root=tmp_path,
                       older=older)
    assert {g.subject for g in gaps if g.kind == "patch-range"} >= {
        "0004-sm12x-nvfp4-shared-expert-fusion-0.5.18.patch",
        "0006-moe-cutlass-swiglu-clamp-0.5.20.patch"}


def test_every_gap_fix_that_names_a_command_names_a_runnable_one(tmp_path: Path) -> None:
    from builder.cli.main import _hoist_shared, build_parser

    # no profile, no pins, a failing patch and ended ranges: every fix kind at once
    gaps = target_gaps(series=shipped.series(), matrix=_one_column("0.5.22", {
        "0005-sm12x-fp4-gemm-auto-b12x.patch": "failed"}), version="0.5.22", lane="13.0",
        name="sglang-0.5.22", root=tmp_path, older=[Version("0.5.20")])
    assert {g.kind for g in gaps} >= {"patch", "launch-profile", "base-digest"}
    parser = build_parser()
    commands = [c.split(",")[0].split(" (")[0].split(" or ")[0].strip()
                for g in gaps for c in ("python -m builder " + part
                                        for part in g.fix.split("python -m builder ")[1:])]
    assert any(" serve-command " in c for c in commands), commands
    for command in commands:
        arguments, _ = _hoist_shared(shlex.split(command)[3:])
        try:
            args = parser.parse_args(arguments)
        except SystemExit as exc:
            raise AssertionError(f"not a valid command: {command}") from exc
        if args.command == "serve-command":  # a check of the new target, not the default's
            assert "--target sglang-0.5.22" in command and "--all" in command, command


def test_the_checklist_names_real_commands_and_the_docs_page_lists_every_step() -> None:
    from builder.cli.common import SHARED_DEST
    from builder.cli.main import _hoist_shared, build_parser

    steps = checklist("sglang-0.5.24", "0.5.24", failing=["0002-x.patch"],
                      ended=["0004-y.patch"])
    assert [s.title for s in steps] == list(TITLES)
    parser = build_parser()
    for step in steps:
        for command in step.commands:
            if not command.startswith("python -m builder "):
                continue
            # parsed as main() parses (shared options hoisted): every option exists
            arguments, shared = _hoist_shared(shlex.split(command.split("  #")[0])[3:])
            try:
                args, extra = parser.parse_known_args(arguments)
            except SystemExit as exc:
                raise AssertionError(f"not a valid command: {command}") from exc
            extra += [flag for flag, _ in shared if SHARED_DEST[flag] not in args.shared]
            assert not extra, f"{command}: {extra} not read by the command"
    page = (REPO / "docs" / "new-release.md").read_text()
    for step in checklist("sglang-0.5.24", "0.5.24"):
        assert f"## {TITLES.index(step.title) + 1}. " in page, step.title
        for command in step.commands:
            assert command.replace("0.5.24", "VERSION").replace(
                "sglang-VERSION", "NAME") in page, command


def test_the_profile_is_derived_from_the_neighbour_whose_patches_match(tmp_path: Path) -> None:
    # A release after the newest target, where the newest target's patches are in effect:
    # its profile is copied, with every claim about its code marked.
    newest = shipped.targets().get(shipped.current_targets()[-1])
    version = f"{newest.upstream_version.base_version}.post99"
    effect = [e.name for e in shipped.series().entries if e.applies_to(Version(version))]
    derived = derive_profile(name=f"sglang-{version}", version=version, in_effect=effect,
                             series=shipped.series(), targets=shipped.targets().targets.values(),
                             profiles=REPO / "images/profiles")
    assert derived is not None and derived.neighbour == newest.name and derived.same_patches
    data = tomllib.loads(derived.text)
    assert (data["target"], data["upstream_version"]) == (f"sglang-{version}", version)
    original = tomllib.loads((REPO / "images/profiles" / f"{newest.name}.toml").read_text())
    assert data["args"] == original["args"] and data["gpu"] == original["gpu"]  # values kept
    assert derived.recheck and all(line.endswith(")") for line in derived.recheck)
    # The stale claim the issue found: the FP4 GEMM 'auto' of a release, named by a PR.
    assert any("--fp4-gemm-backend" in line for line in derived.recheck)
    assert sum(line.startswith(MARK) for line in derived.text.splitlines()) == len(
        derived.recheck)
    # The gap stays until each mark is removed.
    (tmp_path / "images/profiles").mkdir(parents=True)
    path = tmp_path / "images/profiles" / f"sglang-{version}.toml"
    path.write_text(derived.text)
    gaps = [g for g in target_gaps(series=shipped.series(), matrix=_one_column(version, {
        name: "clean" for name in effect}), version=version, lane="13.0",
        name=f"sglang-{version}", root=tmp_path, older=[]) if g.kind == "launch-profile"]
    assert [g.detail for g in gaps] == [f"{len(derived.recheck)} claim(s) marked RE-CHECK "
                                        "(derived from a neighbour's profile)"]
    path.write_text("".join(line for line in derived.text.splitlines(keepends=True)
                            if not line.startswith(MARK)))
    assert not [g for g in target_gaps(series=shipped.series(), matrix=_one_column(
        version, {name: "clean" for name in effect}), version=version, lane="13.0",
        name=f"sglang-{version}", root=tmp_path, older=[]) if g.kind == "launch-profile"]


def test_a_claim_is_marked_where_it_names_the_release_a_patch_an_issue_or_a_default() -> None:
    text = ('target = "t"\n[args]\n# - a: 0.5.23 sets it\n#   over two lines\n'
            "# - b: plain arithmetic\n# - c: patch 0002 resolves it\n"
            '"--x" = 1\n# upstream issue #40346 proposes it\n"--y" = 2\n'
            '# 0.5.230 is another release\n"--z" = 3\n')
    marked, found = mark_claims(text, "0.5.23")
    assert [line.split(" (")[-1] for line in found] == [
        "names 0.5.23)", "names patch 0002)", "names upstream #40346)"]
    lines = marked.splitlines()
    assert lines[lines.index("# - a: 0.5.23 sets it") - 1].startswith(MARK)
    assert not lines[lines.index("# - b: plain arithmetic") - 1].startswith(MARK)
    assert tomllib.loads(marked) == tomllib.loads(text)
