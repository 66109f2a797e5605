"""The checkpoint zoo (issue 34): tiny random-weight checkpoint folders (``config.json`` and,
where the public checkpoint ships one, ``hf_quant_config.json``; no weights, no tokenizer) that
reproduce the checkpoint forms SM12x users serve, each named after the public checkpoint it
stands for.

Standard library only: it runs inside each release's environment and the builder imports it.

What is copied and what is shrunk: the fields the release's selection code reads (the
architecture, ``model_type``, the quantization declaration, the expert layout where SGLang's
decisions check it, and the SwiGLU clamp fields) are copied verbatim from the public config
(``Form.copied`` names them, ``Form.source`` says where they were read); the sizes (hidden
256, 2 layers, few experts where the class allows) are shrunk. DeepSeek-V3-shaped forms keep
256 routed experts, top-8, 8 groups (SGLang's shared-expert fusion checks that layout).

Where the quantization is read from (SGLang 0.5.16 / 0.5.20 / 0.5.23,
``configs/model_config.py:ModelConfig._parse_quant_hf_config`` and
``_parse_modelopt_quant_config``): a ``quantization_config`` whose ``quant_method`` is
``modelopt`` (or absent) is parsed as ModelOpt: ``quant_algo`` ``MIXED_PRECISION`` with any
``quantized_layers`` entry of ``NVFP4``/``W4A16_NVFP4`` -> ``modelopt_mixed``, other
``MIXED_PRECISION`` -> ``w4afp8``, ``*FP4*`` -> ``modelopt_fp4``, ``FP8`` -> ``modelopt_fp8``;
``hf_quant_config.json`` is read only when ``config.json`` has no ``quantization_config``.
DeepSeek-V4's hybrid NVFP4 (``quant_method: fp8``, ``quant_algo: MIXED_PRECISION``,
``moe_quant_algo: NVFP4``, ``group_size``) is read as ``fp8`` and sets
``ModelConfig.nvfp4_moe_meta`` (same file, ``ModelConfig.__init__``).

Run ``python zoo_forms.py check DIR`` in a release's python to write every form under DIR and
print the quantization and ``nvfp4_moe_meta`` that release's ``ModelConfig`` reads from it,
against ``Form.expected``.
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RELEASES = ("0.5.16", "0.5.20", "0.5.23")

# --- Sources (public configs; the fields named in each Form's ``copied`` come from these) ---
_HF = "https://huggingface.co/"
_SRC_R1_NVFP4 = _HF + "nvidia/DeepSeek-R1-0528-FP4/blob/main/hf_quant_config.json"
_SRC_V3_NVFP4 = _HF + "nvidia/DeepSeek-V3-0324-FP4/blob/main/hf_quant_config.json"
_SRC_QWEN3_NVFP4 = _HF + "nvidia/Qwen3-235B-A22B-FP4/blob/main/hf_quant_config.json"
_SRC_QWEN36_MIXED = _HF + "nvidia/Qwen3.6-35B-A3B-NVFP4/blob/main/hf_quant_config.json"
_SRC_CT = _HF + "RedHatAI/Qwen3-30B-A3B-NVFP4/blob/main/config.json"
_SRC_GPT_OSS_20B = _HF + "openai/gpt-oss-20b/blob/main/config.json"
_SRC_GPT_OSS_120B = _HF + "openai/gpt-oss-120b/blob/main/config.json"
_SRC_GPT_OSS_NVFP4 = _HF + "Firworks/gpt-oss-120b-nvfp4 (model card quotes hf_quant_config.json)"
_SRC_STEP_NVFP4 = (_HF + "tacos4me/Step-3.5-Flash-NVFP4 (model card: compressed-tensors "
                   "nvfp4-pack-quantized, ignore lm_head + moe.gate; swiglu limit 7.0 on "
                   "layers 43-44) and " + _HF + "stepfun-ai/Step-3.5-Flash/blob/main/config.json")
_SRC_DSV4 = (_HF + "nvidia/DeepSeek-V4.1-Flash-NVFP4/blob/main/config.json (quantization_config "
             "as quoted verbatim in public notes); sglang 0.5.23 configs/model_config.py:"
             "ModelConfig.__init__ (nvfp4_moe_meta)")
_SRC_V3 = _HF + "deepseek-ai/DeepSeek-V3/blob/main/config.json"
_SRC_V32 = _HF + "deepseek-ai/DeepSeek-V3.2/blob/main/config.json"
_SRC_GLM5 = _HF + "zai-org/GLM-5-FP8/blob/main/config.json"
_SRC_QWEN3_FP8 = _HF + "Qwen/Qwen3-30B-A3B-FP8/blob/main/config.json"
_SRC_QWEN3 = _HF + "Qwen/Qwen3-30B-A3B/blob/main/config.json"
_SRC_W4AFP8 = (_HF + "Barrrrry/DeepSeek-R1-W4AFP8 (cited by sglang 0.5.23 configs/"
               "model_config.py:_parse_quant_hf_config); layout per layers/quantization/"
               "w4afp8.py:W4AFp8Config.from_config")
_SRC_GLM5_FLASH = ("sglang 0.5.23 configs/glm5_next.py:Glm5NextTextConfig and models/"
                   "glm5_next.py (swiglu_limit 10.0, E=288/top-8 for GLM-5.3-Flash)")
_SRC_MIXED_CODE = ("sglang 0.5.23 layers/quantization/modelopt_quant.py:"
                   "ModelOptMixedPrecisionConfig.from_config")

# --- Quantization declarations ---
_EXCLUDE = ["lm_head", "model.layers.0.self_attn*", "model.layers.*.mlp.gate"]
_MODELOPT_PRODUCER = {"name": "modelopt", "version": "0.37.0"}
_FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": [128, 128]}
_FP4_ARGS = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
             "symmetric": True, "dynamic": False}


def _modelopt_nvfp4(exclude: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """ModelOpt NVFP4 (config.json's flat ``quantization_config``, hf_quant_config.json)."""
    flat = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
            "kv_cache_quant_algo": None, "exclude_modules": list(exclude)}
    nested = {"producer": dict(_MODELOPT_PRODUCER),
              "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                               "group_size": 16, "exclude_modules": list(exclude)}}
    return flat, nested


def _modelopt_mixed(prefix: str, layers: int, experts: int, expert_algo: str,
                    attention_algo: str | None, moe_from: int = 0,
                    kv_cache: str | None = "FP8") -> tuple[dict[str, Any], dict[str, Any]]:
    """ModelOpt ``MIXED_PRECISION``: per-module ``quantized_layers`` (the format
    ``ModelOptMixedPrecisionConfig.from_config`` reads, sglang 0.5.16-0.5.23): every routed
    expert projection ``expert_algo`` (``NVFP4`` or ``W4A16_NVFP4``, group 16), the attention
    projections ``attention_algo`` (``FP8``) or left out (bf16)."""
    quantized: dict[str, dict[str, Any]] = {}
    for layer in range(layers):
        if attention_algo is not None:
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                quantized[f"{prefix}.layers.{layer}.self_attn.{proj}"] = {
                    "quant_algo": attention_algo}
        if layer < moe_from:
            continue
        for expert in range(experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                quantized[f"{prefix}.layers.{layer}.mlp.experts.{expert}.{proj}"] = {
                    "quant_algo": expert_algo, "group_size": 16}
    exclude = ["lm_head", f"{prefix}.layers.*.mlp.gate", f"{prefix}.layers.*.mlp.shared_expert*"]
    flat = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": kv_cache, "exclude_modules": exclude,
            "quantized_layers": quantized}
    nested = {"producer": dict(_MODELOPT_PRODUCER),
              "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": kv_cache,
                               "exclude_modules": exclude, "quantized_layers": quantized}}
    return flat, nested


