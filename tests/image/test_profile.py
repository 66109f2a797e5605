"""SM120 launch profiles and the launcher ``sglang-sm120-serve``: for every target, the
launcher's final command line (run here, as the image runs it) passes only options that
release's own ``server_args.py`` defines (read from the pinned sdist or wheel), with
values it knows; the user's arguments win; and the profile loader refuses bad files."""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from builder.core.config import load_targets
from builder.core.errors import BuilderError
from builder.image.profile import (
    LAUNCHER_SOURCE,
    PROFILES_DIR,
    load_profile,
    profile_path,
    server_args_options,
)
from tests.helpers.paths import REPO
from tests.helpers.releases import download as _download
from tests.helpers.targets import release_file

TARGETS = load_targets(REPO / "targets.toml")
SERVER_ARGS = "sglang/srt/server_args.py"
ARG_GROUPS = "sglang/srt/arg_groups/"  # where 0.5.16+ declare (0.5.2x: all) their fields


def _is_args_source(name: str) -> bool:
    return name.endswith(".py") and (name.endswith(SERVER_ARGS) or ARG_GROUPS in name)


@functools.cache
def server_args_sources(version: str) -> tuple[str, ...]:
    """``server_args.py`` and ``arg_groups/**.py`` of the release, from its pinned sdist or
    wheel (cached); ``server_args.py`` first."""
    archive = _download(release_file(version))  # any target's, read from targets.toml
    texts: dict[str, str] = {}
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as wheel:
            texts = {name: wheel.read(name).decode() for name in wheel.namelist()
                     if _is_args_source(name)}
    else:
        with tarfile.open(archive) as sdist:
            for member in sdist.getmembers():
                handle = sdist.extractfile(member) if _is_args_source(member.name) else None
                if handle is not None:
                    texts[member.name] = handle.read().decode()
    main = [text for name, text in texts.items() if name.endswith(SERVER_ARGS)]
    assert len(main) == 1, f"sglang {version}: {SERVER_ARGS} not found once"
    return (main[0], *(text for name, text in sorted(texts.items())
                       if not name.endswith(SERVER_ARGS)))


