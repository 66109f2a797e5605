"""Report the absent CUDA device to a CPU torch as one GPU of a given compute capability.

Standard library and torch only: this file runs inside a release's behaviour environment,
never inside the builder. It stands in for libcuda and the CUDA runtime, and only for the
``torch.cuda`` query functions SGLang's selection code reads; nothing of SGLang, FlashInfer
or any other Python that decides is replaced.

The figures are SM120's (RTX PRO 6000 Blackwell): 101,376 B opt-in shared memory per block
(``cudaDevAttrMaxSharedMemoryPerBlockOptin``, CUDA C Programming Guide, "Technical
Specifications per Compute Capability", compute capability 12.0), 100 KiB per SM, 65,536
registers, 1,536 threads per SM, 96 GiB.
"""

from __future__ import annotations

import os
import types

import torch

#: Opt-in shared memory per block on SM120 and SM121 (bytes).
SHARED_MEMORY_PER_BLOCK_OPTIN = 101_376

CAPABILITY = tuple(int(x) for x in os.environ.get("SM120_CAPABILITY", "12.0").split("."))
DEVICES = int(os.environ.get("SM120_DEVICES", "8"))
_TOTAL = 96 * 1024**3
_current = [0]

PROPERTIES = types.SimpleNamespace(
    name=f"NVIDIA RTX PRO 6000 Blackwell (reported as sm_{CAPABILITY[0]}{CAPABILITY[1]})",
    major=CAPABILITY[0], minor=CAPABILITY[1], total_memory=_TOTAL, multi_processor_count=188,
    warp_size=32, shared_memory_per_block=49_152,
    shared_memory_per_block_optin=SHARED_MEMORY_PER_BLOCK_OPTIN,
    shared_memory_per_multiprocessor=102_400, max_threads_per_multi_processor=1536,
    regs_per_multiprocessor=65_536, L2_cache_size=128 * 1024**2, is_integrated=False,
    is_multi_gpu_board=False, uuid="00000000-0000-0000-0000-000000000120", gcnArchName="",
    pci_bus_id=0, pci_device_id=0, pci_domain_id=0)


def _set_device(device: object) -> None:
    index = getattr(device, "index", None)
    _current[0] = int(index if index is not None else str(device).rsplit(":", 1)[-1])


def install() -> None:
    """Make ``torch.cuda`` answer as the device above (idempotent)."""
    answers: dict[str, object] = {
        "is_available": lambda: True, "device_count": lambda: DEVICES,
        "current_device": lambda: _current[0], "set_device": _set_device,
        "get_device_capability": lambda device=None: CAPABILITY,
        "get_device_name": lambda device=None: PROPERTIES.name,
        "get_device_properties": lambda device=None: PROPERTIES,
        "mem_get_info": lambda device=None: (_TOTAL - 2 * 1024**3, _TOTAL),
        "is_bf16_supported": lambda *a, **k: True, "synchronize": lambda *a, **k: None,
        "empty_cache": lambda *a, **k: None, "memory_allocated": lambda *a, **k: 0,
        "max_memory_allocated": lambda *a, **k: 0, "is_initialized": lambda: True}
    for name, answer in answers.items():
        setattr(torch.cuda, name, answer)
    setattr(torch.version, "cuda", "13.0")  # noqa: B010 (a module attribute torch types as final)
    setattr(torch.backends.cuda, "is_built", lambda: True)  # noqa: B010
