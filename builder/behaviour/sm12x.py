"""What SM12x has kernels for, and the verdict on one served configuration.

The one table of backends SGLang can select that have no SM12x kernel
(:data:`NO_SM12X_KERNELS`), each entry with its source, and :func:`judge`, which turns what
the ``serve`` check observed (``builder/behaviour/script/serving.py``) into one of
:data:`OUTCOMES`. The judge reads only observations of the release's own code: the backends
it selected, what reached the MoE runner, and whether the dispatcher remaps expert ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: A verdict on one configuration, as the docs' table writes it.
SERVES, REFUSED, CRASHES, WRONG, UNJUDGED = (
    "serves", "refused", "crashes", "wrong-numbers", "unjudged")
OUTCOMES = (SERVES, REFUSED, CRASHES, WRONG, UNJUDGED)
#: The words the docs' table uses for each outcome.
OUTCOME_WORDS = {SERVES: "serves on SM12x kernels", REFUSED: "refused at start-up",
                 CRASHES: "crashes at the first layer", WRONG: "serves wrong numbers",
                 UNJUDGED: "not judged"}


@dataclass(frozen=True)
class NoKernel:
    """A backend SGLang may select that has no kernel for SM12x.

    Attributes:
        kind: what it runs (``moe``, ``attention``, ``dsa``, ``fp4_gemm``).
        backend: the value SGLang's option or resolution takes.
        source: where that is written (package, function, version).
    """

    kind: str
    backend: str
    source: str


_TRTLLM_GEN_MOE = ("FlashInfer fused_moe.core.get_trtllm_moe_sm100_module (0.6.14, 0.6.18, 0.7.2): "
                   "the trtllm-gen batched-GEMM MoE, its kernels downloaded as cubins for the "
                   "SM100 family (jit/fused_moe.py gen_trtllm_gen_fused_moe_sm100_module, "
                   "'currently only support Blackwell' datacenter parts)")
#: Every backend without SM12x kernels, by kind. One owner: the judge and the docs read it.
NO_SM12X_KERNELS: tuple[NoKernel, ...] = (
    NoKernel("moe", "flashinfer_trtllm", _TRTLLM_GEN_MOE),
    NoKernel("moe", "flashinfer_trtllm_routed", _TRTLLM_GEN_MOE + "; SGLang "
             "layers/moe/moe_runner/flashinfer_trtllm.py routed variant (0.5.16-0.5.23)"),
    NoKernel("moe", "flashinfer_mxfp4", "SGLang layers/quantization/mxfp4.py "
             "Mxfp4MoEMethod (0.5.16-0.5.23) runs FlashInfer trtllm_fp4_block_scale_moe, "
             "the trtllm-gen MoE above"),
    NoKernel("moe", "flashinfer_cutedsl", "SGLang layers/moe/moe_runner/flashinfer_cutedsl.py "
             "(0.5.16-0.5.23): FlashInfer's CuTe-DSL grouped GEMM for SM100 "
             "(flashinfer.cute_dsl blockscaled_gemm, tcgen05)"),
    NoKernel("moe", "flashinfer_megamoe", "SGLang arg_groups/moe_hook.py _handle_a2a_moe "
             "(0.5.23): 'FlashInfer MegaMOE currently requires an SM100-family CUDA device'"),
    NoKernel("attention", "trtllm_mla", "FlashInfer jit/mla.py gen_mla_module (0.6.14): "
             "supported_major_versions=[10, 11]"),
    NoKernel("attention", "trtllm_mha", "FlashInfer jit/attention/modules.py "
             "gen_trtllm_gen_fmha_module (0.6.14): supported_major_versions=[10, 11]"),
    NoKernel("dsa", "trtllm", "FlashInfer jit/attention/modules.py gen_trtllm_gen_fmha_module "
             "(0.6.14): supported_major_versions=[10, 11]"),
    NoKernel("dsa", "flashmla_sparse", "sgl-flash-mla (pinned by 0.5.16-0.5.23): FlashMLA's "
             "sparse kernels are built for SM90 and SM100 only"),
    NoKernel("dsa", "flashmla_kv", "sgl-flash-mla (pinned by 0.5.16-0.5.23): FlashMLA's "
             "kernels are built for SM90 and SM100 only"),
    NoKernel("fp4_gemm", "flashinfer_trtllm", "FlashInfer jit/gemm/core.py "
             "gen_trtllm_gen_gemm_module (0.6.14): trtllm-gen cubins for the SM100 family"),
)
#: MoE methods whose kernels' SM12x support could not be read here: a case that runs one
#: is not judged (method class -> why).
UNVERIFIED_METHODS = {
    "W4AFp8MoEMethod": "its MoE runs sgl-kernel's cutlass_w4a8_moe_mm (SGLang "
                       "layers/moe/cutlass_w4a8_moe.py, 0.5.16-0.5.23); whether the pinned "
                       "sglang-kernel wheel carries it for sm_120 was not read here",
}
#: MoE runners that take global expert ids (their quant info carries ep_size/ep_rank), so
#: the dispatcher must not remap ids to local ones.
GLOBAL_ID_RUNNERS = ("flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_trtllm_routed",
                     "flashinfer_cutedsl")
#: Observation -> the kind of kernel it names.
_SELECTED = (("layer_moe_backend", "moe"), ("attention_backend", "attention"),
             ("prefill_attention_backend", "attention"), ("decode_attention_backend", "attention"),
             ("dsa_prefill_backend", "dsa"), ("dsa_decode_backend", "dsa"))


def no_kernel(kind: str, backend: Any) -> NoKernel | None:
    """The table's entry for ``backend`` of ``kind``, ``None`` when SM12x has kernels."""
    return next((e for e in NO_SM12X_KERNELS if e.kind == kind and e.backend == backend), None)


