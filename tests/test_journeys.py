"""Issue 18's user journeys on real inputs: the version lock, the targets file found from
anywhere, the CUDA lane's fixes, patches from an sdist tree, refreshing one patch,
publishing wheels alone, the cache commands and a provenance a reader can use.

Every test runs the CLI as a user would (a subprocess) on the real 0.5.9 sdist, with real
git, GNU patch / git apply as oracles, a real pypiserver and the real nvcc of this machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import requests

from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.project import with_images, write_project
from tests.helpers.services import PackageIndex, start_package_index

WHEEL = "sglang-0.5.9+sm120.7-py3-none-any.whl"
SHIPPED = "0001-enable-flashinfer-cutlass-autotune.patch"
RUNNER = "python/sglang/srt/model_executor/model_runner.py"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One builder cache for the module: the 0.5.9 wheel is built once."""
    return tmp_path_factory.mktemp("journeys-cache")


def project(root: Path, sdists: dict[str, Path]) -> Path:
    return write_project(root, sdist=sdists["0.5.9"])


def ok(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}


def refused(done: subprocess.CompletedProcess[str], *parts: str) -> dict:
    data = json.loads(done.stdout)
    # a typed refusal: its exit status is its kind's, never the base class's
    assert done.returncode == data["exit_status"] and data["kind"] != "error", \
        done.stdout + done.stderr
    text = data["error"] + " " + data["hint"]
    for part in parts:
        assert part in text, text
    return data


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout


def sdist_patch(tree: Path, work: Path, old: str, new: str, message: str) -> Path:
    """A ``git format-patch`` made inside a copy of an unpacked sdist (a/sglang/... paths),
    as a user would: git init there, edit model_runner.py, commit, format-patch."""
    copy = work / "sdist-tree"
    shutil.copytree(tree, copy, ignore=shutil.ignore_patterns("*.egg-info"))
    git(copy, "init", "-q")
    git(copy, "add", "-A")
    git(copy, "commit", "-qm", "upstream")
    runner = copy / "sglang/srt/model_executor/model_runner.py"
    text = runner.read_text()
    assert text.count(old) == 1
    runner.write_text(text.replace(old, new))
    git(copy, "commit", "-qam", message)
    name = git(copy, "format-patch", "-1", "-o", str(work)).strip()
    return Path(name)


# ---------------------------------------------------------------- 1. one version, one content


@pytest.mark.slow(reason="builds three wheels")
def test_a_changed_series_under_the_same_label_is_refused_until_the_label_is_raised(
        sdists: dict[str, Path], unpacked: dict[str, Path], cache: Path,
        tmp_path: Path) -> None:
    root = project(tmp_path / "p", sdists)
    ok(run_cli("wheel", "--json", cwd=root, cache=cache))
    lock = root / "versions.lock"
    recorded = json.loads(lock.read_text())["wheel"]["t"]
    assert list(recorded) == ["0.5.9+sm120.7"]
    first = (root / "dist" / WHEEL).read_bytes()

    # Add a patch, as a user would, and build again under the same label.
    patch = sdist_patch(unpacked["0.5.9"], tmp_path,
                        'logger.info("Init torch distributed begin.")',
                        'logger.info("Init torch distributed begin (sm120).")', "log: say sm120")
    ok(run_cli("add-patch", str(patch), "--versions", "==0.5.9", "--description",
               "Log line", "--name", "0002-log.patch", "--json", cwd=root, cache=cache))
    done = run_cli("wheel", "--json", cwd=root, cache=cache)
    data = refused(done, "0.5.9+sm120.7", "one version must always mean one content",
                   "python -m builder next-label --target t")
    assert data["error"].startswith("wheel 0.5.9+sm120.7 of target t would have other content")
    assert (root / "dist" / WHEEL).read_bytes() == first  # nothing written
    assert json.loads(lock.read_text())["wheel"]["t"] == recorded
    check = run_cli("lock", "--verify", "--json", cwd=root, cache=cache)
    refused(check, "1 version(s) differ", "next-label --target t")

    # The fix the message names.
    before = (root / "targets.toml").read_text()
    bumped = ok(run_cli("next-label", "--target", "t", "--json", cwd=root))
    assert bumped == {"target": "t", "old": "sm120.7", "new": "sm120.8",
                      "version": "0.5.9+sm120.8"}
    after = (root / "targets.toml").read_text()
    assert after == before.replace('local_label = "sm120.7"', 'local_label = "sm120.8"')
    built = ok(run_cli("wheel", "--json", cwd=root, cache=cache))
    assert built["wheels"][0]["version"] == "0.5.9+sm120.8"
    entries = json.loads(lock.read_text())["wheel"]["t"]
    assert sorted(entries) == ["0.5.9+sm120.7", "0.5.9+sm120.8"]
    assert entries["0.5.9+sm120.7"] != entries["0.5.9+sm120.8"]
    # Stable: recording nothing new rewrites nothing, and the file is sorted JSON.
    text = lock.read_text()
    ok(run_cli("lock", "--json", cwd=root))
    ok(run_cli("lock", "--verify", "--json", cwd=root))
    assert lock.read_text() == text
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_the_lock_refuses_kernel_and_image_versions_with_other_content(
        sdists: dict[str, Path], cache: Path, tmp_path: Path) -> None:
    root = project(tmp_path / "p", sdists)
    other = "0" * 64
    (root / "versions.lock").write_text(json.dumps({
        "schema": 1, "wheel": {}, "kernels": {"t": {"0.6.3+sm120.7.cu129": other}},
        "image": {}}))
    done = run_cli("kernels", "build", "--target", "t", "--modules", "norm", "--json", cwd=root,
                   cache=cache)
    refused(done, "kernels 0.6.3+sm120.7.cu129 of target t", "next-label --target t")
    # Without the conflicting record the same command gets past the lock (and stops at
    # the toolchain: this machine has no CUDA 12.9 nvcc).
    (root / "versions.lock").unlink()
    done = run_cli("kernels", "build", "--target", "t", "--modules", "norm", "--json", cwd=root,
                   cache=cache)
    data = refused(done, "no nvcc for CUDA 12.9")
    assert "would have other content" not in data["error"]


