"""Run SGLang's own selection code on cases and print what the process would see.

Runs inside a release's behaviour environment (its pinned Python dependencies, a CPU torch),
never inside the builder: standard library, torch and sglang only, plus its neighbours
``sm120_device``, ``standins`` and ``tiny_models``. The device is reported as one compute
capability (``SM120_CAPABILITY``, one per process: SGLang caches what it reads). A patched
release is run by putting its patched ``sglang`` package first on ``PYTHONPATH``.

Input (standard input, JSON): ``{"cases": [...], "standins": {import name: version},
"models": folder}``; each case ``{"id", "check": "resolve" | "dispatch", "model", "args"}``
with ``args`` the server arguments (``tp_size``, ``ep_size``, ``moe_runner_backend``,
``fp4_gemm_runner_backend``, ``kv_cache_dtype``, ``quantization`` ...). Output: one line
``BEHAVIOUR {json}`` per case with ``{"id", "observed": {...}}`` or ``{"id", "error"}``.

What each check calls, in the release (0.5.16 and 0.5.23 read the same way):

* ``resolve``: ``ServerArgs(...)`` (0.5.23 also ``resolve_once()``), then what the scheduler
  does with it before loading a model (0.5.16: ``set_global_server_args_for_scheduler`` and
  ``initialize_moe_config``/``initialize_fp8_gemm_config``/``initialize_fp4_gemm_config``;
  0.5.23: ``runtime_context.publish`` then the same initialisers); then reads the global MoE
  runner backend (``layers.moe.get_moe_runner_backend``), the FP4 GEMM backend
  (``fp4_utils.get_fp4_gemm_runner_backend``), the NVFP4 MoE layer's own choice
  (``ModelOptNvFp4FusedMoEMethod.create_moe_runner``), the autotune decision
  (``runner.flashinfer_autotune.should_run_flashinfer_autotune`` on a view of the model
  runner holding the attributes it reads), the KV cache dtype, the DSA backends and the
  shared-expert fusion switch.
* ``dispatch``: two ranks on a gloo process group (SGLang's own ``parallel_state``, TP 2 /
  EP 2), the real ``create_moe_dispatcher`` after the layer's ``create_moe_runner``; global
  top-k ids ``[[0, 5], [3, 7]]`` (experts 0-3 on rank 0, 4-7 on rank 1) are dispatched and
  rank 1 reports the ids that reach the runner.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import sm120_device
import standins
import tiny_models

IDS = [[0, 5], [3, 7]]
#: MoE runners that take global expert ids (ep_size/ep_rank) and need no local remap
GLOBAL_ID_RUNNERS = ("flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_cutedsl")


def _value(x: Any) -> Any:
    return getattr(x, "value", x)


def _server_args(model: Path, args: dict[str, Any]) -> Any:
    from sglang.srt.server_args import ServerArgs

    # No tokenizer is read (the zoo's folders have none); a --skip-tokenizer-init the user
    # gives is the same value, not a second one.
    server = ServerArgs(model_path=str(model), **{"skip_tokenizer_init": True, **args})
    if hasattr(server, "resolve_once"):  # 0.5.23: resolution is a pass of its own
        server.resolve_once()
    return server


def _scheduler_init(server: Any, rank: int = 0) -> None:
    """What the scheduler process does with the server arguments before the model loads."""
    import sglang.srt.runtime_context as context
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config

    if hasattr(context, "publish"):
        if hasattr(context, "SpawnRanks"):  # 0.5.23: published with the spawn ranks
            context.publish(server, role="scheduler",
                            ranks=context.SpawnRanks(world_rank=rank, dp_rank=None, gpu_id=rank))
        else:  # 0.5.20
            context.publish(server, role="scheduler")
        initialize_moe_config()
        initialize_fp8_gemm_config()
        initialize_fp4_gemm_config()
    else:
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(server)
        initialize_moe_config(server)
        initialize_fp8_gemm_config(server)
        initialize_fp4_gemm_config(server)


def _published(name: str) -> Any:
    """0.5.23: the value resolution published in a runtime context; ``None`` before."""
    import sglang.srt.runtime_context as context

    for getter in ("get_exec", "get_model", "get_serving", "get_spec"):
        root = getattr(context, getter, None)
        if root is None:
            continue
        try:
            bag = root()
        except Exception:  # not published in this role
            continue
        for part in [bag, *(getattr(bag, a, None) for a in dir(bag) if not a.startswith("_"))]:
            fields = tuple(getattr(type(part), "__struct_fields__", ())) + \
                tuple(getattr(part, "__dataclass_fields__", {})) + \
                tuple(getattr(part, "__dict__", {}))
            if part is not None and name in fields:
                return _value(getattr(part, name))
    return None


def _moe_config(experts: int, local: int) -> Any:
    import torch
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig

    return MoeRunnerConfig(num_experts=experts, num_local_experts=local, hidden_size=256,
                           intermediate_size_per_partition=128, layer_id=1, top_k=2,
                           num_fused_shared_experts=0, params_dtype=torch.bfloat16)


def _nvfp4_method(model: Path) -> Any:
    """The release's NVFP4 MoE method for a ModelOpt checkpoint, ``None`` for others."""
    quant = model / "hf_quant_config.json"
    if not quant.exists():
        return None
    from sglang.srt.layers.quantization.modelopt_quant import (
        ModelOptFp4Config,
        ModelOptNvFp4FusedMoEMethod,
    )

    return ModelOptNvFp4FusedMoEMethod(ModelOptFp4Config.from_config(
        json.loads(quant.read_text())))


