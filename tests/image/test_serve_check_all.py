"""``serve-command --check --all``: every GPU x TP pair of a target's launch profile parsed by
the release's own argument parser in one run, each pair's verdict printed before the
command fails on a refused one; and the arguments it takes instead of --gpu/--tp/--model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomlkit

from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.targets import current_targets


@pytest.mark.parametrize(("args", "message"), [
    (("--all",), "--all checks every GPU x TP: it goes with --check"),
    (("--check", "--all", "--tp", "2"), "drop --gpu and --tp"),
    (("--gpu", "rtx-5090"), "serve-command needs --tp, --model"),
    # the single mode's rules on the user's arguments hold for --all too
    (("--check", "--all", "--model", "/m/\udcff"), "is not valid UTF-8"),
    (("--check", "--all", "--", "--model-path", "/m"), "the model goes in --model"),
])
def test_the_arguments_of_one_command_or_of_all(args: tuple[str, ...], message: str) -> None:
    done = run_cli("serve-command", "--target", current_targets()[-1], *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


@pytest.mark.slow(reason="installs the newest current release's environment for its parser")
def test_every_pair_is_checked_in_one_run_and_each_verdict_printed(
        shared_cache: Path, tmp_path: Path) -> None:
    name = current_targets()[-1]
    done = run_cli("serve-command", "--target", name, "--check", "--all", "--json",
                   cache=shared_cache)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    pairs = [(c["gpu"], c["tp"]) for c in report["checked"]]
    assert pairs[0] == (None, None) and len(pairs) == 1 + 2 * 4 and all(
        c["ok"] for c in report["checked"])
    # A request cap below the profile's graph bounds lowers them, as in the single mode.
    done = run_cli("serve-command", "--target", name, "--check", "--all", "--json", "--",
                   "--max-running-requests", "8", cache=shared_cache)
    assert done.returncode == 0, done.stderr
    for item in json.loads(done.stdout)["checked"]:
        argv = item["argv"]
        for bound in ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"):
            if bound in argv:
                assert int(argv[argv.index(bound) + 1]) <= 8, item
    # One pair made wrong: it is named, the others still pass, the command fails.
    profile = tomlkit.parse((REPO / "images/profiles" / f"{name}.toml").read_text())
    gpu = profile["gpu"]["rtx-5090"]  # type: ignore[index]
    gpu.setdefault("tp", tomlkit.table(is_super_table=True))  # type: ignore[union-attr]
    gpu["tp"].setdefault("8", tomlkit.table())  # type: ignore[index]
    gpu["tp"]["8"]["--max-running-requests"] = "many"  # type: ignore[index]
    bad = tmp_path / "bad.toml"
    bad.write_text(tomlkit.dumps(profile))
    done = run_cli("serve-command", "--target", name, "--check", "--all",
                   "--launch-profile", str(bad), cache=shared_cache)
    assert done.returncode == 2
    assert "REFUSED: rtx-5090 TP 8: argument --max-running-requests: invalid int value" \
        in done.stdout
    assert done.stdout.count("ok: ") == 8
    assert "refuses 1 of 9 commands" in " ".join(done.stderr.split())
