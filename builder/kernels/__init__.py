"""Kernel stage: FlashInfer's modules compiled ahead of time for sm_120, as a wheel.

* :mod:`~builder.kernels.pins` -- lockstep pins read from the source, the SM120 arch.
* :mod:`~builder.kernels.request` -- what to build
  (:func:`~builder.kernels.request.kernel_request`).
* :mod:`~builder.kernels.preflight` -- a toolchain check before any compile.
* :mod:`~builder.kernels.toolchain` -- nvcc, the CUDA wheels and the build environment.
* :mod:`~builder.kernels.build` -- the compile, the SASS check and the wheel.
* :mod:`~builder.kernels.jitcache` -- the ``flashinfer_jit_cache`` wheel's layout.
* :mod:`~builder.kernels.container` -- the same build inside a CUDA build container.
* :mod:`~builder.kernels.run` -- :func:`~builder.kernels.run.run_kernels` for a target.
"""

from builder.kernels.build import KernelResult
from builder.kernels.request import KernelOptions
from builder.kernels.run import run_kernels

__all__ = ["KernelOptions", "KernelResult", "run_kernels"]
