"""Compile FlashInfer modules ahead of time with FlashInfer's own JIT spec functions.

Run by ``builder.kernels.build`` with the build environment's interpreter (where the pinned
FlashInfer is installed); the builder never imports it. Argument: one JSON object
``{"out": folder, "groups": [...], "head_dims": [...], "list": bool, "steps": bool,
"targets": [...] | null, "paths": str, "fast_build": bool}``: ``list`` names the modules,
``steps`` lists the compile steps of FlashInfer's ninja graph without running it,
``targets`` (a shard) runs only those compile steps (no link, no module copied out),
``moe_variants`` prunes the CUTLASS fused MoE modules to those dtype pairs
(:func:`prune_moe_spec`), ``paths`` (a CUDA lane) reports which module each SM120 code
path loads, ``fast_build`` compiles the CUTLASS fused MoE modules with TensorRT-LLM's
``FAST_BUILD`` (see :func:`fast_moe_spec`). Environment: FlashInfer's own variables
(``CUDA_HOME``, ``FLASHINFER_CUDA_ARCH_LIST``, ``FLASHINFER_WORKSPACE_BASE``,
``FLASHINFER_NVCC``, ``MAX_JOBS``). Compiler output goes to stderr as it happens; the
last line on stdout is one JSON object.

No GPU is needed. ``import flashinfer`` runs the package's ``__init__``, which from 0.6.8
to 0.6.18 imports ``gdn_kernels/gdn_decode_bf16_state.py``, whose module level calls
``torch.cuda.get_device_properties(0)``: with a CUDA torch on a machine without a GPU that
raises ``RuntimeError``, which FlashInfer's own import guard swallows (its release jobs
build the jit-cache so, in GPU-less CUDA containers with the arch list set explicitly); with
a CPU torch it raises ``AssertionError`` and the import fails. The spec functions live in
``flashinfer.jit`` and need none of that public API, so this driver registers the
``flashinfer`` package without running its ``__init__`` and imports only the submodules it
uses. FlashInfer's files are not touched.
"""

import ast
import importlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Compiler output (ninja writes to stdout) joins stderr; stdout keeps only the result.
_RESULT_FD = os.dup(1)
os.dup2(2, 1)


def register_package() -> str:
    """Register ``flashinfer`` in ``sys.modules`` without executing its ``__init__``.

    Returns:
        The installed ``flashinfer-python`` version (from its metadata).
    """
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("flashinfer-python is not installed in this environment")
    # A package object with FlashInfer's search path: its submodules import normally.
    sys.modules["flashinfer"] = importlib.util.module_from_spec(spec)
    return importlib.metadata.version("flashinfer-python")


def _sm_group(prefix: str, module: Any, pattern: str,
              make: Callable[[Callable[..., Any]], Any] = lambda f: f()
              ) -> Callable[[str], list[Any]]:
    def specs(group: str) -> list[Any]:
        sm = group[len(prefix):]
        function = getattr(module, pattern.format(sm=sm), None)
        if function is None:
            raise KeyError(group)
        return [make(function)]
    return specs


def _attention(head_dims: list[int]) -> list[Any]:
    """The FA2 prefill and decode modules for each head dim, bf16 and fp16, and the FA3
    prefill modules too where the arch list has an SM90 arch: on such a GPU FlashInfer's
    ``auto`` backend, which SGLang's ragged prefill wrapper asks for, picks FA3
    (``determine_attention_backend`` in ``flashinfer/utils.py``), and FlashInfer's own AOT
    list builds FA3 exactly then (``gen_all_modules`` in ``flashinfer/aot.py``, ``if
    has_sm90``; 0.6.14). On SM12x it picks FA2: an SM12x-only build holds FA2 alone."""
    import torch
    from flashinfer import aot

    archs = os.environ.get("FLASHINFER_CUDA_ARCH_LIST", "").split()
    sm90 = any(arch.startswith("9.0") for arch in archs)
    found: list[Any] = []
    for head_dim in head_dims:
        for dtype in (torch.bfloat16, torch.float16):
            generated: Iterator[Any] = aot.gen_fa2(dtype, dtype, head_dim, head_dim,
                                                   False, False)
            found += list(generated)
            if sm90:
                found += list(aot.gen_fa3(dtype, dtype, dtype, head_dim, head_dim,
                                          False, False))
    return found