@pytest.mark.slow(reason="starts a Docker Engine")
def test_the_lock_refuses_to_publish_an_image_tag_with_other_content(
        sdists: dict[str, Path], cache: Path, tmp_path: Path, docker_engine, registry,
        debian_base_image) -> None:
    root = project(tmp_path / "p", sdists)
    with_images(root)
    tag = f"{registry.host}/journeys:0.5.9-sm120.7"
    lock = {"schema": 1, "wheel": {}, "kernels": {}, "image": {"t": {tag: "0" * 64}}}
    (root / "versions.lock").write_text(json.dumps(lock))
    done = run_cli("release", "image", "--base-image", debian_base_image.reference, "--registry",
                   registry.host, "--repository", "journeys", "--gate", "static",
                   "--repository-url", "http://127.0.0.1:9/", "--docker-host",
                   docker_engine.host, "--json", cwd=root, cache=cache)
    data = refused(done, f"image {tag} of target t would have other content",
                   "next-label --target t")
    assert data["report"]["published"] == []
    assert json.loads((root / "versions.lock").read_text())["image"] == lock["image"]
    tags = requests.get(f"http://{registry.host}/v2/journeys/tags/list", timeout=30)
    assert tags.status_code == 404 or "0.5.9-sm120.7" not in (tags.json().get("tags") or [])


# ---------------------------------------------------------------- 2. run from anywhere


def test_the_targets_file_is_found_from_any_folder_below_it(sdists: dict[str, Path],
                                                            tmp_path: Path) -> None:
    root = project(tmp_path / "p", sdists)
    deep = root / "patches" / "deeper"
    deep.mkdir()
    listed = ok(run_cli("targets", "--json", cwd=deep))
    assert [t["name"] for t in listed["targets"]] == ["t"]
    assert listed["targets"][0]["series"] == str(root / "patches" / "series.toml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    refused(run_cli("targets", "--json", cwd=elsewhere), "targets file not found",
            "--targets-file")
    # --targets-file from elsewhere: its series path resolves beside it, not here.
    data = ok(run_cli("patch", "--targets-file", str(root / "targets.toml"), "--dry-run",
                      "--json", cwd=elsewhere, cache=tmp_path / "c"))
    assert data["report"]["patches"][0]["status"] == "applied"


# ---------------------------------------------------------------- 3. the CUDA lane


