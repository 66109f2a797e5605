"""Compile FlashInfer modules ahead of time with FlashInfer's own JIT spec functions.

Run by ``builder.kernels.pins`` with the build environment's interpreter (where the pinned
FlashInfer is installed); the builder never imports it. Argument: one JSON object
``{"out": folder, "groups": [...], "head_dims": [...], "list": bool}``. Environment:
FlashInfer's own variables (``CUDA_HOME``, ``FLASHINFER_CUDA_ARCH_LIST``,
``FLASHINFER_WORKSPACE_BASE``, ``FLASHINFER_NVCC``, ``MAX_JOBS``). Compiler output goes to
stderr as it happens; the last line on stdout is one JSON object.
"""

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Compiler output (ninja writes to stdout) joins stderr; stdout keeps only the result.
_RESULT_FD = os.dup(1)
os.dup2(2, 1)

def _sm_group(prefix: str, module: Any, pattern: str) -> Callable[[str], list[Any]]:
    def specs(group: str) -> list[Any]:
        sm = group[len(prefix):]
        function = getattr(module, pattern.format(sm=sm), None)
        if function is None:
            raise KeyError(group)
        return [function()]
    return specs


def _attention(head_dims: list[int]) -> list[Any]:
    import torch
    from flashinfer import aot

    found: list[Any] = []
    for head_dim in head_dims:
        for dtype in (torch.bfloat16, torch.float16):
            generated: Iterator[Any] = aot.gen_fa2(dtype, dtype, head_dim, head_dim,
                                                   False, False)
            found += list(generated)
    return found


def specs_for(group: str, head_dims: list[int]) -> list[Any]:
    """FlashInfer's JitSpecs for one module group (raises KeyError for an unknown one)."""
    from flashinfer.jit import activation, fp4_quantization, fused_moe, norm, page, rope, sampling

    fixed = {
        "norm": lambda: [norm.gen_norm_module()],
        "sampling": lambda: [sampling.gen_sampling_module()],
        "rope": lambda: [rope.gen_rope_module()],
        "page": lambda: [page.gen_page_module()],
        "activation": lambda: [activation.gen_act_and_mul_module(name)
                               for name in ("silu", "gelu", "gelu_tanh")],
        "attention": lambda: _attention(head_dims),
    }
    if group in fixed:
        return fixed[group]()
    if group.startswith("fused_moe_sm"):
        return _sm_group("fused_moe_sm", fused_moe,
                         "gen_cutlass_fused_moe_sm{sm}_module")(group)
    if group.startswith("fp4_quantization_sm"):
        return _sm_group("fp4_quantization_sm", fp4_quantization,
                         "gen_fp4_quantization_sm{sm}_module")(group)
    raise KeyError(group)


def _emit(result: dict[str, Any]) -> None:
    os.write(_RESULT_FD, (json.dumps(result) + "\n").encode())


def main() -> None:
    request = json.loads(sys.argv[1])
    out = Path(request["out"])
    head_dims = [int(h) for h in request.get("head_dims", [])]
    import flashinfer

    table = {}
    for group in request["groups"]:
        try:
            table[group] = specs_for(group, head_dims)
        except (KeyError, AttributeError):
            _emit({"error": f"FlashInfer {flashinfer.__version__} has no module "
                                       f"group {group!r}"})
            sys.exit(2)
    if request.get("list"):
        _emit({"flashinfer": flashinfer.__version__,
               "groups": {g: [s.name for s in specs] for g, specs in table.items()}})
        return
    # Every module (deduplicated by name) in one ninja graph, through FlashInfer's own
    # build_jit_specs: translation units of different modules compile in parallel.
    unique: dict[str, tuple[str, Any]] = {}
    for group, specs in table.items():
        for spec in specs:
            unique.setdefault(spec.name, (group, spec))
    print(f"[sm120-builder] building {', '.join(unique)}", file=sys.stderr, flush=True)
    start = time.monotonic()
    try:
        from flashinfer.jit.core import build_jit_specs
    except ImportError:  # older FlashInfer: one module at a time
        for _group, spec in unique.values():
            spec.build(verbose=True)
    else:
        build_jit_specs([spec for _group, spec in unique.values()], verbose=True,
                        skip_prebuilt=False)
    seconds = round(time.monotonic() - start, 1)
    built = {}
    for name, (group, spec) in unique.items():
        target = out / name / f"{name}.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(spec.jit_library_path, target)
        built[name] = {"group": group, "path": f"{name}/{name}.so",
                       "cuda_cflags": list(spec.extra_cuda_cflags or []),
                       "cflags": list(spec.extra_cflags or [])}
    _emit({"flashinfer": flashinfer.__version__, "modules": built, "seconds": seconds})


if __name__ == "__main__":
    main()
