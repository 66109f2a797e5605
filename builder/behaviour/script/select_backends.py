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

Input (standard input, JSON): ``{"cases": [{"id", "model_dir", "argv"}], "standins": {...}}``
with ``argv`` the server flags after ``--model-path`` (parsed here by the release's own
parser, ``parse_server_args``'s, into the ``ServerArgs`` keyword arguments that differ from a
bare ``--model-path``; flags it refuses are reported as ``flags_refused``), or ``args``
those keyword arguments already. ``standins`` ``null``: every package is the real one (the
image's launcher, ``sglang-sm120-serve``), so nothing is stood in for, not even
torchvision's operator schemas. Output: one line ``SELECTED {json}`` per case,
``{"id", "observed": {...}}`` or ``{"id", "error"}``.

The device is reported as SM12x (``SM120_CAPABILITY``) wherever this runs: in a behaviour
environment there is none, and the image's launcher hides the GPUs from it
(``CUDA_VISIBLE_DEVICES=""``) so that the selection never touches the GPU the server is about
to use, and an SM90 machine standing in for SM120 derives SM120's set. A CUDA torch keeps its
own ``torch.version.cuda``.
"""

from __future__ import annotations

import contextlib
import io
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


def server_kwargs(model: Path, argv: list[str]) -> dict[str, Any]:
    """The ``ServerArgs`` keyword arguments ``argv`` sets: the values the release's own
    parser gives that differ from a bare ``--model-path`` (``parse_server_args._Parser``).

    Raises:
        parse_server_args._Refused: the parser refuses the flags (or exits, as ``-h`` does).
    """
    import parse_server_args
    from sglang.srt.server_args import ServerArgs

    parsed = []
    for args in (["--model-path", str(model), *argv], ["--model-path", str(model)]):
        parser = parse_server_args._Parser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the help, if asked for
                parsed.append(vars(parser.parse_args(args)))
        except SystemExit as exc:  # an action that calls sys.exit itself
            raise parse_server_args._Refused(f"the parser exits (status {exc.code}) instead "
                                             "of parsing the list") from None
    given, bare = parsed
    return {k: v for k, v in given.items() if k != "model_path" and bare.get(k) != v}


def select(case: dict[str, Any]) -> dict[str, Any]:
    """One case: the server's selection for ``case["model_dir"]`` and ``case["argv"]`` (or
    ``case["args"]``)."""
    import parse_server_args
    import torch

    # device placement only: the tiny weights stay on the CPU (as ``serving.serve``)
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign,unused-ignore]
    model = Path(case["model_dir"])
    if "argv" in case:
        try:
            args = server_kwargs(model, [str(a) for a in case["argv"]])
        except parse_server_args._Refused as exc:
            return {"flags_refused": str(exc)}
    else:
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
    import torch

    cuda = torch.version.cuda  # a CUDA torch's own (the image's); None on a CPU torch
    sm120_device.install()
    if cuda:
        setattr(torch.version, "cuda", cuda)  # noqa: B010 (a module attribute torch types as final)
    if request.get("standins") is not None:  # None: the real packages (the image)
        standins.install(dict(request["standins"]))
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
