"""The ``serve`` check: what a server started on one zoo checkpoint would run, layer by layer.

Runs inside a release's behaviour environment (see ``behaviour_checks``). For one case (a
checkpoint form of ``zoo_forms`` and the server arguments) it does what SGLang's start-up
does, with the release's own code:

1. ``ServerArgs`` and the scheduler's initialisation (``behaviour_checks._server_args``,
   ``_scheduler_init``): an exception here is a refusal at start-up, its message recorded.
2. The loader's quantization config: ``model_loader.loader._get_quantization_config`` on the
   release's ``ModelConfig`` (the path ``get_model`` takes, 0.5.16 to 0.5.23).
3. One routed-expert layer: the release's ``FusedMoE(...)``, which itself calls the quant
   config's ``get_quant_method``, ``create_weights``, ``create_moe_runner`` and
   ``create_moe_dispatcher``; built inside ``get_parallel().override(...)`` (SGLang's own
   injection primitive in ``runtime_context``) with the case's TP/EP widths, rank 0.
   The clamp arguments are the ones the model class passes (:func:`moe_kwargs`).
4. Then ``process_weights_after_loading`` and ``apply`` on zero inputs, with the layer's
   ``MoeRunner`` replaced by a recorder: what reaches the runner (its quant-info type and
   the SwiGLU clamp fields) is recorded, no kernel runs.

Device placement only: ``Tensor.cuda`` returns the CPU tensor (the weights are tiny); the
device is reported as SM12x by ``sm120_device``. Nothing else of SGLang is replaced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

#: A refusal the series adds says this first (``sglang/srt/sm12x_support.py``).
REFUSAL_MARK = "SM12x:"


def _value(x: Any) -> Any:
    return getattr(x, "value", x)


def moe_kwargs(config: dict[str, Any], layer_id: int) -> dict[str, Any]:
    """The SwiGLU clamp arguments the release's model class passes to ``FusedMoE``.

    Sources (0.5.16-0.5.23): ``models/gpt_oss.py:GptOssSparseMoeBlock`` passes
    ``gemm1_alpha=1.702`` and ``gemm1_clamp_limit=config.swiglu_limit``;
    ``models/step3p5.py`` passes ``gemm1_clamp_limit`` from ``config.swiglu_limits`` (one
    per layer); ``models/deepseek_v2.py:DeepseekV2MoE`` (GLM-5.x-Flash's ``Glm5Next``, HY-V4)
    passes ``swiglu_limit=config.swiglu_limit``.
    """
    config = _text(config)
    model_type = str(config.get("model_type", ""))
    if model_type == "gpt_oss" and config.get("swiglu_limit") is not None:
        return {"gemm1_alpha": 1.702, "gemm1_clamp_limit": float(config["swiglu_limit"])}
    limits = config.get("swiglu_limits")
    if isinstance(limits, list) and limits:
        limit = limits[min(layer_id, len(limits) - 1)]
        return {"gemm1_clamp_limit": float(limit)} if limit else {}
    if config.get("swiglu_limit") is not None:
        return {"swiglu_limit": float(config["swiglu_limit"])}
    return {}


def _text(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (multimodal exports nest it)."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def _shape(config: dict[str, Any]) -> dict[str, int]:
    text = _text(config)
    experts = int(text.get("n_routed_experts") or text.get("num_experts")
                  or text.get("num_local_experts") or 8)
    return {"num_experts": experts,
            "top_k": int(text.get("num_experts_per_tok") or text.get("moe_topk") or 2),
            "hidden_size": int(text.get("hidden_size", 256)),
            "intermediate_size": int(text.get("moe_intermediate_size")
                                     or text.get("intermediate_size", 128))}


def expert_prefix(config: dict[str, Any], quant: dict[str, Any] | None) -> str:
    """The module name of the routed experts of the first MoE layer, as the checkpoint names
    it (a MIXED_PRECISION export lists its quantized layers by these names; the release's
    ``ModelOptMixedPrecisionConfig`` resolves a layer's algorithm from its prefix)."""
    tables = [config.get("quantization_config") or {}, (quant or {}).get("quantization") or {}]
    for table in tables:
        for name in sorted(table.get("quantized_layers") or {}):
            if ".experts." in name:
                return str(name[:name.index(".experts.")]) + ".experts"
    nested = isinstance(config.get("text_config"), dict)
    return "model.language_model.layers.1.mlp.experts" if nested else \
        "model.layers.1.mlp.experts"


def _is_moe(config: dict[str, Any]) -> bool:
    text = _text(config)
    return any(text.get(k) for k in ("n_routed_experts", "num_experts", "num_local_experts",
                                      "moe_num_experts"))


def _model_config(server: Any) -> Any:
    if hasattr(server, "get_model_config"):
        return server.get_model_config()
    from sglang.srt.configs.model_config import ModelConfig

    return ModelConfig.from_server_args(server)


def _quant_config(server: Any) -> Any:
    """The loader's own quantization config for the checkpoint (``None``: unquantized)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import _get_quantization_config

    return _get_quantization_config(_model_config(server), LoadConfig())


@contextlib.contextmanager
def _widths(tp: int, ep: int) -> Any:
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(tp_size=tp, tp_rank=0, moe_ep_size=ep, moe_ep_rank=0,
                                 moe_tp_size=max(tp // ep, 1), moe_tp_rank=0):
        yield


class _Recorder:
    """Stands where the layer's ``MoeRunner`` is: records what would reach the kernel."""

    def __init__(self, backend: Any) -> None:
        self.runner_backend = backend
        self.payload: dict[str, Any] | None = None

    def run(self, dispatch_output: Any, quant_info: Any) -> Any:
        import torch

        fields = {f.name: getattr(quant_info, f.name)
                  for f in dataclasses.fields(quant_info)} \
            if dataclasses.is_dataclass(quant_info) else {}
        self.payload = {
            "type": type(quant_info).__name__,
            "clamp": {k: v is not None for k, v in fields.items()
                      if "swiglu" in k or "clamp" in k or k in ("alpha", "beta")},
            "ep_size": _value(fields.get("moe_ep_size")),
        }
        hidden = dispatch_output.hidden_states
        return torch.zeros(hidden.shape[0], hidden.shape[-1], dtype=torch.bfloat16)


def _dispatch_output(hidden: int, experts: int, top_k: int) -> Any:
    import torch
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    topk = StandardTopKOutput(topk_weights=torch.ones(2, top_k),
                              topk_ids=torch.zeros(2, top_k, dtype=torch.int32),
                              router_logits=torch.zeros(2, experts))
    fields = StandardDispatchOutput._fields
    values = {"hidden_states": torch.zeros(2, hidden, dtype=torch.bfloat16),
              "hidden_states_scale": None, "topk_output": topk}
    return StandardDispatchOutput(**{k: values.get(k) for k in fields})


def _message(exc: BaseException) -> str:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f"{Path(f.filename).name}:{f.name}" for f in reversed(frames)
                  if "sglang" in f.filename), "")
    return f"{type(exc).__name__}: {exc}"[:360] + (f" (in {where})" if where else "")


