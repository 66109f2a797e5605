"""Report what a server started on a checkpoint folder would select, without judging it.

Runs inside a release's behaviour environment, as ``behaviour_checks.py`` does (standard
library, torch, sglang and its neighbours), with the device reported as SM12x
(``sm120_device``). It is the ``serve`` check's machinery (``serving.py``) on any folder
instead of a zoo form: ``ServerArgs`` and the scheduler's initialisation
(``behaviour_checks._server_args``, ``_scheduler_init``), the global MoE and FP4/FP8 GEMM
backends, the values resolution published (attention backends, KV cache dtype, sampling
backend), the release's ``ModelConfig`` (head dims, dtype, attention architecture) and, for
an MoE model, one routed-expert layer built with the release's own ``FusedMoE``
(``serving.moe_layer``: its quant method and MoE runner backend). No outcome is judged:
``builder.kernels.derive`` maps the selection to FlashInfer modules.

Input (standard input, JSON): ``{"cases": [{"id", "model_dir", "args"}], "standins": {...}}``
with ``args`` the ``ServerArgs`` keyword arguments. Output: one line ``SELECTED {json}`` per
case, ``{"id", "observed": {...}}`` or ``{"id", "error"}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

import behaviour_checks
import serving
import sm120_device
import standins

#: Values the server's resolution publishes (0.5.23) or leaves on ``ServerArgs``.
PUBLISHED = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
             "kv_cache_dtype", "sampling_backend", "moe_a2a_backend", "quantization",
             "speculative_algorithm", "dsa_prefill_backend", "dsa_decode_backend")


def _attention(model_config: Any) -> dict[str, Any]:
    """What the attention kernels are built for: head dims, dtype, MHA or MLA."""
    arch = getattr(model_config, "attention_arch", None)
    found: dict[str, Any] = {
        "head_dim": getattr(model_config, "head_dim", None),
        "v_head_dim": getattr(model_config, "v_head_dim", None),
        "dtype": str(getattr(model_config, "dtype", "")).replace("torch.", ""),
        "attention_arch": getattr(arch, "name", None if arch is None else str(arch)),
        "sliding_window": bool(getattr(model_config, "sliding_window", None)
                               or getattr(model_config.hf_text_config, "sliding_window",
                                          None)),
    }
    for name in ("kv_lora_rank", "qk_rope_head_dim"):
        value = getattr(model_config, name, None)
        if value is not None:
            found[name] = value
    return found


def select(case: dict[str, Any]) -> dict[str, Any]:
    """One case: the server's selection for ``case["model_dir"]`` and ``case["args"]``."""
    import torch

    # device placement only: the tiny weights stay on the CPU (as ``serving.serve``)
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign,unused-ignore]
    model = Path(case["model_dir"])
    args = dict(case["args"])
    tp, ep = int(args.get("tp_size", 1)), int(args.get("ep_size", 1))
    observed: dict[str, Any] = {"tp_size": tp, "ep_size": ep}
    with contextlib.suppress(Exception):  # the FlashInfer the release's environment pins
        from importlib.metadata import version

        observed["flashinfer_version"] = version("flashinfer-python")
    try:
        server = behaviour_checks._server_args(model, args)
        behaviour_checks._scheduler_init(server)
    except Exception as exc:  # the release refuses the configuration at start-up
        observed["refused"] = serving._message(exc)
        return observed
    from sglang.srt.layers.moe import get_moe_runner_backend
    from sglang.srt.layers.quantization.fp4_utils import get_fp4_gemm_runner_backend

    observed["moe_runner_backend"] = serving._value(get_moe_runner_backend())
    observed["fp4_gemm_backend"] = serving._value(get_fp4_gemm_runner_backend())
    with contextlib.suppress(Exception):
        from sglang.srt.layers.quantization.fp8_utils import get_fp8_gemm_runner_backend

        observed["fp8_gemm_backend"] = serving._value(get_fp8_gemm_runner_backend())
    for name in PUBLISHED:
        published = behaviour_checks._published(name)
        observed[name] = published if published is not None else \
            serving._value(getattr(server, name, None))
    model_config = serving._model_config(server)
    observed["model_quantization"] = getattr(model_config, "quantization", None)
    observed["attention"] = _attention(model_config)
    config = json.loads((model / "config.json").read_text())
    quant_file = model / "hf_quant_config.json"
    hf_quant = json.loads(quant_file.read_text()) if quant_file.exists() else None
    if serving._is_moe(config):
        try:
            prefix = serving.expert_prefix(config, hf_quant)
            observed.update(serving.moe_layer(server, config, prefix, tp, ep))
        except Exception as exc:
            observed["layer_error"] = serving._message(exc)
    return observed


def main() -> int:
    """Read the request on standard input, print one line per case."""
    request = json.load(sys.stdin)
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    sm120_device.install()
    standins.install(dict(request.get("standins") or {}))
    for case in request["cases"]:
        try:
            record: dict[str, Any] = {"id": case["id"], "observed": select(case)}
        except Exception as exc:  # one case's failure is that case's result
            record = {"id": case["id"], "error": f"{type(exc).__name__}: {exc}"[:400]}
        record["stood_in_calls"] = sorted(set(standins.CALLED))
        print("SELECTED " + json.dumps(record, sort_keys=True, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
