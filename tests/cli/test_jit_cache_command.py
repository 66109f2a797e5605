"""``kernels jit-cache`` refuses bad input with exit 2 before it fetches or builds anything
(the end-to-end run, a real spec compiled and packed: tests/kernels/test_triton_cache.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli

SPEC = json.dumps({"name": "sglang.srt.mem_cache.memory_pool.masked_set_kv_buffer_kernel"})


@pytest.mark.parametrize(("specs", "arch", "target", "error"), [
    (None, "12.0f", "sglang-0.5.23", "the Triton specs file not found"),
    ("", "12.0f", "sglang-0.5.23", "holds no specialization record"),
    ('{"spec": 7}\n', "12.0f", "sglang-0.5.23", "line 1: spec is no string"),
    ("not json\n", "12.0f", "sglang-0.5.23", "line 1 is not JSON"),
    (json.dumps({"spec": SPEC}), "blackwell", "sglang-0.5.23", "not a CUDA arch"),
    (json.dumps({"spec": SPEC}), "12.0f", "sglang-0.5.9", "pins no wheel"),
    (json.dumps({"spec": SPEC}), "12.0f", "sglang-9.9.9", "sglang-9.9.9"),
])
def test_bad_input_is_refused_with_exit_2(tmp_path: Path, specs: str | None, arch: str,
                                          target: str, error: str) -> None:
    path = tmp_path / "watch.jsonl"
    if specs is not None:
        path.write_text(specs)
    done = run_cli("kernels", "jit-cache", "--target", target, str(path), arch,
                   str(tmp_path / "dist"), "--json", cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert answer["exit_status"] == 2 and answer["kind"] == "configuration error", answer
    assert error in answer["error"], answer
    assert answer["hint"]
    assert not (tmp_path / "dist").exists()


def test_it_adds_no_flag_of_its_own() -> None:
    from builder.cli.main import build_parser, walk_commands

    (parser,) = [p for path, p in walk_commands(build_parser())
                 if path == ("kernels", "jit-cache")]
    assert [a.option_strings for a in parser._actions if a.option_strings] == [["-h", "--help"]]


@pytest.mark.parametrize("kind", ["file", "dangling link", "link where the wheel goes"])
def test_a_dist_that_cannot_take_the_wheel_is_refused_before_anything_runs(
        tmp_path: Path, kind: str) -> None:
    """Checked before the fetch and the compile (it was found only when writing, after
    minutes of compiling)."""
    path = tmp_path / "watch.jsonl"
    path.write_text(json.dumps({"spec": SPEC}))
    dist = tmp_path / "dist"
    if kind == "file":
        dist.write_text("keep")
    elif kind == "dangling link":
        dist.symlink_to(tmp_path / "nowhere")
    else:
        dist.mkdir()
        (dist / "sglang_sm120_jit_caches-0.5.23+sm120.1-cp{}{}-none-any.whl".format(
            *sys.version_info[:2])).symlink_to(
            tmp_path / "victim")
    done = run_cli("kernels", "jit-cache", "--target", "sglang-0.5.23", str(path), "12.0f",
                   str(dist), "--json", cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert ("not a folder" if kind != "link where the wheel goes" else "symbolic link") in \
        answer["error"], answer
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.whl"))
    assert not (tmp_path / "victim").exists() and not (tmp_path / "nowhere").exists()
    if kind == "file":
        assert dist.read_text() == "keep"


@pytest.mark.parametrize(("arch", "version"), [
    ("12.0f", "0.5.23+sm120.1"),       # the target's own arch: the target's version
    ("sm_120f", "0.5.23+sm120.1"),     # the same arch written as cuobjdump does
    ("sm_120a", "0.5.23+sm120.1.sm120a"),
    ("sm_90a", "0.5.23+sm120.1.sm90a"),
    ("9.0a", "0.5.23+sm120.1.sm90a"),
])
def test_the_wheel_version_names_an_arch_that_is_not_the_targets(arch: str, version: str
                                                                  ) -> None:
    from packaging.version import Version

    from builder.kernels.jit_caches import artifact_version

    assert artifact_version("0.5.23+sm120.1", arch, ("12.0f",)) == version
    assert str(Version(version)) == version  # PEP 440


def test_an_inductor_folder_in_specs_that_is_no_servers_cache_is_refused_up_front(
        tmp_path: Path) -> None:
    watch = tmp_path / "watch"
    (watch / "inductor" / "aotautograd").mkdir(parents=True)
    (watch / "1.jsonl").write_text(json.dumps({"spec": SPEC}))
    done = run_cli("kernels", "jit-cache", "--target", "sglang-0.5.23", str(watch), "12.0f",
                   str(tmp_path / "dist"), "--json", cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "holds no Inductor FX graph entry" in json.loads(done.stdout)["error"]
    assert not (tmp_path / "dist").exists() and not (tmp_path / "cache").exists()