def launch(*args: str, profile: Path | str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the launcher as the image does, in a dry run."""
    env = {**os.environ, "SGLANG_SM120_DRY_RUN": "1"}
    if profile is not None:
        env["SGLANG_SM120_PROFILE"] = str(profile)
    return subprocess.run([sys.executable, str(LAUNCHER_SOURCE), *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", list(TARGETS.targets))
def test_every_option_of_the_final_command_exists_in_that_release(name: str) -> None:
    target = TARGETS.get(name)
    profile = load_profile(profile_path(REPO / PROFILES_DIR, target), target)
    sources = server_args_sources(str(target.upstream_version))
    known = server_args_options(*sources)
    done = launch("--model-path", "/models/glm", "--tp-size", "8", profile=profile.path)
    assert done.returncode == 0, done.stderr
    argv = shlex.split(done.stdout)
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert argv[-4:] == ["--model-path", "/models/glm", "--tp-size", "8"]  # the user's last
    options = [arg for arg in argv[3:] if arg.startswith("--")]
    assert options[:len(profile.options())] == profile.options()
    unknown = [option for option in options if option not in known]
    assert not unknown, f"sglang {target.upstream_version} has no {unknown}"
    for option, value in profile.args.items():
        if isinstance(value, str):  # a choice: the release's source names it
            assert any(f'"{value}"' in source for source in sources), \
                f"{option} {value}: not in {target.upstream_version}"


def test_the_check_tells_releases_apart() -> None:
    # The options are read per release: one 0.5.7 lacks is found in 0.5.9, and 0.5.16's
    # dataclass-declared options are read too.
    old, new = server_args_options(*server_args_sources("0.5.7")), \
        server_args_options(*server_args_sources("0.5.9"))
    assert "--fp4-gemm-backend" not in old and "--fp4-gemm-backend" in new
    latest = server_args_options(*server_args_sources("0.5.16"))
    assert {"--cuda-graph-max-bs-decode", "--moe-runner-backend", "--model"} <= latest
    # A field declared Arg(no_cli=True) has no option.
    assert "--uses-mamba-radix-cache" not in latest
    # 0.5.23 declares its fields in arg_groups/fields/*.py: server_args.py alone has only
    # a few options; its deprecated alias --cuda-graph-max-bs is gone.
    sources = server_args_sources("0.5.23")
    assert "--moe-runner-backend" not in server_args_options(sources[0])
    newest = server_args_options(*sources)
    assert {"--moe-runner-backend", "--cuda-graph-max-bs-decode", "--tp-size",
            "--no-enable-fused-qk-norm-rope"} <= newest
    assert "--cuda-graph-max-bs" not in newest


def test_users_arguments_win(tmp_path: Path) -> None:
    profile = tmp_path / "profile.toml"
    profile.write_text('upstream_version = "0.5.9"\n[args]\n"--moe-runner-backend" = '
                       '"flashinfer_cutlass"\n"--disable-cuda-graph" = true\n'
                       '"--max-running-requests" = 128\n"--off" = false\n'
                       '"--cuda-graph-bs" = [1, 2, 4]\n')
    argv = shlex.split(launch("--model-path", "m", profile=profile).stdout)
    assert argv[3:] == ["--moe-runner-backend", "flashinfer_cutlass", "--disable-cuda-graph",
                        "--max-running-requests", "128", "--cuda-graph-bs", "1", "2", "4",
                        "--model-path", "m"]
    # An option the user gives (either spelling) replaces the profile's.
    argv = shlex.split(launch("--max-running-requests=512", "--moe-runner-backend", "auto",
                              profile=profile).stdout)
    assert argv[3:] == ["--disable-cuda-graph", "--cuda-graph-bs", "1", "2", "4",
                        "--max-running-requests=512", "--moe-runner-backend", "auto"]
    # No profile at all.
    assert shlex.split(launch("--model-path", "m", profile="none").stdout)[3:] == \
        ["--model-path", "m"]
    missing = launch("--model-path", "m", profile=tmp_path / "absent.toml")
    assert missing.returncode == 2 and "cannot read the launch profile" in missing.stderr
    assert "SGLANG_SM120_PROFILE=none" in missing.stderr


def test_a_real_run_prints_the_command_then_execs_it(tmp_path: Path) -> None:
    # Without the dry run the launcher execs python -m sglang.launch_server; a stand-in
    # sglang package on PYTHONPATH shows the argv it got.
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text("import sys; print('ARGV', sys.argv[1:])\n")
    profile = tmp_path / "profile.toml"
    profile.write_text('[args]\n"--disable-cuda-graph" = true\n')
    done = subprocess.run([sys.executable, str(LAUNCHER_SOURCE), "--model-path", "m"],
                          env={**os.environ, "PYTHONPATH": str(tmp_path),
                               "SGLANG_SM120_PROFILE": str(profile)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ARGV ['--disable-cuda-graph', '--model-path', 'm']"
    assert done.stderr.startswith("sglang-sm120-serve: ") and "sglang.launch_server " \
        "--disable-cuda-graph --model-path m" in done.stderr


def test_profile_loader_refuses_bad_files(tmp_path: Path) -> None:
    target = TARGETS.get("sglang-0.5.9")
    path = tmp_path / "p.toml"
    with pytest.raises(BuilderError, match=r"no SM120 launch profile for target sglang-0\.5\.9"):
        load_profile(path, target)
    path.write_text('upstream_version = "0.5.7"\n[args]\n')
    with pytest.raises(BuilderError, match=r"is for sglang '0\.5\.7'"):
        load_profile(path, target)
    path.write_text('upstream_version = "0.5.9"\n[args]\n"max-running-requests" = 1\n')
    with pytest.raises(BuilderError, match="is not an option"):
        load_profile(path, target)
    path.write_text('upstream_version = "0.5.9"\n[args]\n"--x" = {a = 1}\n')
    with pytest.raises(BuilderError, match="is not an option"):
        load_profile(path, target)
