"""The CLI as a user runs it: the default target end to end from PyPI, JSON output, and
every bad input giving one clear message, the exit status of its kind, and nothing in dist/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from builder.core.errors import (
    BuildError,
    ConfigurationError,
    MissingToolError,
    PatchError,
    PublishError,
    SourceError,
    VerificationError,
)
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.project import patch_sha, write_project
from tests.helpers.releases import RELEASES
from tests.helpers.targets import target_names

SEED = REPO / "patches" / "0001-enable-flashinfer-cutlass-autotune.patch"
SERIES_TEXT = (REPO / "patches" / "series.toml").read_text()
BATCH_OPS = "python/sglang/srt/batch_invariant_ops/batch_invariant_ops.py"


def _series_for(name: str, text: str, extra: str = "") -> str:
    return f"""
[[patch]]
file = "{name}"
sha256 = "{patch_sha(text)}"
strip = 1
versions = ">=0.5"
{extra}
"""


def _assert_refused(done, message: str, dist: Path) -> None:  # type: ignore[no-untyped-def]
    # a typed refusal: the status is the one of the kind it prints (builder.core.errors)
    kinds = {cls.kind: cls.exit_status for cls in (VerificationError, ConfigurationError,
                                                    MissingToolError, SourceError, PatchError,
                                                    BuildError, PublishError)}
    kind = next((line.split(":", 1)[0] for line in done.stderr.splitlines()
                 if line.split(":", 1)[0] in kinds), "")
    assert done.returncode == kinds.get(kind), (kind, done.returncode, done.stderr)
    assert message in " ".join(done.stderr.split()), done.stderr
    assert "Traceback" not in done.stderr
    assert not dist.exists() or not any(dist.iterdir())


def test_default_target_builds_from_pypi(shared_cache: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    done = run_cli("wheel", "--dist", str(dist), "--json", cache=shared_cache)
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(done.stdout)["wheels"]
    assert Path(result["path"]).name == "sglang-0.5.9+sm120.1-py3-none-any.whl"
    assert [p.name for p in dist.iterdir()] == ["sglang-0.5.9+sm120.1-py3-none-any.whl"]
    upstream = result["provenance"]["upstream"]
    assert upstream["sha256"] == RELEASES["0.5.9"].sha256 and upstream["kind"] == "sdist"
    hunk = result["provenance"]["patches"][0]["files"][0]["hunks"][0]
    assert (hunk["status"], hunk["changed_line"]) == ("clean", 1842)


def test_targets_lists_the_shipped_targets() -> None:
    done = run_cli("targets", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["default"] == "sglang-0.5.9"
    names = [t["name"] for t in data["targets"]]
    assert names == target_names()  # targets.toml's order
    for target in data["targets"][:3]:  # released with an sdist: built from it
        assert target["prefer"] == "sdist"
        assert {s["kind"] for s in target["sources"]} == {"sdist", "git"}
    tags = {"sglang-0.5.11": ["cp311", "cp312"], "sglang-0.5.12.post1": ["cp311", "cp312"],
            # written by bump: every CPython manylinux x86_64 wheel upstream publishes
            "sglang-0.5.16": ["cp310", "cp311", "cp312", "cp313"],
            "sglang-0.5.20": ["cp310", "cp311", "cp312", "cp313"],
            "sglang-0.5.23": ["cp311", "cp312", "cp313"]}
    for target in data["targets"][3:]:  # wheels only upstream: repacked
        assert target["prefer"] == "wheel"
        found = [s["filename"].split("-")[2] for s in target["sources"]]
        # a target added later: one wheel per CPython tag, in order
        assert found == tags.get(target["name"], sorted(set(found), key=lambda t: int(t[3:])))


def test_patch_report_table_and_dry_run(sdists: dict[str, Path], tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", sdist=sdists["0.5.10.post1"], version="0.5.10.post1")
    done = run_cli("patch", "--dry-run", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    assert "fuzz" in done.stdout and "2075" in done.stdout
    assert "flashinfer_trtllm_routed" in " ".join(done.stdout.split())
    assert "nothing written" in done.stdout
    assert not (tmp_path / "cache" / "patched").exists()


def test_patch_report_reads_at_80_columns_and_in_logs(sdists: dict[str, Path],
                                                     tmp_path: Path) -> None:
    """Piped stdout at 80 columns (a CI log): one unbroken line per patch, file and hunk,
    never a table folded into fragments; a wide terminal still gets the table."""
    project = write_project(tmp_path / "p", sdist=sdists["0.5.10.post1"], version="0.5.10.post1")
    path = "python/sglang/srt/model_executor/model_runner.py"
    narrow = run_cli("patch", "--dry-run", cwd=project, cache=tmp_path / "cache",
                     env={"COLUMNS": "80"})
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert f"  {path}" in lines
    hunk = next(line for line in lines if line.startswith("    hunk 1: "))
    assert hunk.startswith("    hunk 1: fuzz at line 2075 (offset 236, fuzz 1)")
    assert any(line.startswith("0001-enable-flashinfer-cutlass-autotune-0.5.11.patch: "
                               "not-applicable") for line in lines)
    assert not any(char in narrow.stdout for char in "│┃━")
    # the intent's detail names the file whole, on the intent's own line
    assert any(line.startswith("intent holds") and f"{path}: 'flashinfer_cutlass' is live"
               in line for line in lines)
    wide = run_cli("patch", "--dry-run", cwd=project, cache=tmp_path / "cache",
                   env={"COLUMNS": "250"})
    assert wide.returncode == 0, wide.stderr
    row = next(line for line in wide.stdout.splitlines() if path in line)
    assert row.startswith("│") and "fuzz" in row and "2075" in row


def test_help_teaches() -> None:
    done = run_cli("--help")
    assert done.returncode == 0
    assert "examples:" in done.stdout and "exit status" in done.stdout
    done = run_cli("patch", "--help")
    assert "--source-dir" in done.stdout and "--max-fuzz" in done.stdout


def test_unknown_target(tmp_path: Path) -> None:
    done = run_cli("wheel", "--target", "nope", "--dist", str(tmp_path / "dist"))
    _assert_refused(done, "unknown target 'nope'", tmp_path / "dist")
    assert "sglang-0.5.9, sglang-0.5.7, sglang-0.5.10.post1, sglang-0.5.11" in done.stderr


def test_unknown_target_as_json(tmp_path: Path) -> None:
    done = run_cli("wheel", "--target", "nope", "--json", "--dist", str(tmp_path / "dist"))
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"].startswith("unknown target 'nope'")


def test_sha256_mismatch(sdists: dict[str, Path], tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", sdist=sdists["0.5.9"],
                            sha256=RELEASES["0.5.7"].sha256)
    done = run_cli("wheel", cwd=project, cache=tmp_path / "cache")
    _assert_refused(done, "sha256 mismatch for sglang-0.5.9.tar.gz", project / "dist")


def test_unreachable_source(tmp_path: Path) -> None:
    # PIP_RETRIES=0 (pip's variable, which the downloads honour): the same error at once,
    # not after 15 s of backoff.
    project = write_project(tmp_path / "p")
    done = run_cli("wheel", "--index-url", "http://127.0.0.1:9/simple", cwd=project,
                   cache=tmp_path / "cache", env={"PIP_RETRIES": "0"})
    _assert_refused(done, "could not reach http://127.0.0.1:9/simple/sglang/", project / "dist")


@pytest.mark.parametrize("retries", ["-1", "lots", "101"])
def test_pip_retries_that_is_not_a_count_is_a_configuration_error(tmp_path: Path,
                                                                   retries: str) -> None:
    project = write_project(tmp_path / "p")
    done = run_cli("wheel", "--index-url", "http://127.0.0.1:9/simple", cwd=project,
                   cache=tmp_path / "cache", env={"PIP_RETRIES": retries})
    assert done.returncode == 2, done.stderr
    assert f"PIP_RETRIES={retries!r} is not a number of retries" in done.stderr
    assert not (project / "dist").exists()


def test_malformed_patch(sdists: dict[str, Path], tmp_path: Path) -> None:
    bad = f"--- a/{BATCH_OPS}\n+++ b/{BATCH_OPS}\n@@ -1,5 +1,5 @@\n import os\n-x\n"
    project = write_project(tmp_path / "p", sdist=sdists["0.5.9"], patches={"bad.patch": bad},
                            series=_series_for("bad.patch", bad))
    done = run_cli("wheel", cwd=project, cache=tmp_path / "cache")
    _assert_refused(done, "bad.patch is not a valid unified diff", project / "dist")


def test_empty_patch(sdists: dict[str, Path], tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", sdist=sdists["0.5.9"], patches={"e.patch": ""},
                            series=_series_for("e.patch", ""))
    done = run_cli("wheel", cwd=project, cache=tmp_path / "cache")
    _assert_refused(done, "e.patch is empty", project / "dist")


def test_missing_patch_file(sdists: dict[str, Path], tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", sdist=sdists["0.5.9"],
                            series=_series_for("gone.patch", "x"))
    done = run_cli("wheel", cwd=project, cache=tmp_path / "cache")
    _assert_refused(done, "patch file not found:", project / "dist")


def test_patch_changed_after_pinning(sdists: dict[str, Path], tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", sdist=sdists["0.5.9"])
    patch = project / "patches" / SEED.name
    patch.write_text(patch.read_text().replace("fast path", "quick path"))
    done = run_cli("wheel", cwd=project, cache=tmp_path / "cache")
    _assert_refused(done, f"patch file {SEED.name} changed after it was pinned", project / "dist")


def test_failed_hunk_shows_the_nearest_place(sdists: dict[str, Path], tmp_path: Path) -> None:
    # The line right above the change differs: no fuzz can drop it, so the hunk fails.
    text = SEED.read_text().replace("will cause some flashinfer", "may cause some flashinfer")
    project = write_project(tmp_path / "p", sdist=sdists["0.5.9"], patches={"f.patch": text},
                            series=_series_for("f.patch", text))
    done = run_cli("wheel", cwd=project, cache=tmp_path / "cache")
    _assert_refused(done, "patch f.patch failed", project / "dist")
    assert "nearest place: line 1839 (6 of 7 lines equal)" in done.stderr
    assert "+            # TODO: flashinfer_cutlass will cause some" in done.stderr


def test_ambiguous_hunk(sdists: dict[str, Path], unpacked: dict[str, Path],
                        tmp_path: Path) -> None:
    lines = (unpacked["0.5.9"] / BATCH_OPS.removeprefix("python/")).read_text().splitlines()
    block = lines[111:118]  # lines 112-118, repeated verbatim at 651-657
    assert lines[650:657] == block
    body = "".join(f" {line}\n" for line in block[:3]) + f"-{block[3]}\n" + \
        f"+{block[3]}  # patched\n" + "".join(f" {line}\n" for line in block[4:])
    text = f"--- a/{BATCH_OPS}\n+++ b/{BATCH_OPS}\n@@ -400,7 +400,7 @@\n{body}"
    project = write_project(tmp_path / "p", sdist=sdists["0.5.9"], patches={"a.patch": text},
                            series=_series_for("a.patch", text))
    done = run_cli("wheel", cwd=project, cache=tmp_path / "cache")
    _assert_refused(done, "hunk #1: ambiguous", project / "dist")
    assert "it could land at lines 651, 112" in done.stderr


def test_fuzz_over_the_limit(sdists: dict[str, Path], tmp_path: Path) -> None:
    text = SEED.read_text()
    project = write_project(tmp_path / "p", sdist=sdists["0.5.10.post1"], version="0.5.10.post1",
                            patches={SEED.name: text}, series=_series_for(SEED.name, text))
    done = run_cli("wheel", cwd=project, cache=tmp_path / "cache")
    _assert_refused(done, "needs fuzz 1, the series allows 0", project / "dist")


def test_failed_intent_check(sdists: dict[str, Path], tmp_path: Path) -> None:
    text = SEED.read_text().replace('+            "flashinfer_cutlass",',
                                    '+            # "flashinfer_cutlass",  (enabled)')
    series = SERIES_TEXT.replace("0001-enable-flashinfer-cutlass-autotune.patch", "c.patch") \
        .replace(patch_sha(SEED.read_text()), patch_sha(text))
    project = write_project(tmp_path / "p", sdist=sdists["0.5.9"], patches={"c.patch": text},
                            series=series)
    done = run_cli("wheel", cwd=project, cache=tmp_path / "cache")
    _assert_refused(done, "intent check of c.patch failed", project / "dist")
    assert "not in the literal" in " ".join(done.stderr.split())


def test_patch_on_a_source_dir_in_place(unpacked: dict[str, Path], tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(unpacked["0.5.7"], tree)
    done = run_cli("patch", "--source-dir", str(tree), "--patch", str(SEED), "--json")
    assert done.returncode == 0, done.stderr
    hunk = json.loads(done.stdout)["report"]["patches"][0]["files"][0]["hunks"][0]
    assert (hunk["status"], hunk["offset"], hunk["changed_line"]) == ("offset", -151, 1691)
    runner = tree / "sglang/srt/model_executor/model_runner.py"
    assert runner.read_text().splitlines()[1690] == '            "flashinfer_cutlass",'


@pytest.mark.parametrize("args", [["--strip", "0"], ["--strip", "5"]])
def test_wrong_strip_level_is_refused(unpacked: dict[str, Path], tmp_path: Path,
                                      args: list[str]) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(unpacked["0.5.9"], tree)
    before = (tree / "sglang/srt/model_executor/model_runner.py").read_bytes()
    done = run_cli("patch", "--source-dir", str(tree), "--patch", str(SEED), *args)
    assert done.returncode == 5
    assert "error:" in done.stderr and "Traceback" not in done.stderr
    assert (tree / "sglang/srt/model_executor/model_runner.py").read_bytes() == before


def test_json_into_a_closed_pipe_exits_quietly() -> None:
    """``python -m builder targets --json | head -0``: the reader is gone before the JSON is
    written; the CLI exits 141 (128 + SIGPIPE) with no traceback."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "builder", "targets", "--json"],
                              stdout=write, stderr=subprocess.PIPE, text=True, cwd=REPO,
                              timeout=120, check=False)
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr


