"""The user's input files and names, read by one rule (``builder.core.userfiles.read_input``
and ``builder.core.config.git_url``): a named pipe is refused at once instead of waited on,
JSON nested past the recursion limit, a ``default`` that is not a name, a remote helper's
``ext::`` URL and an empty ``--target`` are each one configuration error (exit 2), and a lock
that is a link to nothing makes no folder where it points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.project import target_toml, write_project

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _run(*args: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own: an input that blocks fails the test in 60 s."""
    env = {**os.environ, "SGLANG_SM120_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    try:
        return subprocess.run([sys.executable, "-m", "builder", *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"builder {' '.join(args)} waited on its input for 60 s")


@pytest.mark.parametrize("case", ["targets-file", "lock", "request", "series"])
def test_a_named_pipe_as_an_input_is_refused_at_once(tmp_path: Path, case: str) -> None:
    project = write_project(tmp_path / "p")
    fifo = tmp_path / "input"
    os.mkfifo(fifo)
    if case == "targets-file":
        args: tuple[str, ...] = ("targets", "--targets-file", str(fifo))
    elif case == "lock":
        (project / "versions.lock").unlink(missing_ok=True)
        os.mkfifo(project / "versions.lock")
        args = ("lock", "--verify")
    elif case == "request":
        args = ("kernels", "build", "--request", str(fifo), "--dist", str(tmp_path / "dist"))
    else:
        (project / "patches" / "series.toml").unlink()
        os.mkfifo(project / "patches" / "series.toml")
        args = ("patch",)
    done = _run(*args, "--json", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)
    assert "a named pipe, not a file" in error["error"], error
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "dist").exists()


def test_a_lock_nested_past_the_recursion_limit_is_one_error(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p")
    (project / "versions.lock").write_text("[" * 100_000)
    done = run_cli("lock", "--verify", "--json", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "nests too deeply" in json.loads(done.stdout)["error"]
    assert "Traceback" not in done.stderr


def test_a_lock_that_links_to_nothing_makes_no_folder_where_it_points(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p")
    nowhere = tmp_path / "nowhere" / "versions.lock"
    (project / "versions.lock").unlink(missing_ok=True)
    (project / "versions.lock").symlink_to(nowhere)
    done = run_cli("lock", "--json", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "which does not exist" in json.loads(done.stdout)["error"]
    assert not nowhere.parent.exists()


@pytest.mark.parametrize("default", ['["t"]', "7", "{ name = \"t\" }"])
def test_a_default_that_is_not_a_name_is_one_error(tmp_path: Path, default: str) -> None:
    project = write_project(tmp_path / "p")
    text = (project / "targets.toml").read_text()
    (project / "targets.toml").write_text(text.replace('default = "t"', f"default = {default}"))
    done = run_cli("targets", "--json", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "'default' must be one target's name" in json.loads(done.stdout)["error"]
    assert "Traceback" not in done.stderr


def _git_project(root: Path, url: str) -> Path:
    project = write_project(root)
    body = f'kind = "git"\nurl = {json.dumps(url)}\ncommit = "{COMMIT}"\n'
    (project / "targets.toml").write_text('default = "g"\n' + target_toml("g", "0.5.9", body))
    return project


BAD_URLS = ["ext::sh -c touch% /tmp/owned", "fd::3", "-uhelp", "ftp://example.org/sglang.git",
            "", "  "]
GOOD_URLS = ["https://github.com/sgl-project/sglang.git", "git@github.com:sgl-project/sglang",
             "ssh://[::1]/srv/sglang.git", "file:///srv/git/sglang", "/srv/git/sglang",
             "../sglang"]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_git_pin_or_git_url_git_would_not_fetch_by_its_own_transports_is_refused(
        tmp_path: Path, url: str) -> None:
    project = _git_project(tmp_path / "p", url)
    done = run_cli("targets", "--json", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    fine = _git_project(tmp_path / "q", GOOD_URLS[0])
    done = run_cli("fetch", "--source", "git", "--git-url", url, "--json", cwd=fine,
                   cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--git-url" in json.loads(done.stdout)["error"]
    done = run_cli("matrix", "--commits", COMMIT, "--git-url", url, "--json", cwd=fine,
                   cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--git-url" in json.loads(done.stdout)["error"]
    assert not (tmp_path / "cache").exists()  # refused before anything was fetched


@pytest.mark.parametrize("url", GOOD_URLS)
def test_git_urls_of_its_own_transports_are_taken(tmp_path: Path, url: str) -> None:
    project = _git_project(tmp_path / "p", url)
    done = run_cli("targets", "--json", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("command", ["next-label", "patch", "wheel"])
def test_an_empty_target_name_is_refused_not_taken_for_the_default(tmp_path: Path,
                                                                   command: str) -> None:
    project = write_project(tmp_path / "p")
    before = (project / "targets.toml").read_bytes()
    done = run_cli(command, "--target", "", "--json", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--target" in json.loads(done.stdout)["error"]
    assert (project / "targets.toml").read_bytes() == before
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(("flag", "value"), [
    ("--registry", "bad host"), ("--registry", "127.0.0.1:99999"), ("--registry", ""),
    ("--registry", "http://x"), ("--repository", "../x"), ("--repository", "Team/X"),
    ("--repository", ""), ("--docker-host", "tcp://"), ("--docker-host", "garbage"),
    ("--docker-host", ""), ("--docker-host", "unix://relative.sock"),
    ("--docker-host", "tcp://127.0.0.1:99999")])
def test_image_names_and_engine_addresses_are_checked_before_anything_runs(
        tmp_path: Path, flag: str, value: str) -> None:
    project = write_project(tmp_path / "p")
    done = run_cli("image", flag, value, "--json", cwd=project, cache=tmp_path / "cache",
                   env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert flag in json.loads(done.stdout)["error"]
    assert not (tmp_path / "cache").exists() and not (project / "dist").exists()


@pytest.mark.parametrize("value", ["garbage", "tcp://", "unix://relative.sock",
                                   "tcp://host:0", "npipe:////./pipe/docker_engine"])
def test_a_malformed_docker_host_variable_is_the_users_setting_not_a_missing_engine(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from builder.core.engine import docker_host
    from builder.core.errors import ConfigurationError

    monkeypatch.setenv("DOCKER_HOST", value)
    with pytest.raises(ConfigurationError, match=r"^DOCKER_HOST '"):
        docker_host()


@pytest.mark.parametrize("value", ["unix:///var/run/docker.sock", "tcp://127.0.0.1:2375",
                                   "https://engine.example:2376", "ssh://me@build-host",
                                   "tcp://[::1]:2375"])
def test_engine_addresses_docker_py_connects_to_are_taken(monkeypatch: pytest.MonkeyPatch,
                                                          value: str) -> None:
    from builder.core.engine import docker_host

    monkeypatch.setenv("DOCKER_HOST", value)
    assert docker_host() == value == docker_host(value)


@pytest.mark.parametrize("name", [" docker.io/lmsysorg/sglang:v0.5.9", "docker.io/x\x00:1",
                                  "host:99999999/x:1", "docker.io/UPPER/case:1",
                                  "docker.io/x:bad tag"])
def test_a_pins_name_outside_the_reference_grammar_is_the_users_input(
        tmp_path: Path, name: str) -> None:
    pins = tmp_path / "pins.toml"
    pins.write_text(f'[[base]]\nupstream_version = "0.5.9"\ncuda_lane = "12.9"\n'
                    f'name = {json.dumps(name)}\ndigest = ""\n')
    before = pins.read_bytes()
    done = run_cli("pin-images", "--pins-file", str(pins), "--json", cwd=tmp_path,
                   cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "image name" in json.loads(done.stdout)["error"]
    assert pins.read_bytes() == before


@pytest.mark.parametrize("name", ["../../../tmp/evil", "", " t", "a/b", "-t", "x" * 101])
def test_a_target_name_is_a_plain_name(tmp_path: Path, name: str) -> None:
    project = write_project(tmp_path / "p")
    text = (project / "targets.toml").read_text()
    (project / "targets.toml").write_text(
        text.replace('default = "t"', f"default = {json.dumps(name)}")
            .replace('name = "t"', f"name = {json.dumps(name)}"))
    done = run_cli("targets", "--json", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not a plain name" in json.loads(done.stdout)["error"]


def test_a_lock_whose_schema_is_true_is_not_schema_1(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p")
    (project / "versions.lock").write_text('{"schema": true}\n')
    done = run_cli("lock", "--verify", "--json", cwd=project, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not a schema-1 version lock" in json.loads(done.stdout)["error"]


@pytest.mark.parametrize("case", ["nested", "fifo"])
def test_a_smoke_report_nested_too_deep_or_a_pipe_is_one_error_before_any_build(
        tmp_path: Path, case: str) -> None:
    report = tmp_path / "r.json"
    if case == "nested":
        report.write_text("[" * 100_000)
    else:
        os.mkfifo(report)
    done = _run("release", "wheels", "--repository-url", "http://127.0.0.1:9/", "--gate",
                "smoke", "--smoke-report", str(report), "--json", cwd=REPO,
                cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert str(report) in error and ("nests too deeply" in error or "named pipe" in error)
    assert "Traceback" not in done.stderr and not (tmp_path / "cache").exists()
