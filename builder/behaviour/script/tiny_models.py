"""Tiny Hugging Face model folders (``config.json`` and, for ModelOpt, ``hf_quant_config.json``;
no weights, no tokenizer) of the MoE families SM120 users serve.

Standard library only. The shapes are small, but DeepSeek-V3's expert layout is its own
(256 routed experts, top-8, 8 groups: SGLang's shared-expert fusion decision checks it);
what matters is what the release's selection code reads: the architecture, ``model_type``,
the expert counts and the checkpoint's
declared quantization (ModelOpt's ``quant_algo: NVFP4``, FP8 block quantization,
compressed-tensors NVFP4, or none for bf16).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

_EXCLUDE = ["lm_head", "model.layers.0.self_attn*", "model.layers.*.mlp.gate"]
_MODELOPT_NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                   "kv_cache_quant_algo": None, "exclude_modules": _EXCLUDE}
# ModelOpt exports that keep the shared expert in bf16 exclude it (GLM-5.2-NVFP4 does).
_BF16_SHARED = [*_EXCLUDE, "model.layers.*.mlp.shared_experts*"]
_MODELOPT_FILE = {"producer": {"name": "modelopt", "version": "0.37.0"},
                  "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                                   "group_size": 16, "exclude_modules": _EXCLUDE}}
_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [128, 128]}
_FP4_ARGS = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
             "symmetric": True, "dynamic": False}
_CT_NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
             "config_groups": {"group_0": {"targets": ["Linear"], "weights": _FP4_ARGS,
                                           "input_activations": {**_FP4_ARGS,
                                                                 "dynamic": "local"}}},
             "ignore": ["lm_head", "re:.*mlp.gate$"], "quantization_status": "compressed"}

_DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 16,
    "num_key_value_heads": 16, "n_shared_experts": 1, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
    "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 384,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "max_position_embeddings": 4096, "rope_theta": 10000, "rms_norm_eps": 1e-6,
    "hidden_act": "silu", "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "bos_token_id": 0, "eos_token_id": 1}
_QWEN3_MOE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 1024,
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 4096,
    "rope_theta": 1000000, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "torch_dtype": "bfloat16", "tie_word_embeddings": False, "bos_token_id": 0,
    "eos_token_id": 1}
# DeepSeek-V3.2: the sparse (DSA) attention's indexer settings on the V3 shape.
_DEEPSEEK_V32 = {**_DEEPSEEK_V3, "architectures": ["DeepseekV32ForCausalLM"],
                 "model_type": "deepseek_v32", "index_topk": 64, "index_n_heads": 8,
                 "index_head_dim": 128}
# GLM-5 (GlmMoeDsaForCausalLM): the DSA shape under GLM's architecture name, which the DSA
# resolution reads (upstream's GLM-FP8-on-SM12x branch); the V3.2 model_type loads it.
_GLM5_DSA = {**_DEEPSEEK_V32, "architectures": ["GlmMoeDsaForCausalLM"]}

#: name -> (config, quantization_config or None, writes hf_quant_config.json)
MODELS: dict[str, tuple[dict[str, Any], dict[str, Any] | None, bool]] = {
    "deepseek-v3-nvfp4": (_DEEPSEEK_V3, _MODELOPT_NVFP4, True),
    "deepseek-v3-nvfp4-bf16-shared": (_DEEPSEEK_V3, _MODELOPT_NVFP4, True),
    "deepseek-v3-fp8": (_DEEPSEEK_V3, _FP8, False),
    "deepseek-v3-bf16": (_DEEPSEEK_V3, None, False),
    "qwen3-moe-nvfp4": (_QWEN3_MOE, _MODELOPT_NVFP4, True),
    "qwen3-moe-ct-nvfp4": (_QWEN3_MOE, _CT_NVFP4, False),
    "qwen3-moe-fp8": (_QWEN3_MOE, _FP8, False),
    "qwen3-moe-bf16": (_QWEN3_MOE, None, False),
    "deepseek-v32-bf16": (_DEEPSEEK_V32, None, False),
    "deepseek-v32-nvfp4": (_DEEPSEEK_V32, _MODELOPT_NVFP4, True),
    "glm5-dsa-bf16": (_GLM5_DSA, None, False),
}


def write(name: str, root: Path) -> Path:
    """Write model ``name`` under ``root`` and return its folder (rewritten when the
    definition above changed, so a kept folder never serves an older configuration)."""
    config, quantization, modelopt_file = MODELS[name]
    exclude = _BF16_SHARED if name.endswith("-bf16-shared") else _EXCLUDE
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = copy.deepcopy(config)
    if quantization is not None:
        data["quantization_config"] = copy.deepcopy(quantization)
        if modelopt_file:
            data["quantization_config"]["exclude_modules"] = exclude
    files = {"config.json": json.dumps(data, indent=1)}
    if modelopt_file:
        quant: dict[str, Any] = copy.deepcopy(_MODELOPT_FILE)
        quant["quantization"]["exclude_modules"] = exclude
        files["hf_quant_config.json"] = json.dumps(quant, indent=1)
    for file_name, text in files.items():
        path = folder / file_name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return folder