def _ct_nvfp4(ignore: list[str]) -> dict[str, Any]:
    """compressed-tensors NVFP4 as llm-compressor writes it (``nvfp4-pack-quantized``)."""
    return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": dict(_FP4_ARGS),
                                          "input_activations": {**_FP4_ARGS,
                                                                "dynamic": "local"},
                                          "output_activations": None, "format":
                                              "nvfp4-pack-quantized"}},
            "ignore": list(ignore), "quantization_status": "compressed",
            "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {},
            "global_compression_ratio": None}


# --- Architectures (shrunk) ---
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
_V3_COPIED = ("architectures", "model_type", "n_routed_experts", "num_experts_per_tok",
              "n_group", "topk_group", "n_shared_experts", "topk_method", "scoring_func",
              "routed_scaling_factor", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim")
_DEEPSEEK_V32 = {**_DEEPSEEK_V3, "architectures": ["DeepseekV32ForCausalLM"],
                 "model_type": "deepseek_v32", "index_topk": 64, "index_n_heads": 8,
                 "index_head_dim": 128}
_V32_COPIED = (*_V3_COPIED, "index_n_heads", "index_head_dim")
# GLM-5 (GlmMoeDsaForCausalLM): the DSA shape under GLM's architecture name; the V3.2
# model_type loads it (as builder/behaviour/script/tiny_models.py does).
_GLM5_DSA = {**_DEEPSEEK_V32, "architectures": ["GlmMoeDsaForCausalLM"]}
_QWEN3_MOE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 1024,
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 4096,
    "rope_theta": 1000000, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "torch_dtype": "bfloat16", "tie_word_embeddings": False, "bos_token_id": 0,
    "eos_token_id": 1}
