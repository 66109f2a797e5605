"""The CLI's surface, in-process: ``--help`` lists each command once by group, the old
spellings of 0.1 are gone (refused as unknown), each command's own validate step refuses bad
flags with exit 2 and one message, and errors print by their type and kind."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from builder.cli.main import GROUPS, _print_error, build_parser, main
from builder.core.errors import BuilderError, ConfigurationError, PatchError
from builder.patching.apply import PatchReport


def _commands() -> list[str]:
    (action,) = [a for a in build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)]
    return list(action.choices)


def test_help_lists_each_command_once_by_group(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    listed = re.findall(r"^    ([a-z][a-z-]*)  +\S", text, re.MULTILINE)
    assert sorted(listed) == sorted(_commands())  # every command, none twice
    assert len(listed) == len(set(listed))
    stages = re.findall(r"^  ([a-z][a-z ]+)$", text, re.MULTILINE)
    assert stages == [group for group, _, _ in GROUPS]
    for status in ("0 ok", "1 failed: a check did not hold", "2 bad input", "3 a missing",
                   "4 source unavailable", "5 patch", "6 build", "7 publish",
                   "130/143 interrupted", "141 the reader"):
        assert status in " ".join(text.split())


@pytest.mark.parametrize("old", [
    ["check"], ["bump", "0.5.9"], ["publish-wheels"], ["label", "--bump"], ["label"],
    ["add-target", "0.5.9", "--latest"], ["add-target", "0.5.9", "--pre"],
    ["release", "--wheels-only"], ["kernels", "--mode", "container"],
    ["kernels", "plan", "--save-request", "r.json"], ["pin-images", "--check"],
    ["lock", "--check"], ["smoke", "--mode", "host"], ["smoke", "--image", "x"],
])
def test_an_old_spelling_is_refused(old: list[str], capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    """0.2 dropped the spellings 0.1 kept hidden or renamed (docs/changelog.md)."""
    with pytest.raises(SystemExit) as stopped:
        main(old)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err or "unrecognized arguments" in err \
        or "the following arguments are required" in err


@pytest.mark.parametrize(("argv", "message", "command"), [
    (["targets", "--json", "extra"], "unrecognized arguments: extra", "targets"),
    (["wheel", "--json", "--taget", "X"], "unrecognized arguments: --taget X", "wheel"),
    (["--target", "t", "targets", "--json"], "unrecognized arguments: --target t", "targets"),
    (["patch", "--max-fuzz", "abc", "--json"], "argument --max-fuzz: 'abc' is not a whole "
     "number", "patch"),
    (["pin-images", "--verify", "--platform", "banana", "--json"], "argument --platform: "
     "'banana' is not OS/ARCH[/VARIANT] (e.g. linux/amd64, linux/arm64/v8)", "pin-images"),
    (["kernels", "build", "--jobs", "0", "--json"], "argument --jobs: must be from 1 to 1024",
     "kernels build"),
    (["smoke", "host", "--timeout", "-5", "--json"], "argument --timeout: '-5': give seconds "
     "above 0, at most 604800", "smoke host"),
    (["smoke", "host", "--server-timeout", "nan", "--json"], "argument --server-timeout: "
     "'nan': give seconds above 0, at most 604800", "smoke host"),
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
    (["release", "wheels", "--repository-url", "u", "--gate", "build", "--smoke-report",
      "r.json"], "--smoke-report only applies with --gate smoke"),
    (["release", "image", "--repository-url", "u", "--upstream-version", "1"],
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
    with pytest.raises(SystemExit) as stopped:  # host mode has no --image
        main(["smoke", "host", "--image", "sglang-sm120:x", "--json"])
    assert stopped.value.code == 2
    assert json.loads(capsys.readouterr().out)["error"] == \
        "unrecognized arguments: --image sglang-sm120:x"


def test_a_cache_that_is_a_file_is_refused(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cache").write_text("mine")
    # the cache commands and every command that uses the cache (fetch once said "File exists")
    for action in (["cache", "list"], ["cache", "prune", "--older-than", "30"],
                   ["cache", "clean"], ["fetch", "--target", "sglang-0.5.9"]):
        assert main([*action, "--cache-dir", str(tmp_path / "cache")]) == 2, action
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


@pytest.mark.parametrize("argv", [["fetch", "--index-url"], ["fetch", "--target"],
                                  ["serve-command", "--cache-dir", "--", "--tp-size", "2"]])
def test_a_shared_option_without_its_value_says_so(argv: list[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # Moved in front of the command, it once took the command as its value
    # ("argument --index-url: 'fetch' is not an http(s):// or file:// URL").
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert f"argument {argv[1]}: expected one argument" in capsys.readouterr().err
