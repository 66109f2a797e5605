"""The kernel build tests' shared arguments."""

from __future__ import annotations

from typing import Any

TARGET = ["--target", "sglang-0.5.9", "--cuda-lane", "13.0"]


# The CPU build of torch on this machine class's disk: enough to compile (FlashInfer
# imports torch for its dtypes), and no multi-GB CUDA download.
TORCH = ["--build-torch", "torch==2.13.0"]


#: The arch list of an SM120 kernel wheel, as a test writes it.
F = ("12.0f",)


def nvfp4_selection(**more: Any) -> dict[str, Any]:
    """What the selection script reports for a ModelOpt NVFP4 MoE on patched 0.5.23."""
    return {"moe_method": "ModelOptNvFp4FusedMoEMethod", "layer_moe_backend":
            "flashinfer_cutlass", "moe_runner_backend": "flashinfer_cutlass",
            "fp4_gemm_backend": "flashinfer_b12x", "fp8_gemm_backend": "cutlass",
            "attention_backend": "flashinfer", "kv_cache_dtype": "auto",
            "sampling_backend": "flashinfer", "model_quantization": "modelopt_fp4",
            "fp4_linears": True, "fp4_checkpoint": True,
            "attention": {"head_dim": 128, "v_head_dim": 128, "dtype": "bfloat16",
                          "attention_arch": "MHA"}, **more}


def manifest_of(groups: tuple[str, ...], head_dims: tuple[int, ...] = (128,),
                arch: tuple[str, ...] = F, flashinfer: str = "0.7.2") -> dict[str, Any]:
    """A kernel wheel manifest holding GROUPS (the keys the coverage check reads)."""
    return {"flashinfer_version": flashinfer, "arch_list": list(arch), "groups": list(groups),
            "head_dims": list(head_dims), "modules": [{"name": g, "group": g}
                                                      for g in groups]}