def _layer_backend(method: Any, config: Any) -> Any:
    """The MoE runner the layer itself runs (``create_moe_runner`` decides it)."""
    import torch

    if method is None:
        return None
    layer = torch.nn.Module()
    # building the runner may need a kernel; the choice is made before that
    with contextlib.suppress(Exception):
        method.create_moe_runner(layer, config)
    if hasattr(method, "get_moe_runner_backend"):
        return _value(method.get_moe_runner_backend(layer))
    return _value(getattr(method, "_moe_runner_backend", None))


class _RunnerView:
    """The attributes of a model runner ``should_run_flashinfer_autotune`` reads.

    A real ``ModelRunner`` loads weights onto a GPU; this holds the same values the
    scheduler's runner would (its server arguments and model config) and refuses any other.
    """

    def __init__(self, **values: Any) -> None:
        self.__dict__["_values"] = values

    def __getattr__(self, name: str) -> Any:
        if name in self._values:
            return self._values[name]
        raise AttributeError(f"the model runner view has no {name!r}")


def _autotune(server: Any) -> Any:
    import torch
    from sglang.srt.model_executor.runner.flashinfer_autotune import (
        should_run_flashinfer_autotune,
    )

    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        spec = SpeculativeAlgorithm.from_string(getattr(server, "speculative_algorithm", None))
    except ImportError:
        spec = None
    if hasattr(server, "get_model_config"):
        config = server.get_model_config()
    else:
        from sglang.srt.configs.model_config import ModelConfig
        config = ModelConfig.from_server_args(server)
    return bool(should_run_flashinfer_autotune(_RunnerView(
        device="cuda", server_args=server, model_config=config, spec_algorithm=spec,
        is_draft_worker=False, model=torch.nn.Module())))


def _quant_config(model: Path) -> Any:
    """The release's quantization config object for the tiny checkpoint (``None``: bf16)."""
    config = json.loads((model / "config.json").read_text()).get("quantization_config")
    if (model / "hf_quant_config.json").exists():
        from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config

        return ModelOptFp4Config.from_config(json.loads(
            (model / "hf_quant_config.json").read_text()))
    if config and config.get("quant_method") == "fp8":
        from sglang.srt.layers.quantization.fp8 import Fp8Config

        return Fp8Config.from_config(config)
    return None


