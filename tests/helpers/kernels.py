"""The kernel build tests' shared arguments."""

from __future__ import annotations

TARGET = ["--target", "sglang-0.5.9", "--cuda-lane", "13.0"]


# The CPU build of torch on this machine class's disk: enough to compile (FlashInfer
# imports torch for its dtypes), and no multi-GB CUDA download.
TORCH = ["--build-torch", "torch==2.13.0"]