_QWEN3_COPIED = ("architectures", "model_type", "norm_topk_prob", "decoder_sparse_step",
                 "hidden_act")
# Qwen3.5/3.6 MoE (hybrid Gated-DeltaNet + full attention, vision wrapper): text settings in
# text_config; sglang configs/qwen3_5.py:Qwen3_5MoeConfig.
_QWEN35_MOE: dict[str, Any] = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
    "text_config": {
        "model_type": "qwen3_5_moe_text", "vocab_size": 1024, "hidden_size": 256,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 64, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128,
        "num_experts": 8, "num_experts_per_tok": 2, "full_attention_interval": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                        "full_attention"],
        "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 32,
        "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "torch_dtype": "bfloat16"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
_GPT_OSS: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 1024,
    "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
    "num_local_experts": 8, "num_experts_per_tok": 4, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"], "attention_bias": True,
    "hidden_act": "silu", "swiglu_limit": 7.0, "rope_theta": 150000,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "initial_context_length": 4096, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "eos_token_id": 1, "pad_token_id": 0}
_GPT_OSS_COPIED = ("architectures", "model_type", "swiglu_limit", "hidden_act",
                   "num_experts_per_tok", "sliding_window", "attention_bias", "rope_theta",
                   "rope_scaling")
_MXFP4 = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                     "model.embed_tokens", "lm_head"],
          "quant_method": "mxfp4"}
# Step-3.5-Flash: per-layer swiglu_limits (non-zero, 7.0, on the last MoE layers only).
_STEP3P5: dict[str, Any] = {
    "architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5", "vocab_size": 1024,
    "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8,
    "num_attention_groups": 2, "head_dim": 32, "num_hidden_layers": 3,
    "moe_layers_enum": "1,2", "moe_num_experts": 8, "moe_top_k": 2,
    "moe_intermediate_size": 128, "share_expert_dims": 128, "norm_expert_weight": True,
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
    "sliding_window": 512, "swiglu_limits": [0.0, 0.0, 7.0],
    "swiglu_limits_shared": [0.0, 0.0, 0.0], "max_position_embeddings": 4096,
    "max_seq_len": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}
# GLM-5.x-Flash (Glm5NextForConditionalGeneration): clamped SwiGLU, swiglu_limit 10.0.
_GLM5_NEXT: dict[str, Any] = {
    "architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
    "text_config": {
        "model_type": "glm5_next_text", "vocab_size": 1024, "hidden_size": 256,
        "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 8, "n_routed_experts": 288,
        "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 1,
        "hidden_act": "silu", "swiglu_limit": 10.0, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"},
    "torch_dtype": "bfloat16"}
# DeepSeek-V4 (sglang configs/deepseek_v4.py:DeepSeekV4Config supplies the rest).
_DEEPSEEK_V4: dict[str, Any] = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 1024, "hidden_size": 256, "num_hidden_layers": 2, "moe_intermediate_size": 128,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 8,
    "topk_group": 8, "scoring_func": "sqrtsoftplus", "expert_dtype": "fp4",
    "compress_ratios": [4, 4], "sliding_window": 128, "head_dim": 512,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 448, "num_attention_heads": 16,
    "num_key_value_heads": 1, "q_lora_rank": 128, "o_lora_rank": 128, "o_groups": 1,
    "index_topk": 64, "index_n_heads": 8, "index_head_dim": 128, "hc_mult": 4,
    "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "num_hash_layers": 0,
    "rope_theta": 10000, "compress_rope_theta": 160000, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16"}
_DSV4_HYBRID = {"quant_algo": "MIXED_PRECISION", "quant_method": "fp8",
                "moe_quant_algo": "NVFP4", "expert_dtype": "fp4", "group_size": 16,
                "scale_fmt": "ue8m0", "weight_block_size": [32, 32],
                "kv_cache_quant_algo": None,
                "config_groups": {"group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 4, "type": "float", "group_size": 16,
                                "dynamic": False},
                    "input_activations": {"num_bits": 4, "type": "float", "group_size": 16,
                                          "dynamic": False}}},
                "ignore": ["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"],
                "activation_scheme": "dynamic",
                "producer": {"name": "modelopt", "version": "dsv4-nvfp4-experts"}}