def _fused_shared_experts(model: Path, ep: int) -> Any:
    """DeepSeek-V3 / GLM-5: how many shared experts the release fuses into the routed ones.

    The decision of the model class itself (0.5.13-0.5.17:
    ``DeepseekV2ForCausalLM.determine_num_fused_shared_experts``; 0.5.18 on: after
    ``layers.moe.utils.install_shared_experts_fusion_decision``, what the loader calls), on
    an instance holding only ``config`` and ``quant_config`` (building the layers would
    allocate the weights), with the expert-parallel width the scheduler publishes.
    """
    import types

    import torch
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
    from sglang.srt.runtime_context import get_parallel

    data = json.loads((model / "config.json").read_text())
    if data.get("model_type") != "deepseek_v3":
        return None
    config = types.SimpleNamespace(**data)
    quant = _quant_config(model)
    with get_parallel().override(moe_ep_size=ep):
        try:
            from sglang.srt.layers.moe.utils import install_shared_experts_fusion_decision
        except ImportError:
            install_shared_experts_fusion_decision = None
        if install_shared_experts_fusion_decision is not None:
            install_shared_experts_fusion_decision(DeepseekV2ForCausalLM, config, quant)
        instance = DeepseekV2ForCausalLM.__new__(DeepseekV2ForCausalLM)
        torch.nn.Module.__init__(instance)
        instance.config, instance.quant_config = config, quant
        instance.determine_num_fused_shared_experts()
        return int(instance.num_fused_shared_experts)


