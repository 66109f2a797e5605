"""Serving: the per-GPU launch profiles of the current targets, checked with each pinned
release's own argument parser (its behaviour environment, cached in the test cache); the
image's launcher and ``serve-command`` resolving them the same way; bad profiles refused."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from builder.behaviour.env import parse_with_release
from builder.core.cache import Cache
from builder.core.config import load_targets
from builder.core.errors import BuilderError, ConfigurationError
from builder.image.profile import (
    LAUNCHER_SOURCE,
    PROFILES_DIR,
    check_profile,
    load_profile,
    profile_path,
    release_env,
)
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.targets import current_targets

TARGETS = load_targets(REPO / "targets.toml")
CURRENT = list(current_targets())  # from targets.toml and the series
GPUS = {"rtx-pro-6000", "rtx-5090"}
NVFP4_MOE = "/models/DeepSeek-V3-0324-FP4"


def profile_of(name: str):  # type: ignore[no-untyped-def]
    target = TARGETS.get(name)
    return target, load_profile(profile_path(REPO / PROFILES_DIR, target), target)


def launch(*args: str, profile: Path, gpu: str | None) -> subprocess.CompletedProcess[str]:
    """The image's launcher, in a dry run, with no nvidia-smi on PATH."""
    env = {**os.environ, "SGLANG_SM120_DRY_RUN": "1", "SGLANG_SM120_PROFILE": str(profile),
           "PATH": os.path.dirname(sys.executable)}
    env.pop("SGLANG_SM120_GPU", None)
    if gpu is not None:
        env["SGLANG_SM120_GPU"] = gpu
    return subprocess.run([sys.executable, str(LAUNCHER_SOURCE), *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.slow(reason="installs each current release's environment to run its parser")
@pytest.mark.parametrize("name", CURRENT)
def test_every_gpu_and_tp_passes_the_releases_own_parser(name: str, shared_cache: Path) -> None:
    target, profile = profile_of(name)
    assert set(profile.gpus) == GPUS
    assert all(profile.gpus[g]["tp_sizes"] == [1, 2, 4, 8] for g in GPUS)
    cache = Cache(shared_cache)
    result = check_profile(profile, target, cache=cache)
    assert result.method == "parser" and len(result.checked) == 1 + 2 * 4
    # What the parser made of each value: the types the release declares, our numbers.
    env = release_env(target, cache=cache)
    answers = parse_with_release(env, [item["argv"] for item in result.checked])
    for item, answer in zip(result.checked, answers, strict=True):
        assert answer["ok"], (item, answer)
        values = answer["values"]
        if item["gpu"] is None:
            continue
        args = profile.resolve(item["gpu"], item["tp"])
        assert values["tp_size"] == item["tp"]
        assert values["max_running_requests"] == args["--max-running-requests"]
        cap = {"rtx-pro-6000": 256, "rtx-5090": 128 if item["tp"] < 4 or name ==
               "sglang-0.5.16" else 160}[item["gpu"]]
        assert values["max_running_requests"] == cap
        graphs = args.get("--cuda-graph-max-bs-decode")
        if graphs is not None:
            assert values["cuda_graph_max_bs_decode"] == graphs == cap


@pytest.mark.slow(reason="installs 0.5.23's environment to run its parser")
def test_an_unknown_option_or_a_wrong_type_is_refused(tmp_path: Path,
                                                      shared_cache: Path) -> None:
    target, good = profile_of("sglang-0.5.23")
    cache = Cache(shared_cache)
    bad = tmp_path / "p.toml"
    bad.write_text(good.text.replace('[gpu.rtx-5090.tp.8]\n',
                                     '[gpu.rtx-5090.tp.8]\n"--no-such-option" = true\n'))
    with pytest.raises(ConfigurationError, match=r"GPU rtx-5090, TP 8\): sglang 0\.5\.23's own "
                       r"argument parser refuses it: unrecognized arguments: --no-such-option"):
        check_profile(load_profile(bad, target), target, cache=cache)
    bad.write_text(good.text.replace('"--max-running-requests" = 256',
                                     '"--max-running-requests" = "many"'))
    with pytest.raises(ConfigurationError, match=r"GPU rtx-pro-6000, TP 1\).*--max-running-"
                       r"requests: invalid int value: 'many'"):
        check_profile(load_profile(bad, target), target, cache=cache)
    bad.write_text(good.text.replace("[args]\n", '[args]\n"--moe-runner-backend" = "b12x"\n'))
    with pytest.raises(ConfigurationError, match=r"common \[args\].*invalid choice: 'b12x'"):
        check_profile(load_profile(bad, target), target, cache=cache)
    # An sdist target (no behaviour environment): the option names of its server_args.py.
    old = TARGETS.get("sglang-0.5.9")
    bad.write_text('upstream_version = "0.5.9"\n[args]\n"--no-such-option" = true\n')
    with pytest.raises(ConfigurationError, match=r"sglang 0\.5\.9 has no option --no-such-option"):
        check_profile(load_profile(bad, old), old, cache=cache)
    old_profile = load_profile(profile_path(REPO / PROFILES_DIR, old), old)
    assert check_profile(old_profile, old, cache=cache).method == "names"


@pytest.mark.slow(reason="installs 0.5.23's environment to run its parser")
def test_serve_command_for_4x_rtx_pro_6000_and_an_nvfp4_moe(shared_cache: Path) -> None:
    done = run_cli("serve-command", "--target", "sglang-0.5.23", "--gpu", "rtx-pro-6000",
                   "--tp", "4", "--model", NVFP4_MOE, "--check", "--json", "--",
                   "--port", "30001", cache=shared_cache)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["env"] == {"FLASHINFER_DISABLE_JIT": "1"}
    assert out["checked"] == "parsed by sglang 0.5.23's own argument parser"
    assert out["argv"] == ["python", "-m", "sglang.launch_server", "--max-running-requests",
                           "256", "--cuda-graph-max-bs-decode", "256", "--tp-size", "4",
                           "--model-path", NVFP4_MOE, "--port", "30001"]
    assert out["command"] == "FLASHINFER_DISABLE_JIT=1 " + shlex.join(out["argv"])
    assert out["requirements"][0] == "sglang==0.5.23+sm120.1"
    target = TARGETS.get("sglang-0.5.23")
    [answer] = parse_with_release(release_env(target, cache=Cache(shared_cache)),
                                  [out["argv"][3:]])
    assert answer["ok"] and answer["values"]["tp_size"] == 4
    assert answer["values"]["model_path"] == NVFP4_MOE
    assert answer["values"]["max_running_requests"] == 256
    # The release refuses what the parser refuses: the check is not a formality.
    bad = run_cli("serve-command", "--target", "sglang-0.5.23", "--gpu", "rtx-pro-6000",
                  "--tp", "4", "--model", NVFP4_MOE, "--check", "--",
                  "--max-running-requests", "four",
                  cache=shared_cache)
    assert bad.returncode == 2 and "invalid int value: 'four'" in bad.stderr


@pytest.mark.parametrize("name", CURRENT)
def test_serve_command_and_the_image_launcher_give_the_same_arguments(name: str) -> None:
    _, profile = profile_of(name)
    for gpu in sorted(GPUS):
        for tp in (1, 2, 4, 8):
            done = run_cli("serve-command", "--target", name, "--gpu", gpu, "--tp", str(tp),
                           "--model", "m", "--json")
            assert done.returncode == 0, done.stderr
            printed = json.loads(done.stdout)["argv"][3:]
            image = launch("--model-path", "m", "--tp-size", str(tp), profile=profile.path,
                           gpu=gpu)
            assert image.returncode == 0, image.stderr
            launched = shlex.split(image.stdout)[3:]
            # The launcher leaves --tp-size to the user's (last); serve-command adds it.
            assert [a for a in printed if a != "--model-path" and a != "m"] == \
                [*launched[:-4], "--tp-size", str(tp)]
            assert launched[-4:] == ["--model-path", "m", "--tp-size", str(tp)]


def test_the_launcher_picks_the_gpu_and_tp(tmp_path: Path) -> None:
    _, profile = profile_of("sglang-0.5.23")
    argv = shlex.split(launch("--model-path", "m", "--tp", "4", profile=profile.path,
                              gpu="rtx-5090").stdout)[3:]
    assert argv == ["--max-running-requests", "160", "--model-path", "m", "--tp", "4"]
    argv = shlex.split(launch("--model-path", "m", profile=profile.path,
                              gpu="rtx-5090").stdout)[3:]
    assert argv == ["--max-running-requests", "128", "--cuda-graph-max-bs-decode", "128",
                    "--tp-size", "1", "--model-path", "m"]
    # No GPU named and no nvidia-smi: the common [args] only, and a note saying so.
    plain = launch("--model-path", "m", profile=profile.path, gpu=None)
    assert plain.returncode == 0 and shlex.split(plain.stdout)[3:] == ["--model-path", "m"]
    assert "set SGLANG_SM120_GPU=rtx-5090|rtx-pro-6000" in plain.stderr
    wrong = launch("--model-path", "m", profile=profile.path, gpu="rtx-4090")
    assert wrong.returncode == 2 and "has no GPU 'rtx-4090'" in wrong.stderr
    odd = launch("--tp-size", "3", profile=profile.path, gpu="rtx-pro-6000")
    assert odd.returncode == 2 and "no TP size 3" in odd.stderr


def test_serve_command_refuses_bad_input(tmp_path: Path) -> None:
    done = run_cli("serve-command", "--target", "sglang-0.5.23", "--gpu", "rtx-4090",
                   "--tp", "4", "--model", "m")
    assert done.returncode == 2 and "has no GPU 'rtx-4090'" in done.stderr
    assert "--gpu rtx-5090 or rtx-pro-6000" in done.stderr
    done = run_cli("serve-command", "--target", "sglang-0.5.9", "--gpu", "rtx-5090",
                   "--tp", "1", "--model", "m")
    assert done.returncode == 2 and "has no per-GPU entries" in done.stderr
    for model, extra, message in (
            (" ", (), "--model is empty"),
            ("m", ("--", "--model-path", "/other"), "the model goes in --model, not after --"),
            ("m", ("--", "--model-path=/other"), "the model goes in --model, not after --"),
            # argparse's abbreviation and SGLang's alias name the same option
            ("m", ("--", "--model-pat", "/other"), "drop --model-pat and its value"),
            ("m", ("--", "--model", "/other"), "drop --model and its value"),
            # a path of bytes that are not UTF-8 (argv as Python decodes it): unprintable
            (os.fsdecode(b"/m/\xff\xfe"), (), "/m/\\xff\\xfe is not valid UTF-8")):
        done = run_cli("serve-command", "--target", "sglang-0.5.23", "--gpu", "rtx-5090",
                       "--tp", "1", "--model", model, *extra)
        assert done.returncode == 2 and message in done.stderr, done.stderr


def test_profile_loader_refuses_bad_gpu_tables(tmp_path: Path) -> None:
    target = TARGETS.get("sglang-0.5.23")
    path = tmp_path / "p.toml"
    head = 'upstream_version = "0.5.23"\n[args]\n'
    for body, message in (
            ('[gpu.x]\ntp_sizes = [1, 2]\n[gpu.x.tp.4]\n"--a" = 1\n', "not one of tp_sizes"),
            ('[gpu.x]\ntp_sizes = []\n', "tp_sizes must be a list of positive integers"),
            ('[gpu.x]\ntp_sizes = [1]\nmemory = 3\n', "unknown keys"),
            ('[gpu.x]\ntp_sizes = [1]\n[gpu.x.args]\n"a" = 1\n', "is not an option")):
        path.write_text(head + body)
        with pytest.raises(BuilderError, match=message):
            load_profile(path, target)


def test_the_dry_run_shows_the_environment_the_server_gets(tmp_path: Path) -> None:
    """With the kernel wheels installed the server runs with FlashInfer's JIT off, and the
    dry run's line says so (a shell runs it as printed)."""
    _, profile = profile_of("sglang-0.5.23")
    plain = launch("--model-path", "/models/m", profile=profile.path, gpu="rtx-pro-6000")
    assert plain.returncode == 0, plain.stderr
    assert shlex.split(plain.stdout)[0] == sys.executable  # no kernel wheels: nothing set
    (tmp_path / "flashinfer_jit_cache").mkdir()  # what the shim wheel installs, importable
    (tmp_path / "flashinfer_jit_cache" / "__init__.py").write_text("")
    env = {**os.environ, "SGLANG_SM120_DRY_RUN": "1", "SGLANG_SM120_PROFILE": str(profile.path),
           "SGLANG_SM120_GPU": "rtx-pro-6000", "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, str(LAUNCHER_SOURCE), "--model-path", "/models/m"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    words = shlex.split(done.stdout)
    assert words[0] == "FLASHINFER_DISABLE_JIT=1" and words[1:4] == [
        sys.executable, "-m", "sglang.launch_server"]