_MINIMAX_M3: dict[str, Any] = {
    "architectures": ["MiniMaxM3SparseForCausalLM"], "model_type": "minimax_m2",
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
    "num_local_experts": 8, "num_experts_per_tok": 2, "torch_dtype": "bfloat16"}


@dataclass(frozen=True)
class Form:
    """One checkpoint form of the zoo.

    ``expected`` maps a release (``"0.5.16"``...) or ``"*"`` to the quantization name that
    release's ``ModelConfig`` reads (``None``: unquantized); ``moe_meta`` says whether
    ``ModelConfig.nvfp4_moe_meta`` is set (DeepSeek-V4 hybrid NVFP4)."""

    name: str
    stands_for: str
    source: str
    family: str
    config: dict[str, Any]
    hf_quant_config: dict[str, Any] | None
    copied: tuple[str, ...]
    clamp: bool
    releases: str
    buildable: bool = True
    why: str = ""
    expected: dict[str, str | None] = field(default_factory=dict)
    moe_meta: bool = False

    def expected_quantization(self, release: str) -> str | None:
        """The quantization ``release``'s ``ModelConfig`` should read from this form.

        Args:
            release: an SGLang version, e.g. ``"0.5.20"``.
        Returns:
            the quantization name, or None for an unquantized form.
        """
        return self.expected.get(release, self.expected.get("*"))

    def in_release(self, release: str) -> bool:
        """Whether ``release`` registers this form's architecture (``releases``, a PEP 440
        specifier of ``>=``/``<``/``==`` clauses joined by commas; standard library only).

        Args:
            release: an SGLang version, e.g. ``"0.5.20"``.
        Returns:
            True when every clause holds.
        """
        return all(_holds(clause.strip(), release) for clause in self.releases.split(","))


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


def _holds(clause: str, release: str) -> bool:
    for operator in (">=", "<=", "==", "<", ">"):
        if clause.startswith(operator):
            have, want = _version_key(release), _version_key(clause[len(operator):].strip())
            return {">=": have >= want, "<=": have <= want, "==": have == want,
                    "<": have < want, ">": have > want}[operator]
    raise ValueError(f"unsupported release clause {clause!r}")


def _with(base: dict[str, Any], quant: dict[str, Any] | None = None,
          **changes: Any) -> dict[str, Any]:
    config = copy.deepcopy(base)
    config.update(copy.deepcopy(changes))
    if quant is not None:
        config["quantization_config"] = copy.deepcopy(quant)
    return config


_NV_DS = _modelopt_nvfp4(_EXCLUDE)
_NV_DS_BF16_SHARED = _modelopt_nvfp4([*_EXCLUDE, "model.layers.*.mlp.shared_experts*"])
_NV_QWEN = _modelopt_nvfp4(["lm_head", "model.layers.*.mlp.gate"])
_NV_GPT_OSS = _modelopt_nvfp4(["lm_head"])
_NV_STEP = _modelopt_nvfp4(["lm_head", "model.layers.*.moe.gate*"])
_NV_GLM5_NEXT = _modelopt_nvfp4(["lm_head", "model.language_model.layers.*.mlp.gate",
                                 "model.visual*"])
_MIXED_Q36 = _modelopt_mixed("model.language_model", 4, 8, "NVFP4", "FP8")
_MIXED_Q36_W4A16 = _modelopt_mixed("model.language_model", 4, 8, "W4A16_NVFP4", None,
                                   kv_cache=None)
_MIXED_QWEN3 = _modelopt_mixed("model", 2, 8, "NVFP4", "FP8")
_MIXED_M3 = _modelopt_mixed("model", 2, 8, "NVFP4", "FP8")
_MODELOPT_Q = ("quantization_config.quant_method", "quantization_config.quant_algo",
               "quantization_config.group_size", "hf_quant_config.quantization.quant_algo",
               "hf_quant_config.quantization.group_size")
_MIXED_Q = ("quantization_config.quant_algo", "hf_quant_config.quantization.quant_algo",
            "quantized_layers[*].quant_algo", "quantized_layers[*].group_size",
            "kv_cache_quant_algo")
