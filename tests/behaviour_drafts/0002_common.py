"""Shared helpers for the 0002 behaviour drafts (issue 24). Everything they call is the release's
own code; this module only writes tiny HF configs and replays the scheduler's init sequence.

Run a draft as:  SM120_STANDINS=sgl_kernel=<pin> PYTHONPATH=[<patched tree>:]<standins>:<this dir> \
                 <release venv>/bin/python tests/behaviour_drafts/0002_<name>.py
(standins: /work/scratch/i24/standins: fake SM120 torch.cuda queries, sgl_kernel, torchvision op schemas;
SM120_CC=12.0|12.1|10.0|9.0 sets the reported capability.)"""
import json, logging, os, sys, tempfile, warnings
logging.basicConfig(level=os.environ.get("SM120_LOGLEVEL", "ERROR"))
warnings.filterwarnings("ignore")
import torch
import sglang

_NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
          "exclude_modules": ["lm_head", "model.layers.0.self_attn*", "model.layers.*.mlp.gate"]}
_G = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True, "dynamic": False}
QUANT = {
    "nvfp4": _NVFP4,                                   # ModelOpt NVFP4 declared in config.json (+ hf_quant_config.json)
    "ctnvfp4": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": _G,
                                              "input_activations": dict(_G, dynamic="local"), "output_activations": None}},
                "ignore": ["lm_head", "re:.*mlp.gate$"], "quantization_status": "compressed"},
    "fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    "bf16": None,
}
_QWEN3MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 1024, "hidden_size": 256,
             "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
             "num_key_value_heads": 4, "head_dim": 32, "num_experts": 16, "num_experts_per_tok": 2, "norm_topk_prob": True,
             "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 4096, "rope_theta": 1000000,
             "rms_norm_eps": 1e-06, "hidden_act": "silu", "torch_dtype": "bfloat16", "tie_word_embeddings": False,
             "bos_token_id": 0, "eos_token_id": 1}
_DSV3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 1024, "hidden_size": 256,
         "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
         "num_key_value_heads": 8, "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 2,
         "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5,
         "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "kv_lora_rank": 64,
         "q_lora_rank": 96, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
         "max_position_embeddings": 4096, "rope_theta": 10000, "rms_norm_eps": 1e-06, "hidden_act": "silu",
         "torch_dtype": "bfloat16", "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1}
MODELS = {"qwen3moe": _QWEN3MOE, "dsv3": _DSV3}
_ROOT = tempfile.mkdtemp(prefix="sm120-0002-")

def model_dir(family, quant):
    d = os.path.join(_ROOT, f"{family}-{quant}")
    if not os.path.isdir(d):
        os.makedirs(d)
        cfg = dict(MODELS[family])
        if QUANT[quant] is not None:
            cfg["quantization_config"] = QUANT[quant]
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
        if quant == "nvfp4":   # what ModelOpt exports write next to config.json
            q = {k: v for k, v in _NVFP4.items() if k != "quant_method"}
            json.dump({"producer": {"name": "modelopt", "version": "0.37.0"}, "quantization": q},
                      open(os.path.join(d, "hf_quant_config.json"), "w"), indent=1)
    return d

def tree():
    return "patched" if "patched" in os.path.dirname(sglang.__file__) else "upstream"

def server_args(path, **kw):
    from sglang.srt.server_args import ServerArgs
    kw.setdefault("skip_tokenizer_init", True)
    sa = ServerArgs(model_path=path, **kw)        # up to 0.5.18: __post_init__ resolves
    if hasattr(sa, "resolve_once"):                 # 0.5.19+: the resolution pipeline is a separate pass
        sa.resolve_once()
    return sa

def scheduler_init(sa, rank=0):
    """The scheduler's init sequence before model load (0.5.16: set_global_server_args_for_scheduler +
    initialize_*_config(server_args); 0.5.23: runtime_context.publish + initialize_*_config())."""
    import sglang.srt.runtime_context as rc
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    if hasattr(rc, "publish"):
        rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=rank, dp_rank=None, gpu_id=rank))
        initialize_moe_config(); initialize_fp8_gemm_config(); initialize_fp4_gemm_config()
    else:
        from sglang.srt.server_args import set_global_server_args_for_scheduler
        set_global_server_args_for_scheduler(sa)
        initialize_moe_config(sa); initialize_fp8_gemm_config(sa); initialize_fp4_gemm_config(sa)

def published_moe_runner_backend():
    import sglang.srt.runtime_context as rc
    if not hasattr(rc, "get_exec"):
        return None
    return getattr(rc.get_exec().moe, "moe_runner_backend", None)

def model_config(sa):
    if hasattr(sa, "get_model_config"):
        return sa.get_model_config()
    from sglang.srt.arg_groups.overrides import model_config_of
    return model_config_of(sa)

def emit(record):
    print("RESULT " + json.dumps(record, sort_keys=True, default=str), flush=True)