def test_a_failed_lane_check_names_the_exact_fix(shared_cache: Path, sdists: dict[str, Path],
                                                 tmp_path: Path) -> None:
    # sglang-0.5.9 offers 12.9 (default) and 13.0; this machine's nvcc is 13.0.
    done = run_cli("preflight", "--target", "sglang-0.5.9", "--json", cache=shared_cache)
    data = refused(done, "nvcc:", "--cuda-lane 13.0")
    nvcc = next(c for c in data["report"]["checks"] if c["name"] == "nvcc")
    assert nvcc["fix"].startswith("--cuda-lane 13.0 (the target offers CUDA 13.0")
    # A target without a 13.0 lane: the fix is a toolkit of its lane, never --cuda-lane.
    root = project(tmp_path / "p", sdists)
    done = run_cli("preflight", "--target", "t", "--json", cwd=root, cache=shared_cache)
    data = refused(done, "install the CUDA 12.9 toolkit")
    assert "--cuda-lane" not in data["hint"]
    # Headers missing: the pip command for the lane, and --include.
    empty = tmp_path / "empty"
    empty.mkdir()
    done = run_cli("preflight", "--target", "sglang-0.5.9", "--cuda-lane", "13.0",
                   "--include", str(empty), "--json", cache=shared_cache)
    data = refused(done, "pip install 'nvidia-cublas==13.*'", "pip install nvidia-curand",
                   "--include DIR")
    checks = {c["name"]: c for c in data["report"]["checks"]}
    assert checks["nvcc"]["ok"] and checks["compile 12.0a"]["ok"]


# ---------------------------------------------------------------- 4. patches from any tree


@pytest.mark.slow(reason="commits a copy of the whole 0.5.9 sdist, applies its patch 4 ways")
def test_a_patch_made_in_an_unpacked_sdist_is_applied_and_stored_in_repository_layout(
        sdists: dict[str, Path], unpacked: dict[str, Path], cache: Path,
        tmp_path: Path) -> None:
    tree = unpacked["0.5.9"]  # read-only: the patch is made in a copy, applied --dry-run
    patch = sdist_patch(tree, tmp_path, 'logger.info("Init torch distributed begin.")',
                        'logger.info("Init torch distributed begin (sm120).")',
                        "log: say sm120\n\nWhy: to see it.")
    text = patch.read_text()
    assert "--- a/sglang/srt/model_executor/model_runner.py" in text
    # The layout forced wrong, the old behaviour: refused.
    forced = run_cli("patch", "--source-dir", str(tree), "--patch", str(patch), "--layout",
                     "git", "--dry-run", "--json", cache=cache)
    refused(forced, "sglang/srt/model_executor/model_runner.py", "holds only python/")
    # Detected: applied on the sdist tree, and on the pinned target.
    done = ok(run_cli("patch", "--source-dir", str(tree), "--patch", str(patch), "--dry-run",
                      "--json", cache=cache))
    assert done["report"]["patches"][0]["status"] == "applied"
    assert done["report"]["patches"][0]["files"][0]["path"] == RUNNER
    root = project(tmp_path / "p", sdists)
    stored = ok(run_cli("add-patch", str(patch), "--versions", ">=0.5.9,<0.5.10",
                        "--description", "Log sm120", "--name", "0002-log.patch", "--json",
                        cwd=root))
    assert stored["layout"] == "sdist"
    converted = (root / "patches" / "0002-log.patch").read_text()
    assert f"diff --git a/{RUNNER} b/{RUNNER}" in converted
    assert f"--- a/{RUNNER}\n+++ b/{RUNNER}\n" in converted
    # Only the path lines changed: the message and the hunks are byte for byte.
    assert [line for line in converted.splitlines() if "sglang/srt" not in line] == \
        [line for line in text.splitlines() if "sglang/srt" not in line]
    # Oracle: git apply takes the stored patch on a repository-layout tree.
    repo = tmp_path / "repo"
    shutil.copytree(tree, repo / "python")
    subprocess.run(["git", "apply", "--check", "-p1", str(root / "patches/0002-log.patch")],
                   cwd=repo, check=True)
    series = (root / "patches" / "series.toml").read_text()
    assert 'file = "0002-log.patch"' in series and 'versions = ">=0.5.9,<0.5.10"' in series
    report = ok(run_cli("patch", "--dry-run", "--json", cwd=root, cache=cache))["report"]
    status = {p["name"]: p["status"] for p in report["patches"]}
    assert status[SHIPPED] == "applied" and status["0002-log.patch"] == "applied"
    assert list(status)[-1] == "0002-log.patch"  # appended at the end of the series


# ---------------------------------------------------------------- 5. refresh one patch


def _shifted(text: str, by: int) -> str:
    """The patch with its hunk's stated lines moved (it then applies at an offset)."""
    import re

    return re.sub(r"^@@ -(\d+),(\d+) \+(\d+),(\d+) @@",
                  lambda m: f"@@ -{int(m[1]) + by},{m[2]} +{int(m[3]) + by},{m[4]} @@",
                  text, flags=re.MULTILINE)


