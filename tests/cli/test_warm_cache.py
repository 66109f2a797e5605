"""The ``warm-cache`` command: capture the autotune file SGLang 0.5.16's server wrote on the
lent H200 (``reports/2026-12-01-h200-cold-start/``: the tiny Qwen3-MoE, 40 fused-MoE
entries), then restore it only for an equal key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.core.errors import ConfigurationError
from builder.smoke import autotune_path
from builder.smoke.autotune_path import AutotunePaths, check_model_path
from tests.helpers.cli import run_cli, run_cli_process
from tests.helpers.paths import REPO

REPORT_FILE = (REPO / "reports"
               / "2026-12-01-h200-cold-start" / "sglang-autotune-cache.json")
# Where SGLang 0.5.16 put it: flashinfer_autotune_cache_path, under SGLANG_CACHE_DIR.
RELATIVE = Path("flashinfer/autotune/0.6.14/sm90/d4e4eb6f01a747dc/rank_tp0_pp0_dp0.json")
KEY = {"gpu_name": "NVIDIA H200", "compute_capability": "9.0", "flashinfer_version": "0.6.14",
       "release": "sglang-0.5.16", "hidden": 1024, "experts": 8, "top_k": 2,
       "intermediate": 512, "tp": 1, "dtype": "bf16"}


def _server_cache(root: Path) -> Path:
    (root / RELATIVE).parent.mkdir(parents=True)
    (root / RELATIVE).write_bytes(REPORT_FILE.read_bytes())
    return root


def _captured(tmp_path: Path) -> Path:
    """The H200 run's file captured under ``tmp_path`` with :data:`KEY` (``warm.json``)."""
    cache = _server_cache(tmp_path / "sglang")
    done = run_cli("warm-cache", "capture", "--sglang-cache-dir", str(cache),
                   "--key", str(_key(tmp_path / "key.json")),
                   "--output", str(tmp_path / "warm.json"))
    assert done.returncode == 0, done.stderr
    return tmp_path / "warm.json"


def _key(path: Path, **change: object) -> Path:
    path.write_text(json.dumps({**KEY, **change}))
    return path