_FP8_Q = ("quantization_config.quant_method", "quantization_config.fmt",
          "quantization_config.activation_scheme", "quantization_config.weight_block_size")
_ALL = ">=0.5.16"
_W4AFP8 = {"producer": {"name": "modelopt", "version": "0.27.0"},
           "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
                            "quantized_layers": {}}}

FORMS: tuple[Form, ...] = (
    # ModelOpt NVFP4
    Form("deepseek-r1-0528-nvfp4", "nvidia/DeepSeek-R1-0528-FP4", _SRC_R1_NVFP4, "nvfp4",
         _with(_DEEPSEEK_V3, _NV_DS[0]), _NV_DS[1], (*_V3_COPIED, *_MODELOPT_Q), False, _ALL,
         expected={"*": "modelopt_fp4"}),
    Form("deepseek-v3-0324-nvfp4-bf16-shared", "nvidia/DeepSeek-V3-0324-FP4", _SRC_V3_NVFP4,
         "nvfp4", _with(_DEEPSEEK_V3, _NV_DS_BF16_SHARED[0]), _NV_DS_BF16_SHARED[1],
         (*_V3_COPIED, *_MODELOPT_Q), False, _ALL,
         why="shared experts excluded (kept bf16) as ModelOpt exports of GLM-5.x do; the "
             "public V3-0324 export quantizes them",
         expected={"*": "modelopt_fp4"}),
    Form("qwen3-235b-a22b-nvfp4", "nvidia/Qwen3-235B-A22B-FP4", _SRC_QWEN3_NVFP4, "nvfp4",
         _with(_QWEN3_MOE, _NV_QWEN[0]), _NV_QWEN[1], (*_QWEN3_COPIED, *_MODELOPT_Q), False,
         _ALL, expected={"*": "modelopt_fp4"}),
    Form("glm-5-nvfp4", "nvidia/GLM-5-NVFP4", _SRC_GLM5 + " (architecture); ModelOpt NVFP4 "
         "export layout as " + _SRC_R1_NVFP4, "nvfp4",
         _with(_GLM5_DSA, _NV_DS_BF16_SHARED[0]), _NV_DS_BF16_SHARED[1],
         (*_V32_COPIED, *_MODELOPT_Q), False, _ALL,
         why="exclude list not read from the public GLM-5 NVFP4 export (ModelOpt's default "
             "layout with bf16 shared experts)",
         expected={"*": "modelopt_fp4"}),
    # ModelOpt MIXED_PRECISION (NVFP4 experts, FP8 attention)
    Form("qwen3.6-35b-a3b-nvfp4-mixed", "nvidia/Qwen3.6-35B-A3B-NVFP4", _SRC_QWEN36_MIXED,
         "nvfp4-mixed", _with(_QWEN35_MOE, _MIXED_Q36[0]), _MIXED_Q36[1],
         ("architectures", "model_type", "text_config.model_type", "layer_types", *_MIXED_Q),
         False, _ALL, expected={"*": "modelopt_mixed"}),
    Form("qwen3.5-397b-a17b-nvfp4-mixed", "nvidia/Qwen3.5-397B-A17B-NVFP4", _SRC_QWEN36_MIXED,
         "nvfp4-mixed", _with(_QWEN35_MOE, _MIXED_Q36[0]), _MIXED_Q36[1],
         ("architectures", "model_type", "text_config.model_type", "layer_types", *_MIXED_Q),
         False, _ALL, why="same export layout as the Qwen3.6 form (one ModelOpt recipe)",
         expected={"*": "modelopt_mixed"}),
    Form("qwen3-30b-a3b-nvfp4-mixed", "nvidia/Qwen3-30B-A3B-NVFP4", _SRC_MIXED_CODE,
         "nvfp4-mixed", _with(_QWEN3_MOE, _MIXED_QWEN3[0]), _MIXED_QWEN3[1],
         (*_QWEN3_COPIED, *_MIXED_Q), False, _ALL,
         why="the MIXED_PRECISION layout on the Qwen3 MoE class (no FP8-attention "
             "checkpoint of this size read)", expected={"*": "modelopt_mixed"}),
    Form("minimax-m3-nvfp4-mixed", "nvidia/MiniMax-M3-NVFP4", _SRC_MIXED_CODE, "nvfp4-mixed",
         _with(_MINIMAX_M3, _MIXED_M3[0]), _MIXED_M3[1], ("architectures", *_MIXED_Q), False,
         _ALL, why="MiniMax-M3 public config not read: architecture from sglang models/"
                   "minimax_m3.py EntryClass, quantization per the MIXED_PRECISION layout",
         expected={"*": "modelopt_mixed"}),
    Form("qwen3.6-35b-a3b-w4a16-nvfp4-mixed", "(W4A16_NVFP4 experts on Qwen3.6-35B-A3B)",
         _SRC_MIXED_CODE, "w4a16-nvfp4-mixed", _with(_QWEN35_MOE, _MIXED_Q36_W4A16[0]),
         _MIXED_Q36_W4A16[1], ("architectures", "model_type", *_MIXED_Q), False, _ALL,
         why="no public W4A16_NVFP4 checkpoint read; the form is the one sglang's "
             "ModelOptMixedPrecisionConfig accepts (quant_algo W4A16_NVFP4 per layer)",
         expected={"*": "modelopt_mixed"}),
    # compressed-tensors NVFP4
    Form("qwen3-30b-a3b-ct-nvfp4", "RedHatAI/Qwen3-30B-A3B-NVFP4", _SRC_CT, "ct-nvfp4",
         _with(_QWEN3_MOE, _ct_nvfp4(["lm_head", "re:.*mlp.gate$"])), None,
         (*_QWEN3_COPIED, "quantization_config.format", "quantization_config.config_groups",
          "quantization_config.ignore"), False, _ALL, expected={"*": "compressed-tensors"}),
    Form("deepseek-r1-ct-nvfp4", "RedHatAI/DeepSeek-R1-0528-NVFP4", _SRC_CT + " (layout)",
         "ct-nvfp4", _with(_DEEPSEEK_V3, _ct_nvfp4(["lm_head", "re:.*mlp.gate$"])), None,
         (*_V3_COPIED, "quantization_config.format", "quantization_config.config_groups"),
         False, _ALL, expected={"*": "compressed-tensors"}),
    # clamped SwiGLU NVFP4
    Form("gpt-oss-120b-nvfp4", "Firworks/gpt-oss-120b-nvfp4", _SRC_GPT_OSS_NVFP4 + "; "
         + _SRC_GPT_OSS_120B, "nvfp4-clamp", _with(_GPT_OSS, _NV_GPT_OSS[0]), _NV_GPT_OSS[1],
         (*_GPT_OSS_COPIED, *_MODELOPT_Q), True, _ALL, expected={"*": "modelopt_fp4"}),
    Form("glm-5.3-flash-nvfp4", "(ModelOpt NVFP4 export of GLM-5.3-Flash)", _SRC_GLM5_FLASH,
         "nvfp4-clamp", _with(_GLM5_NEXT, _NV_GLM5_NEXT[0]), _NV_GLM5_NEXT[1],
         ("architectures", "model_type", "text_config.swiglu_limit",
          "text_config.n_routed_experts", "text_config.num_experts_per_tok", *_MODELOPT_Q),
         True, ">=0.5.20",
         why="Glm5Next is registered from 0.5.20; the clamp value and expert geometry are "
             "the ones sglang's glm5_next.py validates, no public config.json read",
         expected={"*": "modelopt_fp4"}),
    Form("step-3.5-flash-nvfp4", "tacos4me/Step-3.5-Flash-NVFP4", _SRC_STEP_NVFP4,
         "nvfp4-clamp", _with(_STEP3P5, _ct_nvfp4(["lm_head", "re:.*moe.gate$"])), None,
         ("architectures", "model_type", "swiglu_limits", "swiglu_limits_shared",
          "quantization_config.format", "quantization_config.ignore"), True, _ALL,
         why="swiglu_limits shrunk to 3 layers (public: 0 except 7.0 on layers 43-44)",
         expected={"*": "compressed-tensors"}),
    Form("step-3.5-flash-modelopt-nvfp4", "apandacoding/step3p5-nvfp4",
         _HF + "apandacoding/step3p5-nvfp4 (model card: ModelOpt 0.41.0 NVFP4, group 16, "
         "exclude lm_head, *.moe.gate*)", "nvfp4-clamp", _with(_STEP3P5, _NV_STEP[0]),
         _NV_STEP[1], ("architectures", "model_type", "swiglu_limits", *_MODELOPT_Q), True,
         _ALL, expected={"*": "modelopt_fp4"}),
    # DeepSeek-V4 hybrid NVFP4
    Form("deepseek-v4-flash-nvfp4", "nvidia/DeepSeek-V4.1-Flash-NVFP4", _SRC_DSV4,
         "dsv4-nvfp4", _with(_DEEPSEEK_V4, _DSV4_HYBRID), None,
         ("architectures", "model_type", "expert_dtype", "scoring_func",
          "quantization_config"), False, _ALL, expected={"*": "fp8"}, moe_meta=True),
    # DSA
    Form("deepseek-v3.2-fp8", "deepseek-ai/DeepSeek-V3.2", _SRC_V32, "dsa-fp8",
         _with(_DEEPSEEK_V32, _FP8_BLOCK), None, (*_V32_COPIED, *_FP8_Q), False, _ALL,
         expected={"*": "fp8"}),
    Form("deepseek-v3.2-bf16", "deepseek-ai/DeepSeek-V3.2 (bf16 re-export)", _SRC_V32,
         "dsa-bf16", _with(_DEEPSEEK_V32), None, _V32_COPIED, False, _ALL,
         why="the public checkpoint is FP8; the bf16 form drops quantization_config",
         expected={"*": None}),
    Form("glm-5-fp8", "zai-org/GLM-5-FP8", _SRC_GLM5, "dsa-fp8", _with(_GLM5_DSA, _FP8_BLOCK),
         None, (*_V32_COPIED, *_FP8_Q), False, _ALL, expected={"*": "fp8"}),
    Form("glm-5-bf16", "zai-org/GLM-5", _SRC_GLM5, "dsa-bf16", _with(_GLM5_DSA), None,
         _V32_COPIED, False, _ALL, expected={"*": None}),
    # FP8 block
    Form("deepseek-v3-fp8", "deepseek-ai/DeepSeek-V3", _SRC_V3, "fp8-block",
         _with(_DEEPSEEK_V3, _FP8_BLOCK), None, (*_V3_COPIED, *_FP8_Q), False, _ALL,
         expected={"*": "fp8"}),
    Form("qwen3-30b-a3b-fp8", "Qwen/Qwen3-30B-A3B-FP8", _SRC_QWEN3_FP8, "fp8-block",
         _with(_QWEN3_MOE, _FP8_BLOCK), None, (*_QWEN3_COPIED, *_FP8_Q), False, _ALL,
         expected={"*": "fp8"}),
    # MXFP4
    Form("gpt-oss-20b-mxfp4", "openai/gpt-oss-20b", _SRC_GPT_OSS_20B, "mxfp4",
         _with(_GPT_OSS, _MXFP4), None, (*_GPT_OSS_COPIED, "quantization_config"), True, _ALL,
         expected={"*": "mxfp4"}),
    Form("gpt-oss-120b-mxfp4", "openai/gpt-oss-120b", _SRC_GPT_OSS_120B, "mxfp4",
         _with(_GPT_OSS, _MXFP4, num_hidden_layers=2), None,
         (*_GPT_OSS_COPIED, "quantization_config"), True, _ALL, expected={"*": "mxfp4"}),
    # W4A8
    Form("deepseek-r1-w4afp8", "Barrrrry/DeepSeek-R1-W4AFP8", _SRC_W4AFP8, "w4afp8",
         _with(_DEEPSEEK_V3), _W4AFP8, (*_V3_COPIED, "hf_quant_config.quantization.quant_algo"),
         False, _ALL,
         why="hf_quant_config.json only (no quantization_config in config.json), "
             "MIXED_PRECISION without NVFP4 layers",
         expected={"*": "w4afp8"}),
    # bf16
    Form("qwen3-30b-a3b-bf16", "Qwen/Qwen3-30B-A3B", _SRC_QWEN3, "bf16", _with(_QWEN3_MOE),
         None, _QWEN3_COPIED, False, _ALL, expected={"*": None}),
    Form("deepseek-v3-bf16", "deepseek-ai/DeepSeek-V3 (bf16 re-export)", _SRC_V3, "bf16",
         _with(_DEEPSEEK_V3), None, _V3_COPIED, False, _ALL,
         why="the public checkpoint is FP8; the bf16 form drops quantization_config",
         expected={"*": None}),
    Form("gpt-oss-20b-bf16", "unsloth/gpt-oss-20b-BF16", _SRC_GPT_OSS_20B, "bf16",
         _with(_GPT_OSS), None, _GPT_OSS_COPIED, True, _ALL, expected={"*": None}),
)