def _runner_owner(layer: Any, method: Any) -> Any:
    """Where the layer's ``MoeRunner`` lives: the method, or the compressed-tensors scheme
    the method delegates to (``CompressedTensorsFusedMoEMethod`` -> ``layer.scheme``)."""
    for owner in (method, getattr(layer, "scheme", None), layer):
        if owner is not None and getattr(owner, "runner", None) is not None:
            return owner
    return method


def moe_layer(server: Any, config: dict[str, Any], prefix: str, tp: int, ep: int
              ) -> dict[str, Any]:
    """Build one routed-expert layer as the model would and record what it runs."""
    import torch
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoE

    shape = _shape(config)
    # 256 columns per MoE-TP partition: the widths every kernel's alignment accepts (FP8
    # block 128, NVFP4 padding); the checkpoint's own width is a tiny model's, not a rule
    shape["intermediate_size"] = 256 * max(tp // ep, 1)
    layer_id = int(prefix.split(".layers.")[1].split(".")[0]) if ".layers." in prefix else 1
    clamp = moe_kwargs(config, layer_id)
    quant = _quant_config(server)
    out: dict[str, Any] = {"quant_config": type(quant).__name__ if quant else None,
                           "expert_prefix": prefix}
    with _widths(tp, ep):
        layer = FusedMoE(num_experts=shape["num_experts"], hidden_size=shape["hidden_size"],
                         intermediate_size=shape["intermediate_size"], layer_id=layer_id,
                         top_k=shape["top_k"], quant_config=quant,
                         prefix=prefix,
                         params_dtype=torch.bfloat16, **clamp)
        method = layer.quant_method
        owner = _runner_owner(layer, method)
        runner = getattr(owner, "runner", None)
        backend = getattr(runner, "runner_backend", None)
        if backend is None:
            backend = getattr(method, "_moe_runner_backend", None)
        if backend is None:  # methods that read the global value when they run
            from sglang.srt.layers.moe import get_moe_runner_backend

            backend = get_moe_runner_backend()
        dispatcher = layer.dispatcher
        out.update({
            "moe_method": type(method).__name__,
            "layer_moe_backend": _value(backend),
            "dispatcher": type(dispatcher).__name__,
            "skip_local_expert_mapping": bool(getattr(dispatcher,
                                                      "skip_local_expert_mapping", False)),
            "clamp_configured": bool(clamp),
        })
        try:
            method.process_weights_after_loading(layer)
            recorder = _Recorder(backend)
            for holder in (owner, layer):
                if getattr(holder, "runner", None) is runner:
                    holder.runner = recorder
            method.apply(layer, _dispatch_output(shape["hidden_size"], shape["num_experts"],
                                                 shape["top_k"]))
            out["payload"] = recorder.payload
        except Exception as exc:  # a kernel the CPU cannot run: the payload stays unknown
            out["payload_error"] = _message(exc)
    return out


def serve(case: dict[str, Any], models: Path) -> dict[str, Any]:
    """The ``serve`` check for one case: selections, the expert layer, or the refusal."""
    import behaviour_checks
    import torch
    import zoo_forms

    # device placement only: the tiny weights stay on the CPU
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign,unused-ignore]
    form = next(f for f in zoo_forms.FORMS if f.name == case["model"])
    model = zoo_forms.write(form, models)
    args = dict(case["args"])
    tp, ep = int(args.get("tp_size", 1)), int(args.get("ep_size", 1))
    observed: dict[str, Any] = {"form": form.name, "family": form.family, "tp_size": tp,
                                "ep_size": ep}
    try:
        server = behaviour_checks._server_args(model, args)
        behaviour_checks._scheduler_init(server)
    except Exception as exc:  # the release refused the configuration at start-up
        observed["refused"] = _message(exc)
        return observed
    from sglang.srt.layers.moe import get_moe_runner_backend
    from sglang.srt.layers.quantization.fp4_utils import get_fp4_gemm_runner_backend

    observed["moe_runner_backend"] = _value(get_moe_runner_backend())
    observed["fp4_gemm_backend"] = _value(get_fp4_gemm_runner_backend())
    with contextlib.suppress(Exception):
        from sglang.srt.layers.quantization.fp8_utils import get_fp8_gemm_runner_backend

        observed["fp8_gemm_backend"] = _value(get_fp8_gemm_runner_backend())
    for name in ("kv_cache_dtype", "dsa_prefill_backend", "dsa_decode_backend",
                 "attention_backend", "prefill_attention_backend", "decode_attention_backend",
                 "speculative_moe_runner_backend", "moe_a2a_backend", "quantization",
                 "enable_dp_attention"):
        published = behaviour_checks._published(name)
        observed[name] = published if published is not None else \
            _value(getattr(server, name, None))
    observed["model_quantization"] = getattr(_model_config(server), "quantization", None)
    config = json.loads((model / "config.json").read_text())
    if _is_moe(config):
        try:
            prefix = expert_prefix(config, form.hf_quant_config)
            observed.update(moe_layer(server, config, prefix, tp, ep))
        except Exception as exc:
            key = "refused" if REFUSAL_MARK in str(exc) else "layer_error"
            observed[key] = _message(exc)
    return observed