def test_capture_then_restore_gives_the_server_its_file_back(tmp_path: Path) -> None:
    cache = _server_cache(tmp_path / "sglang")
    done = run_cli("warm-cache", "capture", "--sglang-cache-dir", str(cache),
                   "--key", str(_key(tmp_path / "key.json")),
                   "--output", str(tmp_path / "warm.json"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["entries"] == 40
    dest = tmp_path / "fresh" / RELATIVE
    done = run_cli("warm-cache", "restore", "--artifact", str(tmp_path / "warm.json"),
                   "--key", str(tmp_path / "key.json"), "--dest", str(dest), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["restored"] is True
    assert json.loads(dest.read_text()) == json.loads(REPORT_FILE.read_text())
    assert json.loads((tmp_path / "warm.json").read_text())["folder"] == str(RELATIVE.parent)


@pytest.mark.parametrize("change", [{"tp": 2}, {"dtype": "fp8"},
                                    {"gpu_name": "NVIDIA GeForce RTX 5090",
                                     "compute_capability": "12.0"}])
def test_restore_ignores_another_key_with_one_warning(tmp_path: Path,
                                                      change: dict[str, object]) -> None:
    _captured(tmp_path)
    dest = tmp_path / "fresh" / RELATIVE
    # a process of its own: the warning reaches stderr as a user sees it, not pytest's capture
    done = run_cli_process("warm-cache", "restore", "--artifact", str(tmp_path / "warm.json"),
                           "--key", str(_key(tmp_path / "other.json", **change)),
                           "--dest", str(dest), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["restored"] is False
    assert done.stderr.count("its key does not match") == 1
    assert all(f"{name}: captured" in done.stderr for name in change)
    assert not (tmp_path / "fresh").exists()


def test_capture_takes_every_rank_of_one_run_only(tmp_path: Path) -> None:
    key = str(_key(tmp_path / "key.json", tp=2))
    done = run_cli("warm-cache", "capture", "--sglang-cache-dir", str(tmp_path / "empty"),
                   "--key", key, "--output", str(tmp_path / "warm.json"))
    assert done.returncode == 2
    assert "of 0 server configurations" in done.stderr and "--autotune-file" in done.stderr
    cache = _server_cache(tmp_path / "sglang")
    second = cache / RELATIVE.with_name("rank_tp1_pp0_dp0.json")
    second.write_bytes(REPORT_FILE.read_bytes())
    done = run_cli("warm-cache", "capture", "--sglang-cache-dir", str(cache),
                   "--key", key, "--output", str(tmp_path / "warm.json"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ranks"] == ["rank_tp0_pp0_dp0", "rank_tp1_pp0_dp0"]
    other = cache / RELATIVE.parent.with_name("0123456789abcdef") / "rank_tp0_pp0_dp0.json"
    other.parent.mkdir()
    other.write_bytes(REPORT_FILE.read_bytes())
    done = run_cli("warm-cache", "capture", "--sglang-cache-dir", str(cache),
                   "--key", key, "--output", str(tmp_path / "warm2.json"))
    assert done.returncode == 2 and "of 2 server configurations" in done.stderr
    assert not (tmp_path / "warm2.json").exists()


def test_capture_refuses_a_key_for_another_shape_or_a_bad_key(tmp_path: Path) -> None:
    cache = _server_cache(tmp_path / "sglang")
    done = run_cli("warm-cache", "capture", "--sglang-cache-dir", str(cache),
                   "--key", str(_key(tmp_path / "key.json", hidden=2048)),
                   "--output", str(tmp_path / "warm.json"))
    assert done.returncode == 2 and "no fused-MoE entry for fc1 weights" in done.stderr
    (tmp_path / "bad.json").write_text("{not json")
    done = run_cli("warm-cache", "capture", "--sglang-cache-dir", str(cache),
                   "--key", str(tmp_path / "bad.json"), "--output", str(tmp_path / "warm.json"))
    assert done.returncode == 2 and "cannot read the key" in done.stderr
    assert not (tmp_path / "warm.json").exists()


@pytest.mark.parametrize("how", ["same", "link", "hardlink"])
def test_an_output_that_is_its_own_input_is_refused(tmp_path: Path, how: str) -> None:
    cache = _server_cache(tmp_path / "sglang")
    source = cache / RELATIVE
    key = _key(tmp_path / "key.json")
    out = {"same": source, "link": tmp_path / "link.json",
           "hardlink": tmp_path / "hard.json"}[how]
    if how == "link":
        out.symlink_to(source)
    elif how == "hardlink":
        out.hardlink_to(source)
    done = run_cli("warm-cache", "capture", "--autotune-file", str(out), "--key", str(key),
                   "--output", str(source))
    assert done.returncode == 2 and "an input of this command" in done.stderr
    assert source.read_bytes() == REPORT_FILE.read_bytes()
    assert run_cli("warm-cache", "capture", "--autotune-file", str(source), "--key", str(key),
                   "--output", str(tmp_path / "warm.json")).returncode == 0
    before = (tmp_path / "warm.json").read_bytes()
    for dest in (tmp_path / "warm.json", key):
        done = run_cli("warm-cache", "restore", "--artifact", str(tmp_path / "warm.json"),
                       "--key", str(key), "--dest", str(dest))
        assert done.returncode == 2 and "an input of this command" in done.stderr
    assert (tmp_path / "warm.json").read_bytes() == before


def test_server_flags_without_model_path_are_refused_before_any_write(tmp_path: Path) -> None:
    # They are inputs of SGLang's key, which --dest skips: silently dropping them would
    # write a file the user believes is keyed to them.
    _captured(tmp_path)
    dest = tmp_path / "fresh" / RELATIVE
    done = run_cli("warm-cache", "restore", "--artifact", str(tmp_path / "warm.json"),
                   "--key", str(tmp_path / "key.json"), "--dest", str(dest),
                   "--", "--tp-size", "2")
    assert done.returncode == 2, done.stderr
    assert "go with --model-path" in done.stderr
    assert not dest.exists()


def test_model_path_restore_refuses_a_server_of_another_tp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_cache: Path) -> None:
    # A TP 2 key and artifact, server flags without --tp-size: the release computes one
    # rank (TP 1); writing the TP 2 run's rank 0 there was reported as "restored".
    cache = _server_cache(tmp_path / "sglang")
    (cache / RELATIVE.with_name("rank_tp1_pp0_dp0.json")).write_bytes(REPORT_FILE.read_bytes())
    key = str(_key(tmp_path / "key.json", tp=2))
    assert run_cli("warm-cache", "capture", "--sglang-cache-dir", str(cache), "--key", key,
                   "--output", str(tmp_path / "warm.json")).returncode == 0
    asked = []

    def tp1_server(run: object, argv: list[str], capability: tuple[int, int]) -> AutotunePaths:
        asked.append(argv)  # the release's own function, as it answers for these flags
        return AutotunePaths("0.5.16", (str(RELATIVE),), "m:flashinfer_autotune_cache_path")

    monkeypatch.setattr(autotune_path, "release_autotune_paths", tp1_server)
    (tmp_path / "model").mkdir()
    done = run_cli("warm-cache", "restore", "--artifact", str(tmp_path / "warm.json"),
                   "--key", key, "--model-path", str(tmp_path / "model"),
                   "--cache-dir", str(shared_cache),
                   env={"SGLANG_CACHE_DIR": str(tmp_path / "srv")})
    assert asked == [["--model-path", str(tmp_path / "model")]]
    assert done.returncode == 2, done.stderr
    assert "runs 1 TP rank(s)" in done.stderr and "the key says tp 2" in done.stderr
    assert "--tp-size 2" in done.stderr  # the fix
    assert not (tmp_path / "srv").exists()


@pytest.mark.parametrize("model", ["/models/Qwen3-30B-A3B-typo", "./modles/Qwen3",
                                   "Qwen3 30B"])
def test_a_mistyped_model_path_is_refused_before_the_release_runs(
        tmp_path: Path, shared_cache: Path, model: str) -> None:
    # It was the release's Hugging Face error: "Repo id must be in the form 'repo_name'..."
    _captured(tmp_path)
    done = run_cli("warm-cache", "restore", "--artifact", str(tmp_path / "warm.json"),
                   "--key", str(tmp_path / "key.json"), "--model-path", model,
                   "--targets-file", str(REPO / "targets.toml"),
                   "--cache-dir", str(shared_cache), "--", "--tp-size", "1", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert (f"--model-path {model}: no such folder (a local checkpoint folder holding "
            "config.json, or a Hugging Face name owner/name, which needs network)"
            ) in done.stderr, done.stderr
    assert "Repo id" not in done.stderr


@pytest.mark.parametrize("flags", [["--model", "other"], ["--model-path=/models/typo"],
                                   ["--tp-size", "1", "--model-path", "x"]])
def test_a_second_model_after_the_flags_separator_is_refused(
        tmp_path: Path, shared_cache: Path, flags: list[str]) -> None:
    # SGLang takes the last one: files went where the other model's server reads them
    _captured(tmp_path)
    (tmp_path / "tiny").mkdir()
    done = run_cli("warm-cache", "restore", "--artifact", str(tmp_path / "warm.json"),
                   "--key", str(tmp_path / "key.json"), "--model-path", str(tmp_path / "tiny"),
                   "--targets-file", str(REPO / "targets.toml"),
                   "--cache-dir", str(shared_cache), "--", *flags, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "after --: the model is --model-path's" in done.stderr, done.stderr


def test_a_local_folder_or_a_hugging_face_name_goes_to_the_release(tmp_path: Path) -> None:
    (tmp_path / "tiny").mkdir()
    for model in (str(tmp_path / "tiny"), "Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3.1",
                  "gpt2"):
        check_model_path(model)  # left to the release, as before
    with pytest.raises(ConfigurationError, match="no such folder"):
        check_model_path(str(tmp_path / "tiny2"))
    (tmp_path / "config.json").write_text("{}")  # a file is no checkpoint folder
    with pytest.raises(ConfigurationError, match=r"config\.json: a file, not a folder"):
        check_model_path(str(tmp_path / "config.json"))