BY_NAME: dict[str, Form] = {form.name: form for form in FORMS}


def write(form: Form, root: Path) -> Path:
    """Write ``form`` as ``root/<name>/config.json`` (and ``hf_quant_config.json`` when it has
    one), rewriting a file only when its text changed, and return the folder.

    Args:
        form: the zoo form.
        root: the zoo's folder (created when missing).
    Returns:
        the form's folder.
    Raises:
        ValueError: the form is not buildable.
    """
    if not form.buildable:
        raise ValueError(f"zoo form {form.name} is not buildable: {form.why}")
    folder = root / form.name
    folder.mkdir(parents=True, exist_ok=True)
    files = {"config.json": json.dumps(form.config, indent=1, sort_keys=True)}
    if form.hf_quant_config is not None:
        files["hf_quant_config.json"] = json.dumps(form.hf_quant_config, indent=1,
                                                   sort_keys=True)
    stale = folder / "hf_quant_config.json"
    if "hf_quant_config.json" not in files and stale.exists():
        stale.unlink()
    for file_name, text in files.items():
        path = folder / file_name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return folder


def _release_version() -> str:
    from importlib.metadata import version

    return version("sglang")


def _read(folder: Path) -> tuple[str | None, bool]:
    """The quantization and whether ``nvfp4_moe_meta`` is set, as this release's
    ``ModelConfig`` (built through ``ServerArgs``) reads ``folder``.

    Raises:
        LookupError: the release does not register the form's architecture
            (``models/registry.py:ModelRegistry.get_supported_archs``).
    """
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.models.registry import ModelRegistry

    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    if architecture not in ModelRegistry.get_supported_archs():
        raise LookupError(f"{architecture} is not registered")
    from sglang.srt.server_args import ServerArgs

    server = ServerArgs(model_path=str(folder), skip_tokenizer_init=True)
    if hasattr(server, "resolve_once"):  # 0.5.23: resolution is a pass of its own
        server.resolve_once()
    config = ModelConfig.from_server_args(server)
    return config.quantization, getattr(config, "nvfp4_moe_meta", None) is not None


