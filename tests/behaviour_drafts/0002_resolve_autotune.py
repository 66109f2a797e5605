"""0002 behaviour draft: the server-level MoE runner resolution and the autotune decision.

For each checkpoint (tiny Qwen3-MoE / DeepSeek-V3 configs: ModelOpt NVFP4 declared by the checkpoint,
compressed-tensors NVFP4, FP8, bf16), TP/EP, --quantization, --moe-runner-backend and --fp4-gemm-backend:
  * ServerArgs(...) resolved by the release (0.5.16: __post_init__; 0.5.23: resolve_once), then the
    scheduler's init sequence; read: server_args.moe_runner_backend, the published value (0.5.23
    runtime_context.get_exec().moe.moe_runner_backend), layers.moe.get_moe_runner_backend() (the one global
    value the dispatcher / FP4 all-gather / create_moe_runner read), ModelConfig.quantization;
  * model_executor.runner.flashinfer_autotune.should_run_flashinfer_autotune(view) where the view carries
    only device, server_args, model_config, spec_algorithm, is_draft_worker, model (a real ModelRunner
    needs weights on a GPU);
  * ModelOptNvFp4FusedMoEMethod.create_moe_runner (the per-layer choice) for ModelOpt NVFP4 checkpoints.
The capability comes from SM120_CC (12.0 default, 12.1, 10.0, 9.0); SM120_SET=full|short picks the matrix.
"""
import importlib, itertools, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
C = importlib.import_module("0002_common")
torch = C.torch
from sglang.srt.layers.moe import get_moe_runner_backend
from sglang.srt.model_executor.runner.flashinfer_autotune import should_run_flashinfer_autotune
try:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
except ImportError:
    SpeculativeAlgorithm = None

class RunnerView:
    def __init__(self, **kw): self.__dict__["_v"] = kw
    def __getattr__(self, n):
        if n in self._v: return self._v[n]
        raise AttributeError(f"ModelRunner view has no {n!r}")

def layer_backend(sa):
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config, ModelOptNvFp4FusedMoEMethod
    qc = ModelOptFp4Config.from_config({"quantization": {k: v for k, v in C.QUANT["nvfp4"].items() if k != "quant_method"}})
    meth = ModelOptNvFp4FusedMoEMethod(qc)
    cfg = MoeRunnerConfig(num_experts=16, num_local_experts=16, hidden_size=256, intermediate_size_per_partition=64,
                          layer_id=1, top_k=2, num_fused_shared_experts=0, params_dtype=torch.bfloat16)
    try: meth.create_moe_runner(torch.nn.Module(), cfg)
    except Exception: pass          # the choice is stored before MoeRunner is built
    b = getattr(meth, "_moe_runner_backend", None)
    return getattr(b, "value", b)

cc = torch.cuda.get_device_capability()
full = os.environ.get("SM120_SET", "full") == "full"
models = [("qwen3moe", "nvfp4"), ("dsv3", "nvfp4"), ("qwen3moe", "ctnvfp4"), ("qwen3moe", "fp8"), ("qwen3moe", "bf16")]
par = [(1, 1), (2, 1), (2, 2), (4, 4), (8, 1), (8, 8)] if full else [(2, 2), (8, 8)]
quants = [None, "modelopt_fp4"]
moes = ["auto", "flashinfer_cutlass", "triton"] if full else ["auto", "flashinfer_cutlass"]
fp4s = ["auto", "flashinfer_cudnn", "flashinfer_cutlass"] if full else ["auto", "flashinfer_cudnn"]
for (fam, q), (tp, ep), cliq, moe, fp4 in itertools.product(models, par, quants, moes, fp4s):
    if cliq == "modelopt_fp4" and q != "nvfp4":
        continue
    if (tp, ep) not in ((2, 2), (8, 8)) and (moe, fp4) != ("auto", "auto"):
        continue       # the flag matrix at EP = TP; other widths for the defaults
    rec = dict(check="0002-resolve", tree=C.tree(), cc=cc, model=f"{fam}-{q}", tp=tp, ep=ep, quantization_flag=cliq,
               moe_flag=moe, fp4_flag=fp4)
    try:
        sa = C.server_args(C.model_dir(fam, q), tp_size=tp, ep_size=ep, quantization=cliq,
                           moe_runner_backend=moe, fp4_gemm_runner_backend=fp4)
        C.scheduler_init(sa)
        mc = C.model_config(sa)
        spec = SpeculativeAlgorithm.from_string(getattr(sa, "speculative_algorithm", None)) if SpeculativeAlgorithm else None
        view = RunnerView(device="cuda", server_args=sa, model_config=mc, spec_algorithm=spec,
                          is_draft_worker=False, model=torch.nn.Module())
        rec.update(server_moe_runner_backend=sa.moe_runner_backend, published=C.published_moe_runner_backend(),
                   global_backend=get_moe_runner_backend().value, server_quantization=sa.quantization,
                   model_config_quantization=mc.quantization,
                   autotune=should_run_flashinfer_autotune(view),
                   layer=layer_backend(sa) if q == "nvfp4" else None)
    except BaseException as e:      # an assert or ValueError in the resolution is a result too
        rec.update(error=f"{type(e).__name__}: {str(e)[:160]}")
    C.emit(rec)
