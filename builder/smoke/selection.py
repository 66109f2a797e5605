"""Behavioural check of SGLang's SM12x backend selection, with the device capability
reported as (12, 0) at the torch API. Standalone: the standard library and torch only.

Run it on an unpacked or installed SGLang (``--sglang-root``: the folder holding the
``sglang`` package), patched or not::

    python builder/smoke/selection.py --sglang-root site-packages --json

It calls SGLang's own selection code, read from that tree:

``moe``
    ``ModelOptNvFp4FusedMoEMethod.create_moe_runner`` with ``--moe-runner-backend auto``
    (the NVFP4 MoE runner choice), then its ``enable_flashinfer_cutlass_moe`` property.
``dsa``
    ``_dsa_kv_cache_dtype_default`` then ``_dsa_split_backend_resolution`` (the
    post-process passes of ``arg_groups/overrides.py``) for a DeepSeek-V3.2 model with
    ``--kv-cache-dtype auto`` and no DSA backend given.

A full ``import sglang.srt`` needs SGLang's compiled kernel package and dozens of
dependencies that a GPU test machine may not have, so each function is compiled from
the tree's source (``ast``) together with the module-level names of its own file that
it uses, and the few names it imports from elsewhere in SGLang are supplied here (the
``_STUBS``: a platform that is an NVIDIA CUDA device, an ``auto`` MoE runner setting, a
recorder for the runner object, a DSA model config). torch is the real one; only
``torch.cuda.get_device_capability`` (and, on a machine without a GPU,
``torch.cuda.is_available`` and ``torch.version.cuda``) report the faked device.
This is not a run on SM120 hardware: it shows which path SGLang's code takes for an
SM120 capability, nothing about the kernels on that path.

Output: one JSON object (``--json``) or lines; exit status 0 when every selection ran.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

MODELOPT = "sglang/srt/layers/quantization/modelopt_quant.py"
MOE_UTILS = "sglang/srt/layers/moe/utils.py"
COMMON = "sglang/srt/utils/common.py"
NVFP4_MOE_CLASS = "ModelOptNvFp4FusedMoEMethod"
DSA_FUNCTIONS = ("_dsa_kv_cache_dtype_default", "_dsa_split_backend_resolution")


class SelectionError(Exception):
    """The tree does not have the code this check calls."""


@dataclass
class _Source:
    path: Path
    tree: ast.Module
    defs: dict[str, ast.stmt]

    @classmethod
    def read(cls, path: Path) -> _Source:
        if not path.is_file():
            raise SelectionError(f"{path} does not exist")
        tree = ast.parse(path.read_text(), str(path))
        defs: dict[str, ast.stmt] = {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defs[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        defs[target.id] = node
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defs[node.target.id] = node
        return cls(path, tree, defs)


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _strip_decorators(node: ast.stmt) -> ast.stmt:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        node.decorator_list = [d for d in node.decorator_list
                               if isinstance(d, ast.Name) and d.id == "property"]
    return node


def _compile(source: _Source, names: list[str], namespace: dict[str, Any],
             provided: set[str]) -> None:
    """Execute ``names`` from ``source`` and the module-level definitions of the same
    file they use (transitively), in file order, into ``namespace``."""
    wanted: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in wanted or name in provided:
            continue
        node = source.defs.get(name)
        if node is None:
            continue
        wanted.add(name)
        todo.extend(_names_used(node))
    missing = [n for n in names if n not in source.defs]
    if missing:
        raise SelectionError(f"{source.path} defines no {', '.join(missing)}")
    body = [_strip_decorators(node) for node in source.tree.body
            if any(source.defs.get(n) is node for n in wanted)]
    module = ast.Module(body=list(dict.fromkeys(body)), type_ignores=[])
    exec(compile(module, str(source.path), "exec"), namespace)


def _stub_modules(entries: dict[str, dict[str, Any]]) -> None:
    """Put SGLang modules a selection function imports inside its body into sys.modules
    (with their parents), holding only the names given."""
    for dotted, attributes in entries.items():
        parts = dotted.split(".")
        for end in range(1, len(parts) + 1):
            name = ".".join(parts[:end])
            module = sys.modules.setdefault(name, types.ModuleType(name))
            if end > 1:
                setattr(sys.modules[".".join(parts[:end - 1])], parts[end - 1], module)
        for key, value in attributes.items():
            setattr(sys.modules[dotted], key, value)


class _Platform:
    """``get_platform()`` of an NVIDIA CUDA device (0.5.2x): every ``is_*`` is False but
    the CUDA ones, and the SM family follows the (faked) capability."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def __getattr__(self, name: str) -> Any:
        major = self._torch.cuda.get_device_capability()[0]
        if name in ("is_cuda", "is_cuda_alike"):
            return True
        if name.startswith("is_sm"):
            digits = name[len("is_sm"):]
            return digits.isdigit() and int(digits) // 10 == major
        if name.startswith("is_"):
            return False
        raise AttributeError(name)