def fast_moe_spec(function: Callable[..., Any]) -> Any:
    """A CUTLASS fused MoE spec built with ``FAST_BUILD`` in host and device code.

    FlashInfer's own ``use_fast_build=True`` (``jit/fused_moe.py``, 0.6.3 to 0.7.2) puts
    ``-DFAST_BUILD`` in ``extra_cflags``, which reach only the C++ files: the tactic
    heuristic (``cutlass_heuristic.cpp``) then offers the CTA shape 128x128 alone, but every
    ``.cu`` file still instantiates every CTA and cluster shape, so nothing compiles faster.
    TensorRT-LLM's ``FAST_BUILD`` filters those instantiations in device code
    (``should_filter_tma_warp_specialized_gemm_problem_shape`` in ``cutlass_heuristic.h``):
    adding the macro to the CUDA flags too is what makes the build fast. What it leaves out:
    every TMA warp-specialised grouped GEMM but CTA 128x128 with cluster 1x1x1 (no
    cooperative schedule, no multicast, no dynamic cluster), so the autotuner chooses
    among a few tactics only. For smoke tests, never for release.
    """
    spec = function(use_fast_build=True)
    spec.extra_cuda_cflags = [*(spec.extra_cuda_cflags or []), "-DFAST_BUILD"]
    return spec


