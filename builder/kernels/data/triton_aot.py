"""Compile Triton kernels into Triton's on-disk cache for a GPU this machine does not have.

Runs inside a release's behaviour environment (its pinned triton and sglang; standard
library, torch, triton and sglang only, plus the behaviour scripts' ``standins``). No GPU:
Triton's active driver is replaced by one that reports the target (``GPUTarget("cuda",
ARCH, 32)``, device 0, stream 0), so the JIT computes the same cache key as a launch on such
a GPU, and every compile stage (TTIR, TTGIR, LLVM IR, PTX, and the cubin from the ptxas that
triton bundles) runs on the CPU.

Input (stdin, JSON)::

    {"arch": 90, "specs": ["<specialization JSON>", ...], "standins": {...},
     "standins_path": "<folder of standins.py>", "mode": "build"}

A spec is Triton's own serialization of one launch's specialization
(``triton.runtime.jit.serialize_specialization_data`` of triton 3.9: kernel name, signature,
constexprs, attributes, options, target; of triton 3.6 the same without the target), as
Triton hands it to ``knobs.runtime.jit_cache_hook``. ``build`` compiles each through the
kernel's own ``JITFunction.preload`` into ``TRITON_CACHE_DIR``; a spec recorded for another arch is
retargeted (its target replaced, and the options Triton derives from the target dropped, so
``parse_options`` derives them again as a launch on the target would), and its extern
libraries, named by the recording machine's paths, are taken from this triton.

``launch`` (for checks) runs the JIT's launch path (``JITFunction.run`` with ``warmup``: key,
cache lookup, compile on a miss; everything but the GPU launch) for each spec's kernel with
the arguments a spec lists under ``"args"`` in the request, and reports each compile event
Triton's ``knobs.compilation.listener`` sees (``cache_hit`` true or false).

``record`` (for checks) does the same and reports the specialization data the JIT hook got,
without compiling.

An arch the ptxas triton runs does not know is refused before anything compiles: the
closing record alone, with ``unknown_arch``.

Output: ``TRITONAOT {json}`` lines, one per spec or launch, and ``TRITONAOT-DONE {json}``
(triton version, the Python, the ptxas versions, the cache-invalidating environment variables
set). The Python matters: ``triton_key()`` hashes ``libtriton``'s bytes, which differ between
a triton's wheels for two Pythons.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from typing import Any

_PREFIX = "TRITONAOT "
#: CUDAOptions fields ``CUDABackend.parse_options`` (triton 3.9 and 3.6) derives from the
#: target when absent: dropped from a spec recorded on another arch.
_DERIVED = ("arch", "supported_fp8_dtypes", "deprecated_fp8_dot_operand_dtypes",
            "max_num_imprecise_acc_default")


def _emit(record: dict[str, Any], prefix: str = _PREFIX) -> None:
    print(prefix + json.dumps(record, sort_keys=True), flush=True)


def _install_driver(arch: int) -> None:
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.runtime.driver import driver

    class TargetOnly(DriverBase):  # type: ignore[misc]
        """A driver that reports the target GPU and launches nothing."""

        @classmethod
        def is_active(cls) -> bool:
            return True

        def __init__(self) -> None:
            pass

        def get_current_target(self) -> Any:
            return GPUTarget("cuda", arch, 32)

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_active_torch_device(self) -> Any:
            return torch.device("cpu")

        def map_python_to_cpp_type(self, ty: str) -> str:
            return ty

        def get_benchmarker(self) -> Any:
            raise RuntimeError("no GPU: nothing is benchmarked")

        def get_device_interface(self) -> Any:
            raise RuntimeError("no GPU")

        def get_empty_cache_for_benchmark(self) -> Any:
            raise RuntimeError("no GPU")

        def clear_cache(self, cache: Any) -> None:
            pass

    driver.set_active(TargetOnly())


def _report_device(arch: int) -> None:
    """Where torch sees no GPU, make ``torch.cuda`` answer as one GPU of ``arch``.

    A kernel's module may read the device when it is imported: SGLang 0.5.16's
    ``sglang/kernels/ops/attention/fla/utils.py`` calls ``torch.cuda.get_device_name(0)`` at
    import, and importing ``sglang.kernels.ops.moe`` (``fused_moe_kernel``'s package) imports
    it, so without a GPU that kernel never compiled (run 5 of the derived-serving report: 30
    of 38 recorded specializations). The behaviour scripts' ``sm120_device`` (beside the
    stand-ins, on ``sys.path``) answers with the target's capability, so a module-level value
    a kernel reads (Triton keys the globals a kernel uses) is the one the target GPU gives.
    """
    import torch
    if torch.cuda.is_available():
        return
    os.environ["SM120_CAPABILITY"] = f"{arch // 10}.{arch % 10}"
    os.environ["SM120_DEVICES"] = "1"
    import sm120_device  # the behaviour scripts' (on sys.path with the stand-ins)
    sm120_device.install()


def _ptxas_refuses(arch: int) -> dict[str, Any] | None:
    """Whether the ptxas this triton runs for ``arch`` refuses its SASS name: then
    ``{"arch": "sm_999a", "ptxas": path, "known": [...]}`` (every compile would fail), else
    None. The names are the ``--gpu-name`` values ``ptxas --help`` lists (triton picks the
    ptxas and the name: ``get_ptxas`` and ``sm_arch_from_capability``, triton 3.6 and 3.9)."""
    import re
    import subprocess

    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    name = sm_arch_from_capability(arch)
    ptxas = get_ptxas(arch).path
    text = subprocess.run([ptxas, "--help"], capture_output=True, text=True,
                          check=False).stdout
    start = text.find("--gpu-name")
    end = text.find("\n--", start + 1)
    known = re.findall(r"'(sm_\d+[af]?)'", text[start:end if end > 0 else None])
    if start < 0 or not known or name in known:
        return None  # a help text not as expected is no reason to refuse
    return {"arch": name, "ptxas": ptxas, "known": known}


def _kernel(name: str) -> Any:
    """The JITFunction named ``module.qualname`` (Triton's ``get_full_name``)."""
    from triton.runtime.jit import JITFunction

    parts = name.split(".")
    first: ImportError | None = None  # the deepest module's: why a package's getattr fails
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError as error:
            first = first or error
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute) and first is not None:
                raise ImportError(f"{name}: {type(first).__name__}: {first}") from first
            found = getattr(found, attribute)
        while not isinstance(found, JITFunction) and hasattr(found, "fn"):
            found = found.fn  # an Autotuner or Heuristics wraps the JITFunction
        return found
    raise ImportError(f"no module of {name} imports")


