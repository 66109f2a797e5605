"""Issue 29 on the lent H200 machine: the host compiler nvcc runs is part of what a kernel
rebuild must match, and FlashInfer hands nvcc ``$CC``, not ``$CXX``.

There ``CC=/opt/gcc/bin/gcc`` (GCC 13.3) made other host code than GCC 12.2 here, with
byte-identical cubins (``reports/2026-12-01-h200-kernel-repro/``). The manifest named only
``$CXX``'s version, so a machine whose ``CC`` differed from its ``CXX`` recorded a compiler
that did not compile the ``.cu`` files.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from builder.kernels.build import host_compilers, rebuild_record
from builder.kernels.reproducible import FIXED_ROOT


def _compiler(tmp_path: Path, name: str, line: str) -> Path:
    """A compiler front end of its own version line that runs the real gcc otherwise."""
    script = tmp_path / name
    script.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "{line}"; exit 0; }}\n'
                      'exec gcc "$@"\n')
    script.chmod(0o755)
    return script


def test_both_host_compilers_are_named_as_the_build_would_run_them(tmp_path: Path) -> None:
    gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True,
                         check=True).stdout.splitlines()[0]
    cxx = subprocess.run(["c++", "--version"], capture_output=True, text=True,
                         check=True).stdout.splitlines()[0]
    plain = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}
    # Unset: FlashInfer links with c++, nvcc compiles the host code with gcc from PATH.
    assert host_compilers(plain) == {"host_compiler": cxx, "nvcc_host_compiler": gcc}
    cc = _compiler(tmp_path, "gcc-other", "gcc-other (Lent) 13.3.0")
    other = {**plain, "CC": str(cc), "CXX": "ccache c++"}  # a launcher word is skipped
    named = host_compilers(other)
    assert named == {"host_compiler": cxx, "nvcc_host_compiler": "gcc-other (Lent) 13.3.0"}
    record = rebuild_record("13.0.88", named, [(FIXED_ROOT, "/sglang-sm120-build")])
    assert record["nvcc_host_compiler"] == "gcc-other (Lent) 13.3.0"
    assert record["host_compiler"] == cxx
    missing = host_compilers({**plain, "CC": str(tmp_path / "no-such-gcc")})
    assert missing["nvcc_host_compiler"] == "none"