def fake_capability(torch: Any, capability: tuple[int, int]) -> dict[str, Any]:
    """Report ``capability`` from ``torch.cuda.get_device_capability``; on a machine
    without a CUDA device, also report one as available. Returns what is real."""
    real: dict[str, Any] = {"cuda_available": bool(torch.cuda.is_available()),
                            "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if real["cuda_available"]:
        real["device"] = torch.cuda.get_device_name(0)
        real["capability"] = list(torch.cuda.get_device_capability(0))
    else:
        torch.cuda.is_available = lambda: True
        if torch.version.cuda is None:
            torch.version.cuda = "13.0"

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        return capability

    torch.cuda.get_device_capability = get_device_capability
    return real


class _RunnerRecorder:
    def __init__(self, backend: Any, config: Any) -> None:
        self.backend = backend


def select_moe(root: Path, torch: Any) -> dict[str, Any]:
    """The NVFP4 MoE runner ``auto`` resolves to, and whether the weights are prepared
    for the CUTLASS runner (``enable_flashinfer_cutlass_moe``)."""
    namespace: dict[str, Any] = {"torch": torch, "Enum": Enum, "__name__": "selection_moe"}
    utils = _Source.read(root / MOE_UTILS)
    exec("from typing import *\nfrom dataclasses import dataclass\n", namespace)
    _compile(utils, ["MoeRunnerBackend"], namespace, set(namespace))
    backend_enum = namespace["MoeRunnerBackend"]
    common = _Source.read(root / COMMON)
    _compile(common, ["is_cuda", "get_device_capability"], namespace, set(namespace))

    def get_moe_runner_backend() -> Any:
        return backend_enum.AUTO  # --moe-runner-backend auto, the default

    a2a = types.SimpleNamespace(is_megamoe=lambda: False, supports_aiter=lambda: False)
    namespace.update(get_moe_runner_backend=get_moe_runner_backend, MoeRunner=_RunnerRecorder,
                     get_moe_a2a_backend=lambda: a2a, MoeRunnerBackend=backend_enum)
    _stub_modules({"sglang.srt.layers.moe": {"get_moe_runner_backend": get_moe_runner_backend},
                   "sglang.srt.layers.moe.moe_runner.flashinfer_cutlass": {},
                   "sglang.srt.layers.moe.moe_runner.flashinfer_cutedsl": {}})
    modelopt = _Source.read(root / MODELOPT)
    cls = modelopt.defs.get(NVFP4_MOE_CLASS)
    if not isinstance(cls, ast.ClassDef):
        raise SelectionError(f"{modelopt.path} defines no class {NVFP4_MOE_CLASS}")
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)
               and n.name in ("create_moe_runner", "enable_flashinfer_cutlass_moe")]
    if {m.name for m in methods} != {"create_moe_runner", "enable_flashinfer_cutlass_moe"}:
        raise SelectionError(f"{NVFP4_MOE_CLASS} lacks create_moe_runner or "
                             "enable_flashinfer_cutlass_moe")
    shell = ast.parse("class Method:\n    pass\n").body[0]
    assert isinstance(shell, ast.ClassDef)
    shell.body = list[ast.stmt](methods)
    exec(compile(ast.fix_missing_locations(ast.Module(body=[shell], type_ignores=[])),
                 str(modelopt.path), "exec"), namespace)
    method = namespace["Method"]()
    method.create_moe_runner(types.SimpleNamespace(), types.SimpleNamespace(is_gated=True))
    runner = getattr(method, "runner", None)
    resolved = getattr(method, "_moe_runner_backend", None)
    return {"function": f"{MODELOPT}:{NVFP4_MOE_CLASS}.create_moe_runner",
            "setting": "--moe-runner-backend auto",
            "resolved": getattr(resolved, "value", str(resolved)),
            "runner": getattr(getattr(runner, "backend", None), "value", None),
            "enable_flashinfer_cutlass_moe": bool(method.enable_flashinfer_cutlass_moe)}