def retarget(spec: str, arch: int) -> tuple[str, bool]:
    """``spec`` for ``GPUTarget("cuda", arch, 32)``; True when it was recorded for another.

    Two formats: triton 3.9's ``serialize_specialization_data`` writes the ``target``, which
    its ``JITFunction.preload`` compiles for; triton 3.6's writes none (its ``preload``
    compiles for the active driver's target), and the recorded ``options["arch"]``
    (``"sm90"``, which ``CUDABackend.parse_options`` lets override the target's) says what
    it was recorded on. Either way a spec of another arch loses the options Triton derives
    from the target (:data:`_DERIVED`, the same in 3.6 and 3.9).
    """
    data = json.loads(spec)
    target = {"backend": "cuda", "arch": arch, "warp_size": 32}
    if "target" in data:
        if data["target"] == target:
            return spec, False
        data["target"] = target
    elif data["options"].get("arch") in (None, f"sm{arch}"):
        return spec, False
    data["options"] = {k: v for k, v in data["options"].items() if k not in _DERIVED}
    return json.dumps(data), True


def localize(spec: str, root: str) -> str:
    """``spec`` with its ``extern_libs`` found here.

    A spec names its extern libraries (``libdevice``) by the recording machine's absolute
    path, e.g. ``/opt/torch/.venv/lib/python3.12/site-packages/triton/backends/nvidia/lib/
    libdevice.10.bc`` in SGLang 0.5.16's H200 records. The key hashes their content, not
    the path (``CUDAOptions.hash``, triton 3.6 and 3.9: ``file_hash`` of each), so a path
    missing here is replaced by the same file below ``root``, this triton's package folder
    (the same triton version ships the same bytes). Other paths are kept.
    """
    data = json.loads(spec)
    libs = data.get("options", {}).get("extern_libs")
    if not libs:
        return spec
    moved = []
    for name, path in libs:
        if not os.path.exists(path) and "/triton/" in path:
            here = os.path.join(root, path.rsplit("/triton/", 1)[1])
            path = here if os.path.exists(here) else path
        moved.append([name, path])
    if moved == [list(lib) for lib in libs]:
        return spec
    data["options"]["extern_libs"] = moved
    return json.dumps(data)


