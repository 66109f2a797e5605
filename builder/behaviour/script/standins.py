"""Stand-ins for the compiled packages a CPU cannot load, nothing else.

Standard library and torch only (runs in the behaviour environment). A stood-in package
imports (``from sgl_kernel import fused_add_rmsnorm`` works) and every attribute is a
callable that raises when called, so a kernel launch fails loudly and no value can decide
anything. :data:`CALLED` records every call; the checks report it, and a behaviour whose
run called a stand-in is not trusted.

Also: the two ``torchvision::`` operator schemas its ``_C.so`` registers (PyPI has no CPU
torchvision for torch 2.13; ``torchvision/_meta_registrations.py`` needs ``nms`` and
``qnms`` to exist). The Python of torchvision stays the real one.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

CALLED: list[str] = []
_LIBRARIES: list[Any] = []  # kept alive: a dropped Library unregisters its schemas


class _Kernel:
    def __init__(self, name: str) -> None:
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        CALLED.append(self.__name__)
        raise RuntimeError(f"stand-in compiled kernel {self.__name__} was called")

    def __getattr__(self, name: str) -> _Kernel:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Kernel(f"{self.__name__}.{name}")


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> _Kernel:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Kernel(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: dict[str, str]) -> None:
        self.roots = roots

    def find_spec(self, name: str, path: Any = None, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Module(spec.name)
        module.__path__ = []
        module.__version__ = self.roots[spec.name.split(".")[0]]  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: every attribute is made on access."""


def _torchvision_ops_load() -> bool:
    """Whether the installed torchvision's compiled ops load into this torch (loading them
    registers them, as ``import torchvision`` would: ``torchvision/extension.py``)."""
    import glob
    import importlib.util
    import os

    import torch

    spec = importlib.util.find_spec("torchvision")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for library in sorted(glob.glob(os.path.join(folder, "_C*.so"))):
            try:
                getattr(torch.ops, "load_library")(library)  # noqa: B009 (untyped)
                torch.ops.torchvision.nms  # noqa: B018 (raises when the op is absent)
                return True
            except (OSError, RuntimeError, AttributeError):
                continue
    return False


def install(packages: dict[str, str]) -> None:
    """Stand in for ``packages`` (import name -> the version the release pins)."""
    import torch

    # Only where torchvision's own ops cannot load (absent, or built for another torch, as
    # in the behaviour environments): a working torchvision registers them itself, and a
    # second registration aborts the process (found in a GPU machine's real environment).
    if not _torchvision_ops_load():
        library = getattr(torch.library, "Library")("torchvision", "DEF")  # noqa: B009
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIBRARIES.append(library)
    if packages:
        sys.meta_path.insert(0, _Finder(packages))