def select_dsa(root: Path, torch: Any) -> dict[str, Any]:
    """The KV cache dtype and DSA backends a DeepSeek-V3.2 model gets by default."""
    files = sorted((root / "sglang/srt").rglob("*.py"))
    source = next((_Source.read(f) for f in files
                   if "def _dsa_split_backend_resolution" in f.read_text(errors="replace")),
                  None)
    if source is None:
        raise SelectionError("no file under sglang/srt defines _dsa_split_backend_resolution")
    hf_config = types.SimpleNamespace(architectures=["DeepseekV32ForCausalLM"],
                                      learnable_sink=False)
    model_config = types.SimpleNamespace(hf_config=hf_config)
    platform = _Platform(torch)
    provided = {"torch", "logger", "get_platform", "model_config_of", "is_npu", "is_xpu",
                "is_hip", "Any", "Dict", "Optional", "List"}
    namespace: dict[str, Any] = {
        "torch": torch, "logger": logging.getLogger("selection"), "__name__": "selection_dsa",
        "get_platform": lambda: platform, "model_config_of": lambda v: v.get_model_config(),
        "is_npu": lambda: False, "is_xpu": lambda: False, "is_hip": lambda: False}
    exec("from typing import *\n", namespace)
    _stub_modules({"sglang.srt.configs.model_config": {"is_deepseek_dsa": lambda c: True}})
    _compile(source, list(DSA_FUNCTIONS), namespace, provided)
    view = types.SimpleNamespace(kv_cache_dtype="auto", dsa_prefill_backend=None,
                                 dsa_decode_backend=None, enable_hisparse=False, dcp_size=1,
                                 get_model_config=lambda: model_config)
    view.__dict__.update(namespace["_dsa_kv_cache_dtype_default"](view))
    declared = namespace["_dsa_split_backend_resolution"](view)
    return {"function": f"{source.path.relative_to(root)}:_dsa_split_backend_resolution",
            "model": "DeepseekV32ForCausalLM", "setting": "--kv-cache-dtype auto",
            "kv_cache_dtype": view.kv_cache_dtype,
            "prefill": declared.get("dsa_prefill_backend"),
            "decode": declared.get("dsa_decode_backend")}


CHECKS: dict[str, Callable[[Path, Any], dict[str, Any]]] = {"moe": select_moe,
                                                             "dsa": select_dsa}


def run(root: Path, capability: tuple[int, int], checks: list[str]) -> dict[str, Any]:
    """Fake the capability, run the selections, return the report (JSON-ready)."""
    import torch

    real = fake_capability(torch, capability)
    report: dict[str, Any] = {"sglang_root": str(root), "capability": list(capability),
                              "real": real, "faked_at": "torch.cuda.get_device_capability",
                              "sm120_hardware": False, "results": {}}
    for name in checks:
        try:
            report["results"][name] = CHECKS[name](root, torch)
        except SelectionError as exc:
            report["results"][name] = {"error": str(exc)}
    return report


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--sglang-root DIR [--capability 12.0] [--check moe,dsa] [--json]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sglang-root", type=Path, required=True,
                        help="the folder holding the sglang package (site-packages, or an "
                             "unpacked wheel)")
    parser.add_argument("--capability", default="12.0",
                        help="compute capability to report (default: %(default)s)")
    parser.add_argument("--check", default="moe,dsa", help="moe, dsa or both")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    major, minor = (int(x) for x in args.capability.split("."))
    checks = [c for c in args.check.split(",") if c]
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        parser.error(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    report = run(args.sglang_root, (major, minor), checks)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        for name, result in report["results"].items():
            print(f"{name}: {json.dumps(result, sort_keys=True)}")
    return 1 if any("error" in r for r in report["results"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