def _standins() -> dict[str, str]:
    """The compiled packages to stand in for, at the versions this release pins (as
    ``builder/behaviour/env.py`` does: ``STANDINS``, ``STANDINS_FROM``)."""
    import re
    from importlib.metadata import requires
    from importlib.util import find_spec

    wanted = {"sgl_kernel": "sglang-kernel", "deep_gemm": "sgl-deep-gemm"}
    pins: dict[str, str] = {}
    for text in requires("sglang") or []:
        match = re.match(r"([A-Za-z0-9_.-]+)\s*==\s*([\w.+!-]+)", text)
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return {name: pins.get(dist, "0+standin") for name, dist in wanted.items()
            if find_spec(name) is None}


def check(root: Path, only: tuple[str, ...] = ()) -> int:
    """Write every buildable form under ``root`` and compare what this release reads.

    Args:
        root: a scratch folder.
        only: the names of the forms to check (all when empty).
    Returns:
        the number of forms whose quantization (or nvfp4_moe_meta) differs or that fail to
        load; each line printed names the form and what was read.
    """
    import logging
    import warnings

    import sm120_device
    import standins

    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    sm120_device.install()
    standins.install(_standins())
    release = _release_version()
    base = ".".join(release.split(".")[:3])
    bad = 0
    for form in FORMS:
        if only and form.name not in only:
            continue
        if not form.buildable:
            print(f"SKIP {form.name}: {form.why}")
            continue
        if not form.in_release(base):
            # The release must not read it either: a form outside its releases that loads
            # means ``releases`` is wrong.
            try:
                _read(write(form, root))
            except Exception as error:  # any refusal is the expected outcome
                print(f"ok   {form.name}: not in {base} ({type(error).__name__})")
            else:
                print(f"BAD  {form.name}: {base} reads it but releases is {form.releases}")
                bad += 1
            continue
        try:
            quantization, meta = _read(write(form, root))
        except Exception as error:  # report every form, not the first failure
            first = str(error).splitlines()[0][:160] if str(error) else ""
            print(f"FAIL {form.name} ({form.releases}): {type(error).__name__}: {first}")
            bad += 1
            continue
        want = form.expected_quantization(base)
        ok = quantization == want and meta == form.moe_meta
        bad += not ok
        print(f"{'ok  ' if ok else 'BAD '} {form.name}: quantization={quantization} "
              f"(expected {want}) nvfp4_moe_meta={meta}")
    return bad


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "check":
        sys.exit("usage: zoo_forms.py check DIR [FORM...]")
    sys.exit(1 if check(Path(sys.argv[2]), tuple(sys.argv[3:])) else 0)
