"""0004: does the release fuse the shared expert of a ModelOpt NVFP4 DeepSeek-V3 / GLM-5 checkpoint?

Called: the release's own fusion decision after the scheduler's initialisers ran on real ServerArgs:
  0.5.13-0.5.17: DeepseekV2ForCausalLM.determine_num_fused_shared_experts (GlmMoeDsaForCausalLM's
                 override for GLM-5), on an object carrying only .config / .quant_config (building
                 the model allocates weights); read: .num_fused_shared_experts and the
                 disable_shared_experts_fusion server arg afterwards.
  0.5.18+:       sglang.srt.layers.moe.utils.install_shared_experts_fusion_decision(model_class,
                 hf_config, quant_config) -- what the loader calls; read:
                 is_shared_experts_fusion_disabled() and model.determine_num_fused_shared_experts().
Quant configs: ModelOptFp4Config.from_config(hf_quant_config.json) with/without a shared-expert
exclude; Fp8Config (block FP8); None (bf16). Expected on SM12x: fused iff not (NVFP4 with BF16
shared expert); patched differs from upstream only there; (10, 0) identical upstream/patched."""
import types
from importlib import import_module; globals().update({k: v for k, v in vars(import_module("0004_0005_common")).items() if not k.startswith("__")})
banner("0004 shared-expert fusion")
from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
from sglang.srt.models.glm4_moe import GlmMoeDsaForCausalLM
from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config
from sglang.srt.layers.quantization.fp8 import Fp8Config
try:
    from sglang.srt.layers.moe.utils import install_shared_experts_fusion_decision, is_shared_experts_fusion_disabled
except ImportError:
    install_shared_experts_fusion_decision = None

paths = {"nvfp4-bf16shared": write_model("dsv3-nvfp4-bf16shared", DSV3, EXCL_BF16_SHARED),
         "nvfp4-uniform": write_model("dsv3-nvfp4-uniform", DSV3, EXCL_UNIFORM),
         "bf16": write_model("dsv3-bf16", DSV3)}
def quant(ckpt):
    if ckpt.startswith("nvfp4"):
        return ModelOptFp4Config.from_config(json.load(open(os.path.join(paths[ckpt], "hf_quant_config.json"))))
    if ckpt == "fp8":
        return Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})
    return None
ARCH = {"DeepseekV3ForCausalLM": DeepseekV2ForCausalLM, "GlmMoeDsaForCausalLM": GlmMoeDsaForCausalLM}

def model_obj(cls, cfg, qc):
    """An instance of the release's class with only what the decision reads (no layers built)."""
    obj = cls.__new__(cls); torch.nn.Module.__init__(obj)
    obj.config, obj.quant_config = cfg, qc
    return obj

def decide(cls, arch, qc, ep):
    from sglang.srt.runtime_context import get_parallel   # the release's own topology override
    with get_parallel().override(moe_ep_size=ep):
        return _decide(cls, arch, qc)

def _decide(cls, arch, qc):
    cfg = types.SimpleNamespace(**dict(DSV3, architectures=[arch]))
    if install_shared_experts_fusion_decision is not None:
        install_shared_experts_fusion_decision(cls, cfg, qc)
        obj = model_obj(cls, cfg, qc); obj.determine_num_fused_shared_experts()
        return obj.num_fused_shared_experts, is_shared_experts_fusion_disabled()
    from sglang.srt.server_args import get_global_server_args
    obj = model_obj(cls, cfg, qc); obj.determine_num_fused_shared_experts()
    return obj.num_fused_shared_experts, get_global_server_args().disable_shared_experts_fusion

cases = [(tp, ep) for tp in (1, 2, 4, 8) for ep in sorted({1, tp})]
for ckpt in ("nvfp4-bf16shared", "nvfp4-uniform", "fp8", "bf16"):
    path = paths["bf16" if ckpt == "fp8" else ckpt]   # fp8: server args from the bf16 dir; the quant config is Fp8Config
    for moe in ("auto", "flashinfer_cutlass"):
        if not ckpt.startswith("nvfp4") and moe == "flashinfer_cutlass": continue
        for tp, ep in cases:
            for arch, cls in ARCH.items():
                try:
                    sa = server_args(path, tp_size=tp, ep_size=ep, moe_runner_backend=moe)
                    scheduler_init(sa)
                    n, disabled = decide(cls, arch, quant(ckpt), ep)
                    out = dict(num_fused_shared_experts=n, disable_shared_experts_fusion=disabled)
                except Exception as e:
                    out = dict(error=f"{type(e).__name__}: {e}"[:200])
                emit(dict(check="0004", cc=list(torch.cuda.get_device_capability()), ckpt=ckpt, arch=arch,
                          fused_arch=getattr(cls, 'fused_shared_experts_architecture', None), tp=tp, ep=ep, moe_flag=moe, server_moe=getattr(sa, "moe_runner_backend", None), **out))