def _prune_rules() -> Any:
    """The builder's ``kernels/prune.py`` (standard library only), loaded by path: the one
    owner of the pruning rule, also where the builder itself is not installed."""
    path = Path(__file__).resolve().parent.parent / "prune.py"
    spec = importlib.util.spec_from_file_location("sm120_builder_prune", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def prune_moe_spec(spec: Any, variants: list[str], version: str) -> dict[str, Any]:
    """Rewrite a CUTLASS fused MoE spec's sources to keep only ``variants``' dtype pairs
    (``prune.plan_sources``): pruned units become stubs written beside FlashInfer's
    generated sources, launcher files only they call are left out.

    Raises:
        PruneError: the variants have no rule, or this FlashInfer's ``MoeGemmRunner`` was
            not checked (``prune.check_header``).
    """
    from flashinfer.jit import env as jit_env

    prune = _prune_rules()
    prune.check_header(version, (Path(jit_env.FLASHINFER_CSRC_DIR) / prune.HEADER).read_bytes())
    kept = prune.kept_units(variants)
    compiled, stubbed, dropped = prune.plan_sources(list(spec.sources), kept)
    folder = Path(jit_env.FLASHINFER_GEN_SRC_DIR) / "sm120_pruned" / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    stubs = {}
    for source in stubbed:
        unit = prune.unit_of(source)
        stub = folder / f"moe_gemm_kernels_{unit}.pruned.cu"
        stub.write_text(prune.stub_source(source.read_text(), unit, kept))
        stubs[source] = stub
    keep = set(compiled)
    spec.sources = [stubs.get(s, s) for s in spec.sources if s in keep or s in stubs]
    return {"variants": list(variants), "kept_units": list(kept),
            "stubbed": sorted(s.name for s in stubbed),
            "dropped": sorted(s.name for s in dropped)}


def undefined_runner_symbols(library: Path) -> list[str]:
    """The MoE GEMM runners (``MoeGemmRunner<...>`` members) and generated launchers
    (namespace ``cutlass_kernels_oss``) ``library`` uses but does not define (``nm``): what
    a wrong prune would leave, failing at load or at the first call. Nothing else: only
    these are what pruning stubs or leaves out."""
    done = subprocess.run(["nm", "-D", "-C", "--undefined-only", str(library)],
                          capture_output=True, text=True, check=True)
    return [line.split(None, 1)[-1] for line in done.stdout.splitlines()
            if "tensorrt_llm::" in line and ("MoeGemmRunner<" in line
                                              or "cutlass_kernels_oss::" in line)]


def specs_for(group: str, head_dims: list[int], fast_build: bool = False) -> list[Any]:
    """FlashInfer's JitSpecs for one module group (raises KeyError for an unknown one);
    ``fast_build`` builds the fused MoE groups with :func:`fast_moe_spec`."""
    from flashinfer.jit import (
        activation,
        fp4_quantization,
        fused_moe,
        gemm,
        norm,
        page,
        rope,
        sampling,
        tllm_utils,
    )

    fixed = {
        "norm": lambda: [norm.gen_norm_module()],
        "sampling": lambda: [sampling.gen_sampling_module()],
        "rope": lambda: [rope.gen_rope_module()],
        "page": lambda: [page.gen_page_module()],
        "activation": lambda: [activation.gen_act_and_mul_module(name)
                               for name in ("silu", "gelu", "gelu_tanh")],
        "attention": lambda: _attention(head_dims),
        "trtllm_utils": lambda: [tllm_utils.gen_trtllm_utils_module()],
    }
    if group in fixed:
        return fixed[group]()
    if group.startswith("fused_moe_sm"):
        return _sm_group("fused_moe_sm", fused_moe, "gen_cutlass_fused_moe_sm{sm}_module",
                         fast_moe_spec if fast_build else lambda f: f())(group)
    if group.startswith("fp4_quantization_sm"):
        return _sm_group("fp4_quantization_sm", fp4_quantization,
                         "gen_fp4_quantization_sm{sm}_module")(group)
    if group.startswith("fp4_gemm_sm"):
        return _sm_group("fp4_gemm_sm", gemm, "gen_gemm_sm{sm}_module_cutlass_fp4")(group)
    raise KeyError(group)


# --- the SM120 code paths: which modules FlashInfer itself loads -------------------------

#: (path, module holding the caller, the loader it must call, module holding the loader,
#: the loader's arguments on SM120). Module names are tried in order (files moved between
#: releases); a loader ``a|b`` means ``a`` where it exists, else ``b`` (FlashInfer 0.5.3 calls
#: the SM120 FP4 GEMM getter directly, later releases through a dispatcher). The modules
#: SGLang's NVFP4 MoE path with ``flashinfer_cutlass`` loads on an
#: SM120 GPU: the CUTLASS fused MoE, the FP4 activation quantization, the FP4 GEMM of the
#: dense linears, and the autotuner's ``delay_kernel`` (module ``trtllm_utils``), which it
#: calls while profiling every tactic.
PATHS: list[tuple[str, tuple[str, ...], str, tuple[str, ...], tuple[Any, ...]]] = [
    ("moe", ("flashinfer.fused_moe.core",), "get_cutlass_fused_moe_module",
     ("flashinfer.fused_moe.core",), ("120",)),
    ("fp4_quantization", ("flashinfer.quantization.fp4_quantization",
                          "flashinfer.fp4_quantization"), "get_fp4_quantization_module",
     ("flashinfer.quantization.fp4_quantization", "flashinfer.fp4_quantization"), ("120",)),
    ("fp4_gemm", ("flashinfer.gemm.gemm_base", "flashinfer.gemm"),
     "get_cutlass_fp4_gemm_module|get_gemm_sm120_module_cutlass_fp4",
     ("flashinfer.gemm.gemm_base", "flashinfer.gemm"), (12, 0)),
    ("autotune", ("flashinfer.autotuner.autotuner", "flashinfer.autotuner"), "delay_kernel",
     ("flashinfer.tllm_utils",), (100,)),
]


class _Loaded(Exception):
    """Raised by the recording ``build_and_load``: the loader asked for this module."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _first_module(names: tuple[str, ...]) -> Any:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(f"none of {', '.join(names)}")


def _calls(module: Any, function: str) -> bool:
    """Whether ``module``'s source calls ``function`` (read with ast)."""
    tree = ast.parse(Path(module.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callee = node.func
            name = callee.id if isinstance(callee, ast.Name) else \
                callee.attr if isinstance(callee, ast.Attribute) else None
            if name == function:
                return True
    return False


def sm120_paths(lane: str) -> dict[str, Any]:
    """For each path: does the caller still call the loader (in the source), and which
    module does the loader load for an SM120 GPU (FlashInfer's own code, with
    ``build_and_load`` recording the module's name instead of compiling)."""
    import torch
    from flashinfer.jit import core

    # The FP4 quantization picks 120f from torch's CUDA version (>= 12.9): the serving
    # torch's, which is the lane's.
    torch.version.cuda = lane

    def record(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise _Loaded(self.name)

    core.JitSpec.build_and_load = record
    found: dict[str, Any] = {}
    for path, callers, loader, homes, arguments in PATHS:
        entry: dict[str, Any] = {"loader": loader}
        try:
            caller, home = _first_module(callers), _first_module(homes)
            # The first alternative this release has; the SM120 getter takes no arguments.
            name = next((n for n in loader.split("|") if hasattr(home, n)), loader)
            if name != loader.split("|")[0]:
                arguments = ()
            entry.update(loader=name, caller=caller.__name__,
                         calls_loader=_calls(caller, name))
            getattr(home, name)(*arguments)
            entry["error"] = f"{name}{arguments} loaded no module"
        except _Loaded as loaded:
            entry["module"] = loaded.name
        except Exception as error:
            entry["error"] = f"{type(error).__name__}: {error}"
        found[path] = entry
    return found


#: FlashInfer's ninja rules that compile one translation unit (``jit/cpp_ext.py``); every
#: other rule links.
_COMPILE_RULES = ("compile", "cuda_compile")


class _Ninja:
    """Stands in for FlashInfer's ``run_ninja``: the graph FlashInfer wrote is listed, then
    built whole or only for some compile steps, and each step's time read from ninja's log."""

    def __init__(self, mode: str, targets: list[str] | None) -> None:
        self.mode = mode  # "build", "steps" (list only) or "shard"
        self.targets = targets or []
        self.steps: dict[str, str] = {}  # step (relative to the workdir) -> rule
        self.seconds: dict[str, float] = {}
        self.workdir: Path | None = None
        self.max_jobs: int | None = None

    def __call__(self, workdir: Path, ninja_file: Path, verbose: bool,
                 max_jobs: int | None = None) -> None:
        # FlashInfer 0.7 passes max_jobs (jit/cpp_ext.py run_ninja); older ones read MAX_JOBS.
        self.max_jobs = max_jobs
        self.workdir = workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        base = ["ninja", "-C", str(self.workdir), "-f", str(ninja_file.resolve())]
        listed = subprocess.run([*base, "-t", "targets", "all"], capture_output=True,
                                text=True, check=True).stdout
        for line in listed.splitlines():
            output, _, rule = line.rpartition(": ")
            if rule != "phony" and output:
                self.steps[self._name(output)] = rule
        if self.mode == "steps":
            return
        jobs = str(self.max_jobs) if self.max_jobs else os.environ.get("MAX_JOBS", "1")
        command = [*base, "-v", "-j", jobs]
        if self.mode == "shard":
            unknown = sorted(set(self.targets) - set(self.steps))
            if unknown:
                raise RuntimeError(f"not steps of this graph: {', '.join(unknown[:5])}")
            if not self.targets:
                return
            command += [str(self.workdir / t) for t in sorted(self.targets)]
        sys.stdout.flush()
        sys.stderr.flush()
        subprocess.run(command, cwd=str(self.workdir), check=True)
        self.seconds = self._log()

    def _name(self, output: str) -> str:
        assert self.workdir is not None
        path = Path(output)
        return path.relative_to(self.workdir).as_posix() if path.is_absolute() and \
            path.is_relative_to(self.workdir) else output

    def _log(self) -> dict[str, float]:
        """Seconds per step of this run, from ``.ninja_log`` (start and end in ms)."""
        assert self.workdir is not None
        found: dict[str, float] = {}
        log = self.workdir / ".ninja_log"
        for line in log.read_text().splitlines() if log.exists() else ():
            fields = line.split("\t")
            if line.startswith("#") or len(fields) < 4:
                continue
            found[self._name(fields[3])] = round((int(fields[1]) - int(fields[0])) / 1000, 3)
        return found


def _emit(result: dict[str, Any]) -> None:
    os.write(_RESULT_FD, (json.dumps(result) + "\n").encode())


def main() -> None:
    request = json.loads(sys.argv[1])
    out = Path(request.get("out", "."))
    head_dims = [int(h) for h in request.get("head_dims", [])]
    version = register_package()
    if request.get("paths"):
        _emit({"flashinfer": version, "paths": sm120_paths(str(request["paths"]))})
        return
    table = {}
    for group in request["groups"]:
        try:
            table[group] = specs_for(group, head_dims, bool(request.get("fast_build")))
        except (KeyError, AttributeError):
            _emit({"error": f"FlashInfer {version} has no module group {group!r}"})
            sys.exit(2)
    variants = [str(v) for v in request.get("moe_variants") or ()]
    pruned: dict[str, dict[str, Any]] = {}
    if variants:
        for group, specs in table.items():
            if not group.startswith("fused_moe_sm"):
                continue
            for spec in specs:
                try:
                    pruned[spec.name] = prune_moe_spec(spec, variants, version)
                except ValueError as error:  # prune.PruneError
                    _emit({"error": f"pruning {spec.name}: {error}"})
                    sys.exit(2)
    if request.get("list"):
        _emit({"flashinfer": version,
               "groups": {g: [s.name for s in specs] for g, specs in table.items()},
               "pruned": pruned})
        return
    # Every module (deduplicated by name) in one ninja graph, through FlashInfer's own
    # build_jit_specs: translation units of different modules compile in parallel.
    unique: dict[str, tuple[str, Any]] = {}
    for group, specs in table.items():
        for spec in specs:
            unique.setdefault(spec.name, (group, spec))
    mode = "steps" if request.get("steps") else \
        "shard" if request.get("targets") is not None else "build"
    if mode != "steps":
        print(f"[sm120-builder] building {', '.join(unique)}"
              + (f" ({len(request['targets'])} compile steps of a shard)"
                 if mode == "shard" else ""), file=sys.stderr, flush=True)
    start = time.monotonic()
    import flashinfer.jit.core as core

    # FlashInfer writes the ninja graph and runs it; we run it (all of it, or a shard's
    # compile steps) to know its steps and their times.
    ninja = _Ninja(mode, request.get("targets"))
    core.run_ninja = ninja
    core.build_jit_specs([spec for _group, spec in unique.values()], verbose=True,
                         skip_prebuilt=False)
    seconds = round(time.monotonic() - start, 1)
    steps = {name: {"rule": rule, "compile": rule in _COMPILE_RULES}
             for name, rule in sorted(ninja.steps.items())}
    if mode != "build":
        _emit({"flashinfer": version, "steps": steps, "pruned": pruned,
               "step_seconds": ninja.seconds, "seconds": seconds})
        return
    built: dict[str, dict[str, Any]] = {}
    for name, (group, spec) in unique.items():
        target = out / name / f"{name}.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(spec.jit_library_path, target)
        built[name] = {"group": group, "path": f"{name}/{name}.so",
                       "cuda_cflags": list(spec.extra_cuda_cflags or []),
                       "cflags": list(spec.extra_cflags or [])}
        if name in pruned:
            missing = undefined_runner_symbols(target)
            if missing:
                _emit({"error": f"the pruned {name}.so uses {len(missing)} MoE GEMM "
                                f"runner/launcher symbols it does not define, e.g. "
                                f"{missing[0]} (the prune rule left out a unit a kept "
                                "one calls)"})
                sys.exit(2)
            built[name]["pruned"] = pruned[name]
    _emit({"flashinfer": version, "modules": built, "seconds": seconds,
           "steps": steps, "step_seconds": ninja.seconds})


if __name__ == "__main__":
    main()