def test_a_source_dir_of_another_release_or_project_is_refused(
        unpacked: dict[str, Path], tmp_path: Path) -> None:
    """An unpacked sdist says what it is (PKG-INFO): it is never built or patched as another
    release (``--target`` of another version) or when it is not SGLang at all."""
    dist = tmp_path / "dist"
    done = run_cli("wheel", "--target", "sglang-0.5.7", "--source-dir", str(unpacked["0.5.9"]),
                   "--dist", str(dist), "--json", cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout  # the flag names the wrong tree
    error = json.loads(done.stdout)
    assert "is SGLang 0.5.9 (its PKG-INFO), not 0.5.7" in error["error"]
    assert not dist.exists()
    other = tmp_path / "foo"
    shutil.copytree(unpacked["0.5.9"], other)
    pkg_info = other / "PKG-INFO"
    pkg_info.write_text(pkg_info.read_text().replace("Name: sglang", "Name: foo", 1))
    done = run_cli("patch", "--source-dir", str(other), "--patch", str(SEED), "--dry-run",
                   "--json", cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout
    assert "is foo (its PKG-INFO), not SGLang" in json.loads(done.stdout)["error"]
    # the same tree as what it is still patches
    done = run_cli("patch", "--source-dir", str(unpacked["0.5.9"]), "--patch", str(SEED),
                   "--dry-run", "--json", cache=tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