@pytest.mark.slow(reason="commits a copy of the whole 0.5.9 sdist, refreshes the series")
def test_refresh_patch_rewrites_that_patch_alone(sdists: dict[str, Path],
                                                 unpacked: dict[str, Path], cache: Path,
                                                 tmp_path: Path) -> None:
    import hashlib

    log = sdist_patch(unpacked["0.5.9"], tmp_path,
                      'logger.info("Init torch distributed begin.")',
                      'logger.info("Init torch distributed begin (sm120).")', "log")
    root = project(tmp_path / "p", sdists)
    ok(run_cli("add-patch", str(log), "--versions", "==0.5.9", "--description", "log",
               "--name", "0002-log.patch", "--json", cwd=root))
    patches = root / "patches"
    for name in (SHIPPED, "0002-log.patch"):  # both now apply only at an offset
        moved = _shifted((patches / name).read_text(), 7)
        old_sha = hashlib.sha256((patches / name).read_bytes()).hexdigest()
        (patches / name).write_text(moved)
        series = patches / "series.toml"
        series.write_text(series.read_text().replace(
            old_sha, hashlib.sha256(moved.encode()).hexdigest()))
    before = {p.name: p.read_bytes() for p in patches.iterdir()}
    done = ok(run_cli("refresh", "--patch", str(patches / "0002-log.patch"), "--json",
                      cwd=root, cache=cache))
    status = {p["name"]: p["status"] for p in done["patches"]}
    assert status[SHIPPED] == "kept" and status["0002-log.patch"] == "refreshed"
    assert set(status.values()) <= {"kept", "refreshed", "not-applicable"}
    assert (patches / SHIPPED).read_bytes() == before[SHIPPED]
    assert (patches / "0002-log.patch").read_bytes() != before["0002-log.patch"]
    series_text = (patches / "series.toml").read_text()
    assert hashlib.sha256(before[SHIPPED]).hexdigest() in series_text
    assert hashlib.sha256((patches / "0002-log.patch").read_bytes()).hexdigest() in series_text
    # The whole series, as before, rewrites the other one too.
    done = ok(run_cli("refresh", "--json", cwd=root, cache=cache))
    assert (patches / SHIPPED).read_bytes() != before[SHIPPED]
    unknown = run_cli("refresh", "--patch", "nope.patch", "--json", cwd=root, cache=cache)
    refused(unknown, "nope.patch is not a patch of the series", "0002-log.patch")


# ---------------------------------------------------------------- 6. wheels alone


@pytest.mark.slow(reason="starts two pypiservers")
def test_publish_wheels_without_docker(sdists: dict[str, Path], cache: Path,
                                       tmp_path: Path) -> None:
    # An index of its own: the session's index is the release tests', which publish this
    # very wheel name and must find it absent.
    package_index = start_package_index(tmp_path / "index", credentials=("sm120", "j-secret"))
    try:
        _publish_wheels_without_docker(sdists, cache, tmp_path, package_index)
    finally:
        package_index.stop()


def _publish_wheels_without_docker(sdists: dict[str, Path], cache: Path, tmp_path: Path,
                                   package_index: PackageIndex) -> None:
    root = project(tmp_path / "p", sdists)
    env = {**package_index.env(), "DOCKER_HOST": "unix:///nonexistent/docker.sock"}

    def publish(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "builder", "release", "wheels",
                               "--repository-url", package_index.url, "--json", *extra],
                              cwd=root, env={**os.environ, **env,
                                             "SGLANG_SM120_CACHE": str(cache)},
                              capture_output=True, text=True, timeout=900)

    # The default gate wants the smoke report of a GPU runner.
    refused(publish(), "the smoke gate needs the smoke test's report",
            "--smoke-report smoke.json", "--gate build")
    # A real report from this machine (no GPU): it failed, so nothing is published.
    ok(run_cli("wheel", "--json", cwd=root, cache=cache))
    report = tmp_path / "smoke.json"
    smoked = run_cli("smoke", "host", "--sglang-wheel", str(root / "dist" / WHEEL),
                     "--series", str(root / "patches/series.toml"), "--output", str(report),
                     "--json", cwd=root)
    assert smoked.returncode == 1 and report.is_file()
    refused(publish("--smoke-report", str(report)), "the smoke test did not pass")
    assert WHEEL not in {p.name for p in package_index.packages.iterdir()}
    # The build gate: published, then already published on a second run.
    first = ok(publish("--gate", "build"))
    assert [(p["name"], p["status"]) for p in first["published"]] == \
        [(WHEEL, "published")]
    second = ok(publish("--gate", "build"))
    assert [p["status"] for p in second["published"]] == ["already-published"]
    # The same name with other bytes on the index: refused, never overwritten.
    other = start_package_index(tmp_path / "other", credentials=("u", "p-4"))
    try:
        shutil.copy(REPO / "README.md", other.packages / WHEEL)
        done = subprocess.run(
            [sys.executable, "-m", "builder", "release", "wheels", "--repository-url",
             other.url, "--gate", "build", "--json"], cwd=root,
            env={**os.environ, **other.env(), "SGLANG_SM120_CACHE": str(cache)},
            capture_output=True, text=True, timeout=900)
        refused(done, "with other bytes", "a published file is never replaced")
        assert (other.packages / WHEEL).read_bytes() == (REPO / "README.md").read_bytes()
    finally:
        other.stop()


