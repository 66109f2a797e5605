"""0002 behaviour draft: StandardDispatcher's expert-id mapping under TP=EP=N (N = SM120_WORLD, 2 or 8).

N CPU processes form a real gloo world; sglang's own parallel_state (init_distributed_environment,
initialize_model_parallel) builds the TP/EP groups. Each rank resolves ServerArgs for a ModelOpt NVFP4
checkpoint (quantization declared by the checkpoint, --quantization unset) with --moe-runner-backend from
argv[1] (default auto), runs the scheduler's init sequence, builds ModelOptNvFp4FusedMoEMethod +
create_moe_runner (the per-layer runner) and the dispatcher exactly as FusedMoE.__init__ does in the release
(layers/moe/fused_moe_triton/layer.py: create_moe_dispatcher), then dispatches global top-k ids.
Read: skip_local_expert_mapping, the ids handed to the runner, layers.moe.get_moe_runner_backend(),
layers.moe.utils.should_use_flashinfer_cutlass_moe_fp4_allgather().
Stand-ins beyond the common ones: GroupCoordinator is told it is not on CUDA (its bookkeeping tensors), the
mapping table is placed on the CPU (token_dispatcher.standard.get_device): device placement only.
The flashinfer CUTLASS runner receives ep_size/ep_rank and expects GLOBAL ids; a remapped id is -1 or local.
"""
import os, subprocess, sys
N = int(os.environ.get("SM120_WORLD", "2"))
if "SM120_RANK" not in os.environ:
    import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    procs = [subprocess.Popen([sys.executable, __file__] + sys.argv[1:],
                              env=dict(os.environ, SM120_RANK=str(r), SM120_PORT=str(port))) for r in range(N)]
    sys.exit(max(p.wait() for p in procs))
import importlib, inspect
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
C = importlib.import_module("0002_common")
torch = C.torch
rank = int(os.environ["SM120_RANK"]); port = os.environ["SM120_PORT"]
flag = sys.argv[1] if len(sys.argv) > 1 else "auto"
torch.cuda.set_device(rank)
sa = C.server_args(C.model_dir("qwen3moe", "nvfp4"), tp_size=N, ep_size=N, moe_runner_backend=flag)
C.scheduler_init(sa, rank)
from sglang.srt.distributed import parallel_state as ps
ps.is_cuda_alike = lambda: False
ps.init_distributed_environment(world_size=N, rank=rank, local_rank=rank, backend="gloo",
                                distributed_init_method=f"tcp://127.0.0.1:{port}")
if "tensor_model_parallel_size" in inspect.signature(ps.initialize_model_parallel).parameters:   # <= 0.5.18
    ps.initialize_model_parallel(tensor_model_parallel_size=N, expert_model_parallel_size=N, backend="gloo")
else:                                                                                               # widths from the context
    ps.initialize_model_parallel(backend="gloo")
from sglang.srt.layers.moe import get_moe_runner_backend
from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatcher
import sglang.srt.layers.moe.token_dispatcher.standard as std_mod
from sglang.srt.layers.moe.fused_moe_triton import layer as fml
from sglang.srt.layers.moe.topk import StandardTopKOutput
from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config, ModelOptNvFp4FusedMoEMethod
E = 2 * N
cfg = MoeRunnerConfig(num_experts=E, num_local_experts=E // N, hidden_size=256, intermediate_size_per_partition=128,
                      layer_id=1, top_k=2, num_fused_shared_experts=0, params_dtype=torch.bfloat16)
qc = ModelOptFp4Config.from_config({"quantization": {k: v for k, v in C.QUANT["nvfp4"].items() if k != "quant_method"}})
meth = ModelOptNvFp4FusedMoEMethod(qc)
try: meth.create_moe_runner(torch.nn.Module(), cfg)
except Exception as e: pass
lb = getattr(meth, "_moe_runner_backend", None); lb = getattr(lb, "value", lb)
if hasattr(meth, "get_moe_runner_backend"):            # 0.5.23: FusedMoE.__init__ passes the per-layer backend
    cfg.runner_backend = meth.get_moe_runner_backend(torch.nn.Module())
d = (fml.create_moe_dispatcher(cfg, quant_method=meth)
     if "quant_method" in inspect.signature(fml.create_moe_dispatcher).parameters else fml.create_moe_dispatcher(cfg))
assert isinstance(d, StandardDispatcher), type(d)
std_mod.get_device = lambda: "cpu"
ids = torch.tensor([[0, 2], [3, E - 1]], dtype=torch.int32)     # global ids; rank r owns experts 2r, 2r+1
out = d.dispatch(torch.zeros(2, 256, dtype=torch.bfloat16),
                 StandardTopKOutput(topk_weights=torch.ones(2, 2), topk_ids=ids, router_logits=torch.zeros(2, E)))
try:
    from sglang.srt.layers.moe.utils import should_use_flashinfer_cutlass_moe_fp4_allgather as ag
    allgather = ag()
except Exception as e:
    allgather = f"{type(e).__name__}"
if rank in (0, 1, N - 1):
    C.emit(dict(check="0002-dispatch", tree=C.tree(), world=N, rank=rank, flag=flag, server_quantization=sa.quantization,
                server_moe_runner_backend=sa.moe_runner_backend, published=C.published_moe_runner_backend(),
                global_backend=get_moe_runner_backend().value, layer_backend=lb,
                skip_local_expert_mapping=d.skip_local_expert_mapping, topk_ids_in=ids.tolist(),
                topk_ids_to_runner=out.topk_output.topk_ids.tolist(), fp4_allgather=allgather))
ps.destroy_model_parallel(); ps.destroy_distributed_environment()
