"""The tiny random-weight MoE model of the server check (builder/smoke/script/tiny_model.py).

Written by the real script into a temporary folder, then read by the real Transformers
release SGLang 0.5.16 pins (5.12.1) and matched against the weight names SGLang 0.5.16's
own Qwen3-MoE loader expects (read from its real wheel).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder.smoke.gpu import TINY_MODEL_PATH, SmokeOptions
from builder.smoke.gpu.serving import ServedModel, server_check
from tests.helpers.paths import REPO

SCRIPT = TINY_MODEL_PATH
assert SCRIPT.name == "tiny_model.py" and SCRIPT.parent.name == "script"
# Loaded by path, as the tested interpreter runs it (the builder never imports it).
_spec = importlib.util.spec_from_file_location("tiny_model", SCRIPT)
assert _spec is not None and _spec.loader is not None
tiny_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny_model)
DIMENSIONS, tensor_shapes, tiny_moe_config = (tiny_model.DIMENSIONS, tiny_model.tensor_shapes,
                                              tiny_model.tiny_moe_config)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "tiny-moe"
    done = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True,
                          text=True, check=True)
    made = json.loads(done.stdout)
    assert made["path"] == str(out)
    return out


def test_the_checkpoint_holds_every_tensor_in_bf16(tiny: Path) -> None:
    from safetensors import safe_open

    config = json.loads((tiny / "config.json").read_text())
    assert config == tiny_moe_config()
    expected = tensor_shapes(config)
    with safe_open(str(tiny / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(expected)
        for name in ("lm_head.weight", "model.layers.1.mlp.experts.7.down_proj.weight",
                     "model.layers.0.self_attn.k_norm.weight"):
            tensor = f.get_tensor(name)
            assert tuple(tensor.shape) == expected[name]
            assert str(tensor.dtype) == "torch.bfloat16"
    assert sorted(p.name for p in tiny.iterdir()) == ["config.json", "model.safetensors"]


def test_transformers_loads_it_with_no_missing_or_unexpected_weight(tiny: Path) -> None:
    import torch
    from transformers import AutoConfig, Qwen3MoeForCausalLM

    config = AutoConfig.from_pretrained(str(tiny))
    assert type(config).__name__ == "Qwen3MoeConfig"
    assert (config.num_experts, config.moe_intermediate_size, config.head_dim) == (8, 512, 128)
    model, info = Qwen3MoeForCausalLM.from_pretrained(str(tiny), dtype=torch.bfloat16,
                                                      output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert tuple(logits.shape) == (1, 4, DIMENSIONS["vocab_size"])
    assert torch.isfinite(logits).all()


def test_the_names_are_those_sglang_0_5_16_loads(matrix_files: dict[str, Path],
                                                 tiny: Path) -> None:
    with zipfile.ZipFile(matrix_files["0.5.16"]) as wheel:
        loader = wheel.read("sglang/srt/models/qwen3_moe.py").decode()
    # The loader's checkpoint names: the stacked q/k/v and expert projections, the router.
    ckpt = dict(re.findall(r'ckpt_(gate|up|down)_proj_name="(\w+)"', loader))
    assert ckpt == {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
    for shard in ("q_proj", "k_proj", "v_proj"):
        assert f'("qkv_proj", "{shard}",' in loader
    assert "self.gate = ReplicatedLinear" in loader and "self.q_norm = RMSNorm" in loader
    names = tensor_shapes(tiny_moe_config())
    assert "model.layers.0.mlp.gate.weight" in names
    experts = {n.rsplit(".", 2)[-2] for n in names if ".mlp.experts." in n}
    assert experts == set(ckpt.values())


def test_a_folder_that_is_not_empty_is_refused_and_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    done = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 1
    assert done.stderr.strip() == f"error: {out} exists and is not an empty folder"
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no partial left


def test_the_server_check_serves_the_tiny_model_without_a_tokenizer(tmp_path: Path) -> None:
    # No SGLang here: the check writes the model with this interpreter, starts the server
    # command, which fails at once, and reports that with the model it wrote.
    options = SmokeOptions(tiny_model=True, python=sys.executable, server_timeout=60.0)
    result = server_check(options, None, ServedModel(options, tmp_path))
    assert result.status == "failed"
    assert result.detail.startswith("the server exited with code 1 before it was ready")
    command = result.data["command"]
    assert command[-1] == "--skip-tokenizer-init"
    assert result.data["tiny_model"]["parameters"] == sum(
        _count(shape) for shape in tensor_shapes(tiny_moe_config()).values())
    assert Path(result.data["tiny_model"]["path"]) == tmp_path / "tiny-moe"


def _count(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def test_without_a_gpu_check_6_fails_as_such_and_writes_no_model(tmp_path: Path) -> None:
    # This machine has no GPU: the probe says so, and check 6 says the same instead of
    # writing a model and starting a server that can only crash.
    done = subprocess.run([sys.executable, "-m", "builder", "smoke", "host", "--tiny-model",
                           "--json"],
                          capture_output=True, text=True, check=False, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)["report"]
    server = next(c for c in report["checks"] if c["name"] == "server")
    assert server["status"] == "failed" and server["required"] is True
    assert server["detail"].startswith("no CUDA device")
    assert not list(tmp_path.glob("sm120-tiny-model-*"))


@pytest.mark.parametrize("args", [["image", "--image", "sglang-sm120:x"],
                                  ["host", "--probe-output", "probe.out"]])
def test_check_6_where_it_cannot_run_is_refused_up_front(tmp_path: Path,
                                                         args: list[str]) -> None:
    (tmp_path / "probe.out").write_text("")
    done = subprocess.run([sys.executable, "-m", "builder", "smoke", *args, "--tiny-model"],
                          capture_output=True, text=True, check=False, timeout=120,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert "--tiny-model" in done.stderr and "Traceback" not in done.stderr
    # image mode has no --tiny-model: argparse refuses it there
    assert ("unrecognized arguments: --tiny-model" in done.stderr) == (args[0] == "image")


def test_set_and_tokenizer_give_a_real_models_widths_and_a_round_trip_tokenizer(
        tmp_path: Path) -> None:
    """``--set`` changes the dimensions it names and only those; ``--tokenizer`` writes a
    tokenizer Transformers loads, of the model's vocabulary, that gives back any ids."""
    from transformers import AutoTokenizer

    out = tmp_path / "wide"
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), "--tokenizer",
                           "--set", "vocab_size=640", "--set", "num_experts=4",
                           "--set", "num_hidden_layers=1"],
                          capture_output=True, text=True, check=True)
    config = json.loads((out / "config.json").read_text())
    assert config == tiny_moe_config(vocab_size=640, num_experts=4, num_hidden_layers=1)
    assert json.loads(done.stdout)["config"]["num_experts"] == 4
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert len(tokenizer) == 640
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (config["bos_token_id"],
                                                                config["eos_token_id"])
    ids = [3, 17, 639, 400, 5]
    assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids


