"""``plan --json``: the CI build matrix, derived from the targets file alone."""

from __future__ import annotations

import json
from pathlib import Path

from builder import load_targets
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.project import sdist_source, target_toml, write_project


def test_plan_has_one_entry_per_target_of_the_targets_file() -> None:
    done = run_cli("plan", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    targets = load_targets(REPO / "targets.toml")
    assert plan["default"] == targets.default == "sglang-0.5.9"
    assert [e["target"] for e in plan["targets"]] == list(targets.targets)
    for entry in plan["targets"]:
        target = targets.targets[entry["target"]]
        assert entry["upstream_version"] == str(target.upstream_version)
        assert entry["version"] == target.version
        assert entry["local_label"] == target.local_label
        assert entry["cuda_lane"] == target.cuda_lane
        assert entry["arch_list"] == list(target.arch_list)
        assert entry["source"] == target.prefer
        assert entry["sources"] == list(dict.fromkeys(p.kind for p in target.sources))
        assert entry["default"] is (target.name == targets.default)
        assert "flashinfer" not in json.dumps(entry)  # only known after a download
    by_name = {e["target"]: e for e in plan["targets"]}
    # built from the sdist: one pure-Python wheel; repacked: the pinned wheels' tags
    assert by_name["sglang-0.5.9"]["python_tags"] == []
    assert by_name["sglang-0.5.9"]["sources"] == ["sdist", "git"]
    assert by_name["sglang-0.5.11"]["python_tags"] == ["cp311", "cp312"]
    assert by_name["sglang-0.5.11"]["cuda_lane"] == "13.0"
    assert by_name["sglang-0.5.10.post1"]["arch_list"] == ["12.0f"]


def test_plan_follows_another_targets_file_and_downloads_nothing(tmp_path: Path) -> None:
    # The sdist URL points nowhere: a plan that fetched anything would fail.
    missing = tmp_path / "nowhere" / "sglang-0.5.9.tar.gz"
    project = write_project(tmp_path / "p", sdist=missing, extra_target=target_toml(
        "second", "0.5.7", sdist_source("0.5.7", missing), label="sm120.4"))
    done = run_cli("plan", "--json", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert [(e["target"], e["version"], e["default"]) for e in plan["targets"]] == [
        ("t", "0.5.9+sm120.7", True), ("second", "0.5.7+sm120.4", False)]
    assert not (tmp_path / "cache").exists()


def test_plan_table_and_a_bad_targets_file(tmp_path: Path) -> None:
    table = run_cli("plan", env={"COLUMNS": "200"})
    assert table.returncode == 0 and "sglang-0.5.12.post1" in table.stdout
    assert "cp311 cp312" in table.stdout
    bad = tmp_path / "targets.toml"
    bad.write_text('default = "x"\n')
    done = run_cli("plan", "--targets-file", str(bad))
    assert done.returncode == 2
    assert "declares no [[target]]" in done.stderr and "Traceback" not in done.stderr