@dataclass(frozen=True)
class Verdict:
    """One configuration's outcome and the reason, in one line."""

    outcome: str
    why: str


def _fp4_linear(observed: dict[str, Any]) -> bool:
    return str(observed.get("model_quantization")) in ("modelopt_fp4", "modelopt_mixed") or \
        str(observed.get("family", "")).startswith(("nvfp4", "ct-nvfp4"))


def judge(observed: dict[str, Any]) -> Verdict:
    """The outcome of serving one configuration, from the ``serve`` check's observation.

    Args:
        observed: one case's observation (``refused``, the selected backends, the expert
            layer's runner, payload and dispatcher, ``stood_in_calls``).

    Returns:
        The verdict: ``refused`` when the release stopped at start-up; ``crashes`` when a
        selected backend is in :data:`NO_SM12X_KERNELS` or the expert layer could not be
        built; ``wrong-numbers`` when the CUTLASS runner gets no SwiGLU clamp the model
        carries, or expert ids arrive in the form the runner does not expect; ``unjudged``
        when a stood-in kernel ran while deciding; else ``serves``.
    """
    if "refused" in observed or "error" in observed:
        return Verdict(REFUSED, str(observed.get("refused") or observed.get("error")))
    if observed.get("stood_in_calls"):
        return Verdict(UNJUDGED, f"a stood-in kernel ran: {observed['stood_in_calls']}")
    for key, kind in _SELECTED:
        entry = no_kernel(kind, observed.get(key))
        if entry is not None:
            return Verdict(CRASHES, f"{key} {observed.get(key)}: no SM12x kernel "
                                    f"({entry.source})")
    if _fp4_linear(observed):
        entry = no_kernel("fp4_gemm", observed.get("fp4_gemm_backend"))
        if entry is not None:
            return Verdict(CRASHES, f"fp4_gemm_backend {observed.get('fp4_gemm_backend')}: "
                                    f"no SM12x kernel ({entry.source})")
    method = observed.get("moe_method")
    if method in UNVERIFIED_METHODS:
        return Verdict(UNJUDGED, f"{method}: {UNVERIFIED_METHODS[method]}")
    if "layer_error" in observed:
        return Verdict(CRASHES, f"the expert layer fails to build: {observed['layer_error']}")
    payload = observed.get("payload") or {}
    cutlass = str(payload.get("type", "")).startswith("FlashInferCutlass") or \
        observed.get("layer_moe_backend") == "flashinfer_cutlass"
    if observed.get("clamp_configured") and cutlass:
        if not payload:
            return Verdict(UNJUDGED, "the model carries a SwiGLU clamp and the CUTLASS "
                                     "payload could not be recorded: "
                                     f"{observed.get('payload_error')}")
        if not any(payload.get("clamp", {}).values()):
            return Verdict(WRONG, "the model carries a SwiGLU clamp; the CUTLASS MoE runner "
                                  f"gets none ({payload.get('type')} without swiglu_limit)")
    if int(observed.get("ep_size") or 1) > 1 and "moe_method" in observed:
        global_ids = cutlass or observed.get("layer_moe_backend") in GLOBAL_ID_RUNNERS
        if global_ids != bool(observed.get("skip_local_expert_mapping")):
            want = "global" if global_ids else "local"
            return Verdict(WRONG, f"EP {observed.get('ep_size')}: the runner "
                                  f"({observed.get('layer_moe_backend')}) takes {want} expert "
                                  "ids; the dispatcher "
                                  f"{'does not remap' if not global_ids else 'remaps'} them")
    return Verdict(SERVES, f"MoE {observed.get('layer_moe_backend')}, "
                           f"FP4 GEMM {observed.get('fp4_gemm_backend')}")