def _tensor(text: dict[str, Any]) -> Any:
    import torch
    return torch.zeros(text["shape"], dtype=getattr(torch, text["dtype"]))


def _args(values: list[Any]) -> list[Any]:
    return [_tensor(v) if isinstance(v, dict) and "dtype" in v else v for v in values]


def main() -> int:
    request = json.loads(sys.stdin.read())
    sys.path.insert(0, request["standins_path"])
    import standins  # the behaviour scripts' stand-ins (on sys.path just above)
    standins.install(request.get("standins", {}))
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.nvidia.compiler import get_ptxas_version

    arch = int(request["arch"])
    _install_driver(arch)
    _report_device(arch)
    events: list[dict[str, Any]] = []

    def listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any,
                 cache_hit: bool) -> None:
        events.append({"kernel": src.name, "cache_hit": cache_hit, "hash": metadata["hash"],
                       "us": times.total})

    triton.knobs.compilation.listener = listener
    mode = request.get("mode", "build")
    failed = 0
    refused = _ptxas_refuses(arch) if mode == "build" else None
    if refused:
        _emit({"triton": triton.__version__, "arch": arch, "failed": 0,
               "unknown_arch": refused}, "TRITONAOT-DONE ")
        return 0
    if mode == "build":
        for spec in request["specs"]:
            name = json.loads(spec)["name"]
            events.clear()
            start = time.monotonic()
            try:
                text, moved = retarget(localize(spec, os.path.dirname(triton.__file__)),
                                        arch)
                _kernel(name).preload(text)
                _emit({"kernel": name, "ok": True, "retargeted": moved, "events": list(events),
                       "seconds": round(time.monotonic() - start, 3)})
            except Exception as error:  # one kernel's failure is reported, the rest built
                failed += 1
                # the innermost frames: where it broke (an import, a kernel's own check)
                _emit({"kernel": name, "ok": False, "error": f"{type(error).__name__}: {error}",
                       "trace": traceback.format_exc(limit=-6)})
    else:
        recorded: list[str] = []
        if mode == "record":
            def hook(**kwargs: Any) -> bool:
                recorded.append(kwargs["compile"]["specialization_data"])
                return True  # recorded only: nothing compiles
            triton.knobs.runtime.jit_cache_hook = hook
        for launch in request["launches"]:
            events.clear()
            recorded.clear()
            _kernel(launch["kernel"]).warmup(*_args(launch["args"]),
                                             grid=tuple(launch["grid"]))
            _emit({"kernel": launch["kernel"], "events": list(events), "specs": list(recorded)})
    _emit({"triton": triton.__version__, "arch": arch, "failed": failed,
           "python": "{}.{}".format(*sys.version_info[:2]),
           "ptxas": {str(a): get_ptxas_version(a).strip().splitlines()[-1] for a in (80, arch)},
           "env": get_cache_invalidating_env_vars(),
           "cache_dir": os.environ.get("TRITON_CACHE_DIR", "")}, "TRITONAOT-DONE ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