def resolve(case: dict[str, Any], models: Path) -> dict[str, Any]:
    """The ``resolve`` check: every value the serving process would select."""
    from sglang.srt.layers.moe import get_moe_runner_backend
    from sglang.srt.layers.quantization.fp4_utils import get_fp4_gemm_runner_backend

    model = tiny_models.write(case["model"], models)
    server = _server_args(model, case["args"])
    _scheduler_init(server)
    tp = int(case["args"].get("tp_size", 1))
    ep = int(case["args"].get("ep_size", 1))
    observed: dict[str, Any] = {
        "moe_runner_backend": _value(get_moe_runner_backend()),
        "server_moe_runner_backend": _value(server.moe_runner_backend),
        "layer_moe_backend": _layer_backend(_nvfp4_method(model), _moe_config(8, 8 // ep)),
        "fp4_gemm_backend": _value(get_fp4_gemm_runner_backend()),
        "flashinfer_autotune": _autotune(server),
        "tp_size": tp, "ep_size": ep,
    }
    try:
        observed["num_fused_shared_experts"] = _fused_shared_experts(model, ep)
    except Exception as exc:  # the decision refused: an observation of its own
        observed["num_fused_shared_experts"] = f"{type(exc).__name__}: {exc}"[:200]
    for name in ("kv_cache_dtype", "dsa_prefill_backend", "dsa_decode_backend",
                 "disable_shared_experts_fusion", "quantization"):
        published = _published(name)
        observed[name] = published if published is not None else \
            _value(getattr(server, name, None))
    return observed


def _dispatch_rank(rank: int, port: int, cases: list[dict[str, Any]], models: Path) -> None:
    """One rank of the ``dispatch`` check (TP 2 / EP 2), every case in turn."""
    import inspect

    import torch
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers.moe.fused_moe_triton import layer as fused_layer
    from sglang.srt.layers.moe.token_dispatcher import standard
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    # Device placement only: the coordinator's bookkeeping tensors and the dispatcher's
    # mapping table go to the CPU; the process groups are real gloo groups of size 2.
    parallel_state.is_cuda_alike = lambda: False
    standard.get_device = lambda: "cpu"
    torch.cuda.set_device(rank)
    ready = False
    for case in cases:
        args = {**case["args"], "tp_size": 2, "ep_size": 2}
        try:
            model = tiny_models.write(case["model"], models)
            server = _server_args(model, args)
            _scheduler_init(server, rank)
            if not ready:
                parallel_state.init_distributed_environment(
                    world_size=2, rank=rank, local_rank=rank, backend="gloo",
                    distributed_init_method=f"tcp://127.0.0.1:{port}")
                if "tensor_model_parallel_size" in inspect.signature(
                        parallel_state.initialize_model_parallel).parameters:  # 0.5.16
                    parallel_state.initialize_model_parallel(
                        tensor_model_parallel_size=2, expert_model_parallel_size=2,
                        backend="gloo")
                else:  # 0.5.23: the widths come from the published context
                    parallel_state.initialize_model_parallel(backend="gloo")
                ready = True
            config = _moe_config(8, 4)
            method = _nvfp4_method(model)
            layer_backend = _layer_backend(method, config)
            if method is not None and hasattr(method, "get_moe_runner_backend"):
                config.runner_backend = method.get_moe_runner_backend(torch.nn.Module())
            if "quant_method" in inspect.signature(fused_layer.create_moe_dispatcher).parameters:
                dispatcher = fused_layer.create_moe_dispatcher(config, quant_method=method)
            else:
                dispatcher = fused_layer.create_moe_dispatcher(config)
            ids = torch.tensor(IDS, dtype=torch.int32)
            out = dispatcher.dispatch(
                torch.zeros(2, 256, dtype=torch.bfloat16),
                StandardTopKOutput(topk_weights=torch.ones(2, 2), topk_ids=ids,
                                   router_logits=torch.zeros(2, 8)))
            to_runner = out.topk_output.topk_ids.tolist()
            observed = {"layer_moe_backend": layer_backend,
                        "skip_local_expert_mapping": bool(getattr(
                            dispatcher, "skip_local_expert_mapping", False)),
                        "rank": rank, "topk_ids_to_runner": to_runner,
                        "global_ids_reach_runner": to_runner == IDS,
                        "consistent": (to_runner == IDS) == (layer_backend in GLOBAL_ID_RUNNERS)}
            if rank == 1:
                _emit({"id": case["id"], "observed": observed})
        except Exception as exc:  # one case's failure is that case's result
            if rank == 1:
                _emit({"id": case["id"], "error": f"{type(exc).__name__}: {exc}"[:400]})
    if ready:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()


def _emit(record: dict[str, Any]) -> None:
    record["stood_in_calls"] = sorted(set(standins.CALLED))
    print("BEHAVIOUR " + json.dumps(record, sort_keys=True, default=str), flush=True)


def main() -> int:
    """Read the request on standard input, run its cases, print one line per case."""
    if os.environ.get("SM120_DISPATCH_RANK") is not None:  # a rank started below
        request = json.loads(os.environ["SM120_REQUEST"])
        _setup(request)
        _dispatch_rank(int(os.environ["SM120_DISPATCH_RANK"]), int(os.environ["SM120_PORT"]),
                       request["cases"], Path(request["models"]))
        return 0
    request = json.load(sys.stdin)
    _setup(request)
    models = Path(request.get("models") or tempfile.mkdtemp(prefix="sm120-models-"))
    request["models"] = str(models)
    dispatch = [c for c in request["cases"] if c["check"] == "dispatch"]
    for case in request["cases"]:
        if case["check"] not in ("resolve", "serve"):
            continue
        try:
            if case["check"] == "serve":
                import serving

                observed = serving.serve(case, models)
            else:
                observed = resolve(case, models)
            _emit({"id": case["id"], "observed": observed})
        except Exception as exc:  # the release refused the configuration: a result too
            _emit({"id": case["id"], "error": f"{type(exc).__name__}: {exc}"[:400]})
    if dispatch:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {**os.environ, "SM120_PORT": str(port),
               "SM120_REQUEST": json.dumps({**request, "cases": dispatch})}
        ranks = [subprocess.Popen([sys.executable, __file__],
                                  env={**env, "SM120_DISPATCH_RANK": str(rank)})
                 for rank in (0, 1)]
        if any(rank.wait(timeout=900) for rank in ranks):
            return 1
    return 0


def _setup(request: dict[str, Any]) -> None:
    import logging
    import warnings

    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    sm120_device.install()
    standins.install(dict(request.get("standins") or {}))


if __name__ == "__main__":
    sys.exit(main())
