"""0003 behaviour: the release's own DSA resolution on SM120 (capability (12, 0); SM120_CC=12.1 for
(12, 1)), DeepSeek-V3.2-style tiny config (DeepseekV32ForCausalLM + index_topk), TP 1/2/4/8,
--kv-cache-dtype auto / bfloat16 / fp8_e4m3, no DSA backend flags.
Reads ServerArgs.kv_cache_dtype / dsa_prefill_backend / dsa_decode_backend after the release's
resolution (0.5.16: ServerArgs.__post_init__; 0.5.23: resolve_once), or the error it raises.
  PYTHONPATH=[PATCHED:]/work/scratch/i24/standins:/work/scratch/i24 SM120_STANDINS=sgl_kernel=0.4.5 \
      VENV/bin/python 0003_dsa_resolution.py
Expected on SM12x: upstream -> trtllm / flashmla_sparse (no SM12x kernels); patched -> tilelang
for every case that is served, bf16 KV for auto on 0.5.16 (FP8 on 0.5.23, its CUDA FP8 path), and a
start-up ValueError for an explicit fp8_e4m3 on 0.5.16."""
from sm120_harness import server_args, emit, banner
banner("0003 DSA resolution")
for model in ("dsv32-bf16",):
    for tp in (1, 2, 4, 8):
        for kv in ("auto", "bfloat16", "fp8_e4m3"):
            try:
                sa = server_args(model, tp_size=tp, kv_cache_dtype=kv)
                rec = dict(kv_cache_dtype=sa.kv_cache_dtype, prefill=sa.dsa_prefill_backend,
                           decode=sa.dsa_decode_backend)
            except Exception as e:
                rec = dict(error=f"{type(e).__name__}: {e}"[:200])
            emit(dict(check="0003-resolution", model=model, tp=tp, kv_flag=kv, **rec))
