"""Record the TileLang kernels a release's dispatch picks on SM12x; compile each for sm_120.

Runs inside a release's behaviour environment with the release's pinned tilelang on
``PYTHONPATH`` (and a patched ``sglang`` first, for the patched code): standard library,
torch, tilelang and sglang only, plus ``sm120_device`` and ``standins``. It reports figures
and judges nothing: the builder (``builder/behaviour/fit.py``) holds SM120's limits.

The dispatch (``MODULE:FUNCTION``, e.g. ``tilelang_sparse_fwd``) is the release's own code,
called on meta tensors (DeepSeek-V3.2's MLA shapes: 576-wide q/kv, 512-wide v, top-k 2048)
with the device reported as SM12x. Every ``@tilelang.jit`` factory of the module is wrapped
by a recorder: the factory and arguments the dispatch picks are recorded, and a stand-in
kernel checks the inputs against the buffers the kernel's TIR declares and returns outputs
of the declared shapes (so a dispatch that runs several kernels reaches each). Each recorded
kernel is then lowered by TileLang for ``{"kind": "cuda", "arch": "sm_120"}`` (no GPU) for
its dynamic shared memory and thread extent, and its generated CUDA compiled by
``nvcc -arch=sm_120a -cubin -Xptxas -v`` for registers and static shared memory.

Input (standard input, JSON): ``{"fits": [{"id", "module", "function", "heads", "kv",
"tokens"}], "standins": {...}, "nvcc": path}``. Output: ``KERNELFIT {json}`` lines: one per
dispatch call ``{"fit", "call": {...}, "kernels": [key...]}`` (or ``"error"``), one per
kernel ``{"fit", "kernel": key, "factory", "arguments", "device_function",
"dynamic_smem", "static_smem", "registers", "threads", "spill_stores", "error"}``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import sm120_device
import standins

_PREFIX = "KERNELFIT "
_D_QK, _D_V, _TOPK, _PAGES = 576, 512, 2048, 4096


def _emit(record: dict[str, Any]) -> None:
    print(_PREFIX + json.dumps(record), flush=True)


def _key(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    shown = [repr(a) for a in args] + [f"{k}={kwargs[k]!r}" for k in sorted(kwargs)]
    return f"{name}({', '.join(shown)})"


class _StandinKernel:
    """Checks the inputs against the TIR's buffers; returns zeros of the declared outputs."""

    def __init__(self, name: str, tir: Any, out_idx: Any, dtypes: dict[str, Any]) -> None:
        self.name, self.tir, self.dtypes = name, tir, dtypes
        count = len(tir.params)
        positions = out_idx if isinstance(out_idx, (list, tuple)) else [out_idx]
        self.out_pos = sorted((i + count) % count for i in positions)

    def __call__(self, *inputs: Any) -> Any:
        import torch

        buffers = [self.tir.buffer_map[p] for p in self.tir.params]
        ins = [b for i, b in enumerate(buffers) if i not in self.out_pos]
        if len(ins) != len(inputs):
            raise TypeError(f"{self.name}: {len(ins)} inputs declared, {len(inputs)} given")
        bound: dict[str, int] = {}
        for buffer, tensor in zip(ins, inputs, strict=True):
            if self.dtypes[str(buffer.dtype)] != tensor.dtype or len(buffer.shape) != tensor.dim():
                raise TypeError(f"{self.name}: buffer {buffer.name} is {buffer.dtype} "
                                f"{list(buffer.shape)}, got {tensor.dtype} {tuple(tensor.shape)}")
            for dim, size in zip(buffer.shape, tensor.shape, strict=True):
                if hasattr(dim, "value"):
                    if int(dim.value) != size:
                        raise TypeError(f"{self.name}: buffer {buffer.name} shape "
                                        f"{list(buffer.shape)}, got {tuple(tensor.shape)}")
                elif bound.setdefault(str(dim), size) != size:
                    raise TypeError(f"{self.name}: {dim} bound to {bound[str(dim)]} and {size}")
        outs = [torch.zeros([int(d.value) if hasattr(d, "value") else bound[str(d)]
                             for d in buffers[i].shape], dtype=self.dtypes[str(buffers[i].dtype)],
                            device=inputs[0].device) for i in self.out_pos]
        return outs[0] if len(outs) == 1 else tuple(outs)


