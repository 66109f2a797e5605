"""Helpers shared by the 0004/0005 behaviour drafts (imported by module name, it starts with a digit) (after /work/scratch/i24/sm120_harness.py).

Run a draft as  SM120_STANDINS=sgl_kernel=<pin> SM120_CC=12.0 \
  PYTHONPATH=<patched sglang or nothing>:<i24 standins>:<this folder> VENV/bin/python 000X_*.py
Only the harness's stand-ins are used (fake SM12x device queries, stood-in sgl_kernel .so);
every decision is the release's own code."""
import copy, json, logging, os, sys, tempfile, warnings, importlib.metadata as md
logging.basicConfig(level=os.environ.get("SM120_LOGLEVEL", "ERROR"))
warnings.filterwarnings("ignore")
import torch
import sglang

MODELS = tempfile.mkdtemp(prefix="sm12x-models-")
DSV3 = {
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
  "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 16,
  "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
  "routed_scaling_factor": 2.5, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
  "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 384,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "max_position_embeddings": 4096, "rope_theta": 10000, "rms_norm_eps": 1e-6, "hidden_act": "silu",
  "torch_dtype": "bfloat16", "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
}
# ModelOpt NVFP4 exclude lists: GLM-5.2-NVFP4 style keeps the shared experts BF16.
EXCL_UNIFORM = ["lm_head", "model.layers.0.self_attn*", "model.layers.*.mlp.gate"]
EXCL_BF16_SHARED = EXCL_UNIFORM + ["model.layers.*.mlp.shared_experts*"]

def write_model(name, cfg, exclude=None):
    d = os.path.join(MODELS, name); os.makedirs(d, exist_ok=True)
    cfg = copy.deepcopy(cfg)
    if exclude is not None:
        cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                      "kv_cache_quant_algo": None, "exclude_modules": exclude}
        json.dump({"producer": {"name": "modelopt", "version": "0.37.0"},
                   "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                                    "exclude_modules": exclude}}, open(os.path.join(d, "hf_quant_config.json"), "w"))
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    return d

def banner(title):
    src = os.path.dirname(sglang.__file__)
    print(f"# {title}: sglang {md.version('sglang')} code at {src}; torch {torch.__version__} cuda={torch.version.cuda}; "
          f"device cc={torch.cuda.get_device_capability()}", flush=True)

def server_args(path, **kw):
    from sglang.srt.server_args import ServerArgs
    kw.setdefault("skip_tokenizer_init", True)
    sa = ServerArgs(model_path=path, **kw)
    if hasattr(sa, "resolve_once"):
        sa.resolve_once()
    return sa

def scheduler_init(sa, rank=0):
    """What the scheduler process does with the server args before the model is built."""
    import sglang.srt.runtime_context as rc
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    if hasattr(rc, "publish"):
        if hasattr(rc, "SpawnRanks"):   # 0.5.23: run_scheduler_process publishes with the spawn ranks
            rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=rank, dp_rank=None, gpu_id=rank))
        else:                           # 0.5.20: publish(server_args, role="scheduler")
            rc.publish(sa, role="scheduler")
        initialize_moe_config(); initialize_fp8_gemm_config(); initialize_fp4_gemm_config()
    else:
        from sglang.srt.server_args import set_global_server_args_for_scheduler
        set_global_server_args_for_scheduler(sa)
        initialize_moe_config(sa); initialize_fp8_gemm_config(sa); initialize_fp4_gemm_config(sa)

def emit(rec):
    print("RESULT " + json.dumps(rec, sort_keys=True, default=str), flush=True)