@pytest.mark.parametrize("bad", ["vocab_size", "vocab_size=0", "no_such=3", "hidden_size=x"])
def test_a_bad_dimension_is_one_usage_error_and_writes_nothing(tmp_path: Path,
                                                               bad: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "m"), "--set", bad],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "write NAME=N" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "m").exists()


def test_dense_writes_a_qwen3_transformers_loads_with_every_weight(tmp_path: Path) -> None:
    """``--dense``: a ``Qwen3ForCausalLM`` with one MLP per layer, no router or expert, that
    Transformers loads with no missing or unexpected weight."""
    import torch
    from transformers import AutoConfig, Qwen3ForCausalLM

    out = tmp_path / "dense"
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), "--dense",
                           "--set", "intermediate_size=768"],
                          capture_output=True, text=True, check=True)
    config = json.loads((out / "config.json").read_text())
    assert config == tiny_model.tiny_dense_config(intermediate_size=768)
    assert not set(tiny_model.MOE_ONLY) & set(config)
    assert "num_experts" not in json.loads(done.stdout)["config"]
    names = set(tensor_shapes(config))
    assert "model.layers.1.mlp.gate_proj.weight" in names
    assert not any(".experts." in n or n.endswith("mlp.gate.weight") for n in names)
    assert type(AutoConfig.from_pretrained(str(out))).__name__ == "Qwen3Config"
    model, info = Qwen3ForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16,
                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert tuple(model.model.layers[0].mlp.up_proj.weight.shape) == (768, DIMENSIONS["hidden_size"])
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_the_dense_names_are_those_sglang_0_5_16_loads(matrix_files: dict[str, Path]) -> None:
    with zipfile.ZipFile(matrix_files["0.5.16"]) as wheel:
        loader = wheel.read("sglang/srt/models/qwen3.py").decode()
        llama = wheel.read("sglang/srt/models/qwen2.py").decode()
    # Qwen3ForCausalLM stacks q/k/v into qkv_proj and gate/up into gate_up_proj (its own
    # stacked_params_mapping, or Qwen2's it inherits).
    mapping = loader if "stacked_params_mapping" in loader else llama
    for fused, shard in (("qkv_proj", "q_proj"), ("qkv_proj", "k_proj"),
                         ("qkv_proj", "v_proj"), ("gate_up_proj", "gate_proj"),
                         ("gate_up_proj", "up_proj")):
        assert f'("{fused}", "{shard}",' in mapping
    assert "class Qwen3ForCausalLM" in loader
    names = tensor_shapes(tiny_model.tiny_dense_config())
    mlp = {n.rsplit(".", 2)[-2] for n in names if ".mlp." in n}
    assert mlp == {"gate_proj", "up_proj", "down_proj"}
