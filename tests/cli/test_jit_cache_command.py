"""``kernels jit-cache`` refuses bad input with exit 2 before it fetches or builds anything
(the end-to-end run, a real spec compiled and packed: tests/kernels/test_triton_cache.py)."""

from __future__ import annotations

import json
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