class _Recorder:
    """Stands for one ``@tilelang.jit`` factory: records each call, returns a stand-in."""

    def __init__(self, name: str, factory: Any, recorded: dict[str, Any], picked: list[str],
                 dtypes: dict[str, Any]) -> None:
        self.name, self.factory, self.recorded, self.picked = name, factory, recorded, picked
        self.dtypes = dtypes

    def __call__(self, *args: Any, **kwargs: Any) -> _StandinKernel:
        key = _key(self.name, args, kwargs)
        self.recorded.setdefault(key, (self.name, self.factory, args, kwargs))
        self.picked.append(key)
        return _StandinKernel(self.name, self.factory.get_tir(*args, **kwargs),
                              self.factory.out_idx, self.dtypes)


@contextlib.contextmanager
def recording(module: Any, dtypes: dict[str, Any]
              ) -> Iterator[tuple[dict[str, Any], list[str]]]:
    """Every ``@tilelang.jit`` factory of ``module`` stood in for by a :class:`_Recorder`
    while inside (also ``tilelang_aot.py``); put back on the way out.

    Yields:
        ``(recorded, picked)``: each distinct call (key -> name, factory, args, kwargs) and
        the keys in the order the dispatch called them.
    """
    from tilelang.jit import JITImpl

    recorded: dict[str, tuple[str, Any, tuple[Any, ...], dict[str, Any]]] = {}
    picked: list[str] = []
    originals = {n: getattr(module, n) for n in dir(module)
                 if isinstance(getattr(module, n), JITImpl)}
    for name, factory in originals.items():
        setattr(module, name, _Recorder(name, factory, recorded, picked, dtypes))
    try:
        yield recorded, picked
    finally:
        for name, factory in originals.items():
            setattr(module, name, factory)


def dispatch_inputs(torch: Any, kv: str, heads: int, tokens: int) -> tuple[Any, Any, Any]:
    """The meta tensors a DSA dispatch is called with: q, the paged KV cache (bf16 or FP8)
    and the top-k indices (also ``tilelang_aot.py``)."""
    q = torch.empty(tokens, heads, _D_QK, dtype=torch.bfloat16, device="meta")
    cache = torch.empty(_PAGES, 1, _D_QK, device="meta",
                        dtype=torch.bfloat16 if kv == "bf16" else torch.float8_e4m3fn)
    indices = torch.empty(tokens, 1, _TOPK, dtype=torch.int32, device="meta")
    return q, cache, indices


