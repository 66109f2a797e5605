"""0005: which FP4 dense GEMM backend does the release resolve, and does it run FlashInfer autotune for it?

Called, after real ServerArgs and the scheduler's initialisers (initialize_fp4_gemm_config is the
resolution under test): fp4_utils.get_fp4_gemm_runner_backend() -> .value and
.get_flashinfer_backend() (the backend string fp4_gemm passes to flashinfer.mm_fp4);
model_executor/runner/flashinfer_autotune.should_run_flashinfer_autotune(runner) with a ModelRunner
stand-in carrying only what it reads (device, server_args, model_config, spec_algorithm,
is_draft_worker, model), as /work/scratch/i24/check_c_autotune.py does; FlashInfer's
_b12x_gemm_fp4_requirement gate (its supported compute capabilities) read from the pinned wheel.
--quantization modelopt_fp4 so model_config.quantization is the FP4 one.
Expected: patched, cc (12,0) and CUDA 13: auto -> flashinfer_b12x -> mm_fp4 backend 'b12x',
autotune True; cc (12,1) and (10,0): as upstream; explicit backends: as upstream."""
from importlib import import_module; globals().update({k: v for k, v in vars(import_module("0004_0005_common")).items() if not k.startswith("__")})
banner("0005 fp4 gemm b12x")
from sglang.srt.layers.quantization.fp4_utils import get_fp4_gemm_runner_backend
from sglang.srt.model_executor.runner.flashinfer_autotune import should_run_flashinfer_autotune
try:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
except ImportError:
    SpeculativeAlgorithm = None
try:
    import flashinfer.gemm.gemm_base as gb
    req = getattr(gb, "_b12x_gemm_fp4_requirement", None)
    fi = dict(flashinfer=md.version("flashinfer-python"),
              b12x_supported_cc=sorted(getattr(req, "_supported_ccs", None) or []) if req else None)
except Exception as e:
    fi = dict(flashinfer_error=f"{type(e).__name__}: {e}"[:200])
emit(dict(check="0005-flashinfer", **fi))

class RunnerView:
    def __init__(self, **kw): self.__dict__["_v"] = kw
    def __getattr__(self, n):
        if n in self._v: return self._v[n]
        raise AttributeError(f"ModelRunner stand-in has no {n!r}")

path = write_model("dsv3-nvfp4", DSV3, EXCL_UNIFORM)
for fp4 in ("auto", "flashinfer_cutlass", "flashinfer_cudnn", "flashinfer_cutedsl", "flashinfer_trtllm"):
    for moe in ("auto", "triton"):
        try:
            sa = server_args(path, tp_size=2, quantization="modelopt_fp4", moe_runner_backend=moe,
                             fp4_gemm_runner_backend=fp4)
            scheduler_init(sa)
            mc = sa.get_model_config() if hasattr(sa, "get_model_config") else __import__(
                "sglang.srt.configs.model_config", fromlist=["ModelConfig"]).ModelConfig.from_server_args(sa)
            spec = SpeculativeAlgorithm.from_string(getattr(sa, "speculative_algorithm", None)) if SpeculativeAlgorithm else None
            mr = RunnerView(device="cuda", server_args=sa, model_config=mc, spec_algorithm=spec,
                            is_draft_worker=False, model=torch.nn.Module())
            b = get_fp4_gemm_runner_backend()
            out = dict(fp4_backend=b.value, mm_fp4_backend=b.get_flashinfer_backend(),
                       model_quantization=mc.quantization, autotune=should_run_flashinfer_autotune(mr))
        except Exception as e:
            out = dict(error=f"{type(e).__name__}: {e}"[:300])
        emit(dict(check="0005", cc=list(torch.cuda.get_device_capability()), fp4_flag=fp4, moe_flag=moe, **out))
