"""Where an SGLang release's server reads and writes FlashInfer's autotune file, per rank.

Runs in an environment where the release is importable (a behaviour environment on a CPU,
with ``sm120_device`` reporting the capability; or the serving environment itself) and
calls the release's own ``flashinfer_autotune_cache_path`` (``sglang/srt/model_executor/
runner/flashinfer_autotune.py``, 0.5.16 to 0.5.23). Its inputs are what the scheduler's
model runner would hold for the given server argv: the server arguments from the release's
own ``prepare_server_args`` (the function ``launch_server`` calls), published to the
runtime context as the scheduler publishes them (0.5.20 and later), the release's
``ModelConfig`` (its dtype and HF config class) and one ``ParallelState`` per rank (0.5.16
and 0.5.20; 0.5.23 reads the published ranks).

Input (standard input, JSON): ``{"argvs": [[...], ...], "standins": {import name:
version}, "device": true|false}`` (``device``: install the stand-in CPU device). Output: one
line ``PATHS {json}`` per argv: ``{"ok": true, "paths": [path relative to SGLANG_CACHE_DIR,
...], "function": "module:function"}`` or ``{"ok": false, "error": ...}``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

# the same read-only runner view the behaviour checks hand to should_run_flashinfer_autotune
from behaviour_checks import _RunnerView


def _publish(server: Any, rank: int) -> None:
    """Publish the server arguments as the scheduler of ``rank`` does (0.5.20 and later).

    0.5.23 derives every rank (TP, attention TP, EP, ...) from the spawn ranks it is
    published with; the ranks are published last to first, so rank 0's state is the one
    left for the next argument list (publishing over another rank's state is refused)."""
    import sglang.srt.runtime_context as context

    if not hasattr(context, "publish"):
        return
    if hasattr(context, "SpawnRanks"):  # 0.5.23: published with the spawn ranks
        context.publish(server, role="scheduler",
                        ranks=context.SpawnRanks(world_rank=rank, dp_rank=None, gpu_id=rank))
    else:  # 0.5.20
        context.publish(server, role="scheduler")


def _parallel_state(server: Any, tp_rank: int, pp_rank: int) -> Any:
    """The rank's ``ParallelState`` (0.5.16, 0.5.20: the model runner's ``ps``)."""
    try:
        from sglang.srt.distributed.parallel_state_wrapper import ParallelState
    except ImportError:
        return None
    return ParallelState.trivial(tp_rank=tp_rank, tp_size=server.tp_size, pp_rank=pp_rank,
                                 pp_size=server.pp_size, dp_rank=0, moe_ep_size=server.ep_size,
                                 attn_tp_size=server.tp_size, attn_tp_rank=tp_rank,
                                 gpu_id=tp_rank)


def paths(argv: list[str]) -> dict[str, Any]:
    """Every rank's autotune file, relative to ``SGLANG_CACHE_DIR``."""
    from sglang.srt.model_executor.runner import flashinfer_autotune
    from sglang.srt.server_args import prepare_server_args

    server = prepare_server_args(argv)
    if hasattr(server, "resolve_once"):  # 0.5.23: resolution is a pass of its own
        server.resolve_once()
    if server.dp_size != 1 or getattr(server, "enable_dp_attention", False):
        return {"ok": False, "error": "data parallelism (--dp-size, --enable-dp-attention) "
                "is not computed here: its ranks are the scheduler's"}
    if hasattr(server, "get_model_config"):
        config = server.get_model_config()
    else:
        from sglang.srt.configs.model_config import ModelConfig
        config = ModelConfig.from_server_args(server)
    root = Path(os.environ["SGLANG_CACHE_DIR"])
    found: list[str] = []
    for rank in reversed(range(server.pp_size * server.tp_size)):
        pp_rank, tp_rank = divmod(rank, server.tp_size)
        _publish(server, rank)
        view = _RunnerView(device="cuda", dtype=config.dtype, model_config=config,
                           server_args=server, is_draft_worker=False,
                           ps=_parallel_state(server, tp_rank, pp_rank), gpu_id=tp_rank)
        path = flashinfer_autotune.flashinfer_autotune_cache_path(view)
        found.insert(0, str(Path(path).relative_to(root)))
    return {"ok": True, "paths": found,
            "function": "sglang.srt.model_executor.runner.flashinfer_autotune:"
                        "flashinfer_autotune_cache_path"}


def main() -> int:
    """Read the request, print one ``PATHS`` line per argv."""
    request = json.load(sys.stdin)
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    if request.get("device"):
        import sm120_device
        import standins

        sm120_device.install()
        standins.install(dict(request.get("standins") or {}))
    os.environ["SGLANG_CACHE_DIR"] = tempfile.mkdtemp(prefix="sm120-autotune-path-")
    for argv in request["argvs"]:
        said = io.StringIO()  # argparse's reason goes to stderr before it exits
        try:
            with contextlib.redirect_stderr(said):
                record = paths(list(argv))
        except Exception as exc:  # the release refused the arguments: its own message
            record = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600]}
        except SystemExit as exc:  # its argument parser's exit, with its last line
            lines = said.getvalue().strip().splitlines()
            record = {"ok": False, "error": lines[-1][:600] if lines else
                      f"the release's argument parser exited {exc.code}"}
        print("PATHS " + json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
