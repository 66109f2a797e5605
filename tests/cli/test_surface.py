"""The CLI's surface, in-process: ``--help`` lists each command once by stage, the old
spellings still run (with a deprecation note), each command's own validate step refuses bad
flags with exit 2 and one message, and errors print by their type and kind."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from builder.cli.main import STAGES, _print_error, build_parser, main
from builder.core.errors import BuilderError, ConfigurationError, PatchError
from builder.patching.apply import PatchReport
from tests.helpers.project import write_project


def _commands() -> list[str]:
    (action,) = [a for a in build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)]
    return list(action.choices)


def test_help_lists_each_command_once_by_stage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    listed = re.findall(r"^    ([a-z][a-z-]*)  +\S", text, re.MULTILINE)
    assert sorted(listed) == sorted(_commands())  # every command, none twice
    assert len(listed) == len(set(listed))
    stages = re.findall(r"^  ([a-z][a-z ]+)$", text, re.MULTILINE)
    assert stages == [stage for stage, _ in STAGES]
    for status in ("0 ok", "1 failed: a check did not hold", "2 bad input", "3 missing",
                   "4 source unavailable", "5 patch", "6 build", "7 publish",
                   "130/143 interrupted"):
        assert status in " ".join(text.split())


@pytest.mark.parametrize(("old", "new_usage", "note"), [
    (["check"], "matrix", "`check` is deprecated"),
    (["bump"], "add-target", "`bump` is deprecated"),
    (["publish-wheels"], "release", "`publish-wheels` is deprecated"),
    (["label", "--bump"], "next-label", "`label --bump` is deprecated"),
    (["label"], "lock", "`label` is deprecated"),
])
def test_an_old_spelling_runs_the_new_command_and_warns(
        old: list[str], new_usage: str, note: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([*old, "--help"])
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: python -m builder {new_usage} ")
    assert note in err and len(err.splitlines()) == 1


def test_old_spellings_keep_their_meaning(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    root = write_project(tmp_path / "p")
    targets = root / "targets.toml"
    assert main(["label", "--target", "t", "--bump", "--json", "--targets-file",
                 str(targets)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["new"] == "sm120.8" and "use `next-label`" in err
    assert "sm120.8" in targets.read_text()
    # publish-wheels is release --wheels-only: image gates are refused as there
    assert main(["publish-wheels", "--repository-url", "http://127.0.0.1:9/", "--gate",
                 "gpu"]) == 2
    assert "--gate gpu does not apply to --wheels-only" in capsys.readouterr().err
    # bump --latest still parses (hidden flag) and says what replaces it
    assert main(["bump", "0.5.9", "--latest", "--targets-file", str(targets)]) == 2
    assert "`--latest` is deprecated" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message", "command"), [
    (["targets", "--json", "extra"], "unrecognized arguments: extra", "targets"),
    (["wheel", "--json", "--taget", "X"], "unrecognized arguments: --taget X", "wheel"),
    (["--json", "targets"], "unrecognized arguments: --json (options go after the command)",
     "targets"),
    (["patch", "--max-fuzz", "abc", "--json"], "argument --max-fuzz: 'abc' is not a whole "
     "number", "patch"),
    (["pin-images", "--check", "--platform", "banana", "--json"], "argument --platform: "
     "'banana' is not OS/ARCH[/VARIANT] (e.g. linux/amd64, linux/arm64/v8)", "pin-images"),
    (["add-target", "0.5.24", "--index-url", "notaurl", "--json"], "argument --index-url: "
     "'notaurl' is not an http(s):// or file:// URL", "add-target"),
    (["kernels", "--jobs", "0", "--json"], "argument --jobs: must be from 1 to 1024",
     "kernels"),
    (["smoke", "--timeout", "-5", "--json"], "argument --timeout: '-5': give seconds above "
     "0, at most 604800", "smoke"),
    (["smoke", "--server-timeout", "nan", "--json"], "argument --server-timeout: 'nan': give "
     "seconds above 0, at most 604800", "smoke"),
])
def test_a_usage_error_is_the_commands_own_and_json_with_json(
        argv: list[str], message: str, command: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert json.loads(out) == {"error": message, "hint": f"see `python -m builder {command} "
                               "--help`", "kind": "configuration error", "exit_status": 2}
    assert err.startswith(f"usage: python -m builder {command} ")
    assert err.splitlines()[-1] == f"python -m builder {command}: error: {message}"


@pytest.mark.parametrize(("argv", "message"), [
    (["fetch", "--upstream-version", "0.5.9"],
     "--upstream-version only applies with --source-dir"),
    (["wheel", "--upstream-version", "0.5.9"],
     "--upstream-version only applies with --source-dir"),
    (["matrix", "--git-url", "/tmp/x"], "--git-url only applies with --commits"),
    (["matrix", "--versions", " , "], "--versions is empty"),
    (["matrix", "--commits", ""], "--commits is empty"),
    (["release", "--repository-url", "u", "--wheels-only", "--gate", "static"],
     "--gate static does not apply to --wheels-only"),
    (["release", "--repository-url", "u", "--gate", "build"],
     "--gate build does not apply to a release with the image"),
    (["release", "--repository-url", "u", "--smoke-report", "r.json"],
     "--smoke-report only applies with --wheels-only --gate smoke"),
    # --kernel-wheel goes with --wheels-only too (the kernel stage's wheels are published).
    (["release", "--repository-url", "u", "--wheels-only", "--registry", "r:5000",
      "--kernel-wheel", "k.whl"], "--registry only apply with the image"),
    (["release", "--repository-url", "u", "--upstream-version", "1"],
     "--upstream-version only applies with --source-dir"),
])
def test_a_command_validates_its_own_flags(argv: list[str], message: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == f"configuration error: {message}"
    assert len([line for line in err.splitlines() if "error" in line]) == 1
    assert not (tmp_path / "cache").exists()  # refused before any work
    assert main([*argv, "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert (data["error"], data["kind"], data["exit_status"]) == (
        message, "configuration error", 2)


def test_smoke_refuses_an_image_it_would_not_test(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["smoke", "--image", "sglang-sm120:x", "--json"]) == 2  # host mode: ignored
    assert json.loads(capsys.readouterr().out)["error"] == \
        "--image applies with --mode image only"


def test_a_cache_that_is_a_file_is_refused(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cache").write_text("mine")
    for action in (["list"], ["prune", "--older-than", "30"], ["clean"]):
        assert main(["cache", *action, "--cache-dir", str(tmp_path / "cache")]) == 2, action
        assert capsys.readouterr().err.splitlines()[0] == (
            f"configuration error: the cache {tmp_path / 'cache'} is not a folder")
    assert (tmp_path / "cache").read_text() == "mine"


class _Lines:
    def lines(self) -> list[str]:
        return ["published: a.whl", "not published: image (gate failed)"]


def test_errors_print_their_kind_and_a_report_by_its_type(
        capsys: pytest.CaptureFixture[str]) -> None:
    _print_error(ConfigurationError("bad flag", "fix it"))
    assert capsys.readouterr().err == "configuration error: bad flag\nhint: fix it\n"
    _print_error(BuilderError("failed", report=_Lines()))
    assert capsys.readouterr().err.splitlines() == [
        "summary:", "  published: a.whl", "  not published: image (gate failed)",
        "error: failed"]
    report = PatchReport(upstream_version="0.5.9", patches=())
    _print_error(PatchError("does not apply", report=report))
    err = capsys.readouterr().err
    assert "Patch report for upstream 0.5.9" in err
    assert err.rstrip().endswith("patch error: does not apply")
    _print_error(BuilderError("plain", report={"a": 1}))  # no lines(): JSON only
    assert capsys.readouterr().err == "error: plain\n"