def _nvcc(nvcc: str, source: str, flags: list[str], includes: list[str]) -> dict[str, Any]:
    """ptxas's figures per entry function of ``source`` (registers, static smem, spills)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "k.cu")
        with open(path, "w") as handle:
            handle.write(source)
        kept = [f for f in flags if f.startswith(("-U", "-D", "--expt"))]
        ptxas = ["-v", *(f.split("=", 1)[1] for f in flags if f.startswith("--ptxas-options=")
                         and f.split("=", 1)[1] != "-v")]
        done = subprocess.run(
            [nvcc, "-arch=sm_120a", "-cubin", "-O3", "-std=c++17", "-DENABLE_BF16", "-w",
             "--expt-relaxed-constexpr", "--expt-extended-lambda", "-Xptxas", ",".join(ptxas),
             *(f"-I{i}" for i in includes), *kept, "-o", os.path.join(folder, "k.cubin"), path],
            capture_output=True, text=True, check=False)
    found: dict[str, Any] = {}
    current = None
    for line in done.stderr.splitlines():
        match = re.search(r"Compiling entry function '(\w+)' for '(\w+)'", line)
        if match:
            current = match.group(1)
            found[current] = {"registers": None, "static_smem": 0, "spill_stores": 0}
        elif current is not None:
            for field, pattern in (("registers", r"Used (\d+) registers"),
                                   ("static_smem", r"(\d+) bytes smem"),
                                   ("spill_stores", r"(\d+) bytes spill stores")):
                match = re.search(pattern, line)
                if match:
                    found[current][field] = int(match.group(1))
    if done.returncode != 0:
        found["_error"] = f"nvcc exit {done.returncode}: {done.stderr.strip()[-400:]}"
    return found


def torch_dtypes(torch: Any) -> dict[str, Any]:
    """The torch dtypes a ``[[kernel_fit]]`` entry names, by name (also ``tilelang_aot.py``)."""
    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "int32": torch.int32,
            "float8_e4m3fn": torch.float8_e4m3fn, "float16": torch.float16,
            "uint8": torch.uint8, "bool": torch.bool}


def main() -> int:
    """Read the request, run each declared dispatch, lower and compile what it picked."""
    request = json.loads(sys.stdin.read())
    sm120_device.install()
    standins.install(request.get("standins", {}))
    import tilelang
    import torch
    import tvm
    from tvm.target import Target

    dtypes = torch_dtypes(torch)
    includes = [os.path.join(os.path.dirname(tilelang.__file__), "src"),
                os.path.join(os.path.dirname(tilelang.__file__), "3rdparty", "cutlass",
                             "include")]
    target = Target({"kind": "cuda", "arch": "sm_120"})
    for fit in request["fits"]:
        module = importlib.import_module(fit["module"])
        with recording(module, dtypes) as (recorded, picked):
            dispatch = getattr(module, fit["function"])
            for kv in fit["kv"]:
                for heads in fit["heads"]:
                    for tokens in fit["tokens"]:
                        picked.clear()
                        call = {"kv": kv, "heads_per_gpu": heads, "tokens": tokens}
                        record: dict[str, Any] = {"fit": fit["id"], "call": call}
                        try:
                            dispatch(*dispatch_inputs(torch, kv, heads, tokens),
                                     sm_scale=_D_QK ** -0.5, d_v=_D_V)
                        except Exception as exc:  # the dispatch refused, or a kernel rejected
                            record["error"] = f"{type(exc).__name__}: {exc}"[:300]
                        record["kernels"] = list(dict.fromkeys(picked))
                        _emit(record)
        for key, (name, factory, args, kwargs) in recorded.items():
            out: dict[str, Any] = {"fit": fit["id"], "kernel": key, "factory": name,
                                   "arguments": [repr(a) for a in args] +
                                   [f"{k}={kwargs[k]!r}" for k in sorted(kwargs)]}
            try:
                tir = factory.get_tir(*args, **kwargs)
                with tvm.transform.PassContext(config=dict(factory.pass_configs or {})), target:
                    lowered = tilelang.lower(tir, target=target)
                figures = _nvcc(request["nvcc"], lowered.kernel_source,
                                list(factory.compile_flags or []), includes)
            except Exception as exc:  # lowering failed: reported, judged as not fitting
                _emit({**out, "error": f"{type(exc).__name__}: {exc}"[:400]})
                continue
            for global_var, function in lowered.device_mod.functions.items():
                attrs = function.attrs
                extent = {str(k): int(v) for k, v in dict(attrs["thread_extent"]).items()
                          if str(k).startswith("threadIdx")} if "thread_extent" in attrs else {}
                name_hint = str(global_var.name_hint)
                ptxas = figures.get(name_hint) or {}
                _emit({**out, "device_function": name_hint,
                       "dynamic_smem": int(attrs["dyn_shared_memory_buf"])
                       if "dyn_shared_memory_buf" in attrs else 0,
                       "static_smem": ptxas.get("static_smem"),
                       "registers": ptxas.get("registers"),
                       "spill_stores": ptxas.get("spill_stores"),
                       "threads": extent.get("threadIdx.x", 1) * extent.get("threadIdx.y", 1)
                       * extent.get("threadIdx.z", 1),
                       "error": figures.get("_error") or (None if ptxas else
                                                          f"ptxas reported no {name_hint}")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