# ---------------------------------------------------------------- 7. the cache


def test_cache_list_prune_and_clean_never_remove_what_a_build_uses(
        sdists: dict[str, Path], tmp_path: Path) -> None:
    root = project(tmp_path / "p", sdists)
    cache = tmp_path / "cache"
    ok(run_cli("patch", "--dry-run", "--json", cwd=root, cache=cache))
    listed = ok(run_cli("cache", "list", "--json", cache=cache))
    kinds = {e["kind"] for e in listed["entries"]}
    assert {"downloads", "source"} <= kinds and listed["size"] > 10_000_000
    # One entry last used 40 days ago: prune --older-than 30 removes it alone.
    old = next(e for e in listed["entries"] if e["kind"] == "source")
    stamp = time.time() - 40 * 86400
    os.utime(old["path"], (stamp, stamp))
    pruned = ok(run_cli("cache", "prune", "--older-than", "30", "--json", cache=cache))
    assert [e["path"] for e in pruned["removed"]] == [old["path"]]
    assert not Path(old["path"]).exists()
    # A lookup records use: the source entry made again now is young.
    ok(run_cli("patch", "--dry-run", "--json", cwd=root, cache=cache))
    assert ok(run_cli("cache", "prune", "--older-than", "30", "--json",
                      cache=cache))["removed"] == []
    # A running build holds the cache: clean refuses and removes nothing.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from builder.core.cache import Cache; Cache(Path(sys.argv[1])).lookup('source', 'x');"
         " print('holding', flush=True); time.sleep(120)", str(cache)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        refused(run_cli("cache", "clean", "--json", cache=cache), "in use by a running build",
                "nothing was removed")
        assert len(ok(run_cli("cache", "list", "--json", cache=cache))["entries"]) == \
            len(listed["entries"])
    finally:
        holder.kill()
        holder.wait()
    cleaned = ok(run_cli("cache", "clean", "--json", cache=cache))
    assert len(cleaned["removed"]) == len(listed["entries"]) and cleaned["freed"] > 0
    assert ok(run_cli("cache", "list", "--json", cache=cache))["entries"] == []


# ---------------------------------------------------------------- 8. provenance and help


@pytest.mark.slow(reason="builds a wheel from scratch")
def test_the_provenance_carries_each_patch_description_and_message(
        sdists: dict[str, Path], cache: Path, tmp_path: Path) -> None:
    root = project(tmp_path / "p", sdists)
    ok(run_cli("wheel", "--json", cwd=root, cache=cache))
    with zipfile.ZipFile(root / "dist" / WHEEL) as wheel:
        record = json.loads(wheel.read("sglang-0.5.9+sm120.7.dist-info/sm120-provenance.json"))
    patches = {p["name"]: p for p in record["patches"]}
    shipped = patches[SHIPPED]
    assert shipped["description"] == ("Run FlashInfer autotune for the flashinfer_cutlass MoE "
                                      "backend (made on 0.5.9)")
    assert shipped["commit_message"].startswith(
        "model_runner: run FlashInfer autotune for the flashinfer_cutlass MoE backend\n\n"
        "Upstream keeps")
    assert "From:" not in shipped["commit_message"]
    assert "diff --git" not in shipped["commit_message"]
    assert shipped["commit_message"].endswith("stays upstream's text.")
    # the report's own status note stays what the patch stage said
    assert patches["0001-enable-flashinfer-cutlass-autotune-0.5.11.patch"]["message"] == \
        "declared for >=0.5.11"


def test_wheel_help_has_a_description_and_examples() -> None:
    done = run_cli("wheel", "--help")
    assert done.returncode == 0
    assert "Fetch the target's pinned upstream" in done.stdout
    assert "examples:\n  python -m builder wheel " in done.stdout
    assert "next-label --target NAME" in done.stdout
