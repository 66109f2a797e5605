"""Kernel fit: the kernels a patch selects on SM12x, compiled for sm_120, held to its limits.

For each ``[[kernel_fit]]`` of the series (:class:`builder.patching.series.KernelFit`),
``script/kernel_fit.py`` runs the release's own dispatch in its behaviour environment with
the device reported as SM120, records the TileLang kernels it picks, lowers each with the
release's pinned tilelang for sm_120 and compiles it with nvcc (no GPU needed). Here each
kernel's figures are judged against :data:`SM120`. Observations are cached under everything
they depend on (environment, code, tilelang, nvcc, script, declaration): a second run
compiles nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.behaviour.env import SIZES, BehaviourEnv, pip_failure
from builder.core.arch import SM120 as SM120_TEXT
from builder.core.cache import Cache, sha256_file, sha256_json
from builder.core.errors import BuildError, MissingToolError, PatchError
from builder.core.progress import Reporter
from builder.core.wheelmeta import requires_dist, wheel_metadata
from builder.patching.series import KernelFit, Series, SeriesEntry

SCRIPT = Path(__file__).parent / "script" / "kernel_fit.py"
_PREFIX = "KERNELFIT "


@dataclass(frozen=True)
class Limits:
    """What one thread block may use on a GPU.

    Attributes:
        smem_per_block: dynamic plus static shared memory per block, opt-in (bytes).
        registers_per_block: 32-bit registers per block.
        registers_per_thread: 32-bit registers per thread.
        threads_per_block: threads per block.
    """

    smem_per_block: int
    registers_per_block: int
    registers_per_thread: int
    threads_per_block: int


#: SM120 and SM121 (RTX PRO 6000 Blackwell, RTX 5090, DGX Spark): CUDA C++ Programming Guide
#: (CUDA 13.0), "Technical Specifications per Compute Capability", compute capability 12.x:
#: maximum shared memory per thread block 99 KB (101,376 B, the opt-in
#: ``cudaDevAttrMaxSharedMemoryPerBlockOptin``), 64 K registers per block, 255 per thread,
#: 1,024 threads per block.
SM120 = Limits(smem_per_block=101_376, registers_per_block=65_536, registers_per_thread=255,
               threads_per_block=1_024)


@dataclass(frozen=True)
class KernelFigures:
    """One compiled kernel and its verdict.

    Attributes:
        factory: the ``@tilelang.jit`` factory the dispatch called.
        arguments: its arguments, as ``repr`` shows them.
        dynamic_smem: dynamic shared memory TileLang's lowering declares (bytes).
        static_smem: static shared memory ptxas reports (bytes).
        registers: registers per thread ptxas reports.
        threads: threads per block (the lowered thread extent).
        spill_stores: bytes of register spill stores ptxas reports.
        misses: each limit it breaks, as ``what figure > limit`` (empty: it fits).
    """

    factory: str
    arguments: tuple[str, ...]
    dynamic_smem: int
    static_smem: int | None
    registers: int | None
    threads: int
    spill_stores: int | None
    misses: tuple[str, ...]

    @property
    def fits(self) -> bool:
        """Within every limit."""
        return not self.misses

    def describe(self) -> str:
        """``factory(arguments)``."""
        return f"{self.factory}({', '.join(self.arguments)})"

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {"factory": self.factory, "arguments": list(self.arguments),
                "dynamic_smem": self.dynamic_smem, "static_smem": self.static_smem,
                "registers": self.registers, "threads": self.threads,
                "spill_stores": self.spill_stores, "fits": self.fits,
                "misses": list(self.misses)}


def judge(record: dict[str, Any], limits: Limits = SM120) -> KernelFigures:
    """The verdict on one kernel record of the script.

    A kernel whose figures are missing (lowering or nvcc failed) does not fit.
    """
    misses = []
    dynamic, static = int(record.get("dynamic_smem") or 0), record.get("static_smem")
    registers, threads = record.get("registers"), int(record.get("threads") or 0)
    if record.get("error"):
        misses.append(f"not compiled: {record['error']}")
    smem = dynamic + (static or 0)
    if smem > limits.smem_per_block:
        misses.append(f"shared memory {smem:,} B (dynamic {dynamic:,} + static "
                      f"{static or 0:,}) > {limits.smem_per_block:,} B")
    if threads > limits.threads_per_block:
        misses.append(f"threads {threads:,} > {limits.threads_per_block:,}")
    if registers is not None:
        if registers > limits.registers_per_thread:
            misses.append(f"registers {registers} per thread > {limits.registers_per_thread}")
        if registers * threads > limits.registers_per_block:
            misses.append(f"registers {registers} x {threads} threads = "
                          f"{registers * threads:,} > {limits.registers_per_block:,}")
    return KernelFigures(str(record.get("factory")), tuple(record.get("arguments") or ()),
                         dynamic, static, registers, threads, record.get("spill_stores"),
                         tuple(misses))


@dataclass(frozen=True)
class FitResult:
    """One declaration on one code (upstream's or the patched).

    Attributes:
        patch: the patch that declares it.
        fit: the declaration.
        code: ``upstream`` or ``patched``.
        kernels: every kernel the dispatch picked, judged.
        refused: the dispatch calls that raised, as ``call: error``.
    """

    patch: str
    fit: KernelFit
    code: str
    kernels: tuple[KernelFigures, ...]
    refused: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        """Some kernel was picked, every one fits, and no dispatch call was refused."""
        return bool(self.kernels) and not self.refused and all(k.fits for k in self.kernels)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {"patch": self.patch, "name": self.fit.name, "code": self.code,
                "dispatch": f"{self.fit.module}:{self.fit.function}", "fits": self.fits,
                "refused": list(self.refused), "kernels": [k.to_json() for k in self.kernels]}


@dataclass
class FitReport:
    """The kernel fit of a target: each declaration on upstream's and the patched code."""

    limits: Limits = SM120
    results: list[FitResult] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        """Every declaration fits on the patched code."""
        return all(r.fits for r in self.results if r.code == "patched")

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {"limits": {"smem_per_block": self.limits.smem_per_block,
                           "registers_per_block": self.limits.registers_per_block,
                           "registers_per_thread": self.limits.registers_per_thread,
                           "threads_per_block": self.limits.threads_per_block},
                "fits": self.fits, "results": [r.to_json() for r in self.results]}

    def lines(self) -> list[str]:
        """One line per kernel: verdict, code, factory and figures; misses named."""
        out = []
        for result in self.results:
            for refusal in result.refused:
                out.append(f"{'REFUSED':<8} {result.code:<8} {result.fit.function}: {refusal}")
            for k in result.kernels:
                out.append(f"{'fits' if k.fits else 'NO FIT':<8} {result.code:<8} "
                           f"{k.describe()}: smem {k.dynamic_smem:,}+{k.static_smem or 0:,} B, "
                           f"{k.registers} regs x {k.threads} threads"
                           + (f"; {'; '.join(k.misses)}" if k.misses else ""))
        return out


def fits_of(series: Series, release: Any) -> list[tuple[SeriesEntry, KernelFit]]:
    """The kernel-fit declarations of the patches that apply to ``release``."""
    return [(entry, f) for entry in series.entries if entry.applies_to(release)
            for f in entry.kernel_fits
            if f.versions is None or f.versions.contains(release, prereleases=True)]


def find_nvcc() -> Path:
    """nvcc: ``$CUDA_HOME/bin``, then ``PATH``, then ``/usr/local/cuda/bin``.

    Raises:
        MissingToolError: none found.
    """
    candidates = [Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"] if "CUDA_HOME" in \
        os.environ else []
    found = shutil.which("nvcc")
    candidates += [Path(found)] if found else []
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise MissingToolError("the kernel-fit check needs nvcc (CUDA 12.8 or later, for sm_120)",
                           "install the CUDA toolkit or set CUDA_HOME")


def _nvcc_version(nvcc: Path) -> str:
    done = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"release ([\d.]+), V([\d.]+)", done.stdout)
    if done.returncode != 0 or match is None:
        raise MissingToolError(f"{nvcc} --version did not say its release",
                               "check the CUDA toolkit installation")
    return match.group(2)


def tilelang_pin(wheel: Path) -> str:
    """The ``tilelang==X`` the release's wheel requires.

    Raises:
        PatchError: the release requires no pinned tilelang (its kernels cannot be lowered
            as the release lowers them).
    """
    for requirement in requires_dist(wheel_metadata(wheel), wheel.name):
        if requirement.name.lower() == "tilelang" and \
                re.fullmatch(r"==[\w.+!-]+", str(requirement.specifier)):
            return f"tilelang{requirement.specifier}"
    raise PatchError(f"{wheel.name} pins no tilelang version",
                     "a kernel-fit declaration needs the release's own tilelang")


#: What tilelang needs that a behaviour environment lacks (the rest of its requirements,
#: numpy, torch, apache-tvm-ffi, tqdm ..., the release pins itself): tilelang 0.1.11 and
#: 0.1.12 METADATA.
_TILELANG_EXTRAS = ("ml-dtypes", "z3-solver>=4.13.0,<4.15.5", "torch-c-dlpack-ext")


def tilelang_dir(env: BehaviourEnv, pin: str, *, cache: Cache,
                 reporter: Reporter) -> tuple[Path, str]:
    """A folder holding ``pin`` for ``env`` (put on ``PYTHONPATH``), and its cache key.

    Installed with ``--no-deps`` next to the environment, never into it, so the behaviour
    checks run without it as before; about 280 MB, 10 s.

    Raises:
        BuildError: pip failed, or the installed tilelang does not import.
    """
    key = sha256_json({"env": env.key, "tilelang": pin, "extras": list(_TILELANG_EXTRAS)})

    def make(folder: Path) -> dict[str, Any]:
        target = folder / "site"
        with reporter.working(f"{pin} for the kernel-fit check"):
            done = subprocess.run([str(env.python), "-m", "pip", "install", "--quiet",
                                   "--disable-pip-version-check", "--no-deps", "--target",
                                   str(target), pin, *_TILELANG_EXTRAS],
                                  capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise pip_failure(done, target, f"{pin} for the kernel-fit check",
                              SIZES["tilelang"], "check the network (PyPI)")
        probe = subprocess.run([str(env.python), "-c", "import tilelang"],
                               env={**_clean_env(), "PYTHONPATH": str(target)},
                               capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            tail = "\n".join(probe.stderr.strip().splitlines()[-8:])
            raise BuildError(f"{pin} does not import in the behaviour environment:\n{tail}",
                             "a requirement of tilelang is missing: add it to _TILELANG_EXTRAS")
        return {"tilelang": pin}

    entry = cache.artifact("behaviour-tilelang", key, make, record="", on_damage="trust")
    return entry.path / "site", key


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _run_script(env: BehaviourEnv, fits: list[dict[str, Any]], overlay: Path | None,
                tilelang: Path, nvcc: Path) -> list[dict[str, Any]]:
    environ = _clean_env()
    environ["SM120_CAPABILITY"] = SM120_TEXT
    environ["PYTHONDONTWRITEBYTECODE"] = "1"  # the overlay is a cache entry (run.py)
    environ["PYTHONPATH"] = os.pathsep.join([*([str(overlay)] if overlay else []),
                                             str(tilelang)])
    request = {"fits": fits, "standins": env.standins, "nvcc": str(nvcc)}
    done = subprocess.run([str(env.python), str(SCRIPT)], input=json.dumps(request),
                          capture_output=True, text=True, env=environ, check=False,
                          timeout=3600)
    records = [json.loads(line[len(_PREFIX):]) for line in done.stdout.splitlines()
               if line.startswith(_PREFIX)]
    if done.returncode != 0 or not records:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise PatchError(f"the kernel-fit script failed (exit {done.returncode}):\n{tail}",
                         f"run {SCRIPT.name} by hand in the behaviour environment to see why")
    return records


def check_fits(pairs: list[tuple[SeriesEntry, KernelFit]], env: BehaviourEnv, wheel: Path,
               patched: Path, *, cache: Cache, patched_key: str,
               reporter: Reporter | None = None) -> FitReport:
    """Run every declaration on upstream's code and on the patched tree; judge each kernel.

    Args:
        pairs: (patch, declaration) pairs, as :func:`fits_of` gives them.
        env: the release's behaviour environment.
        wheel: the release's wheel (its tilelang pin is read from it).
        patched: the tree whose ``sglang`` package is checked as "patched" (give upstream's
            tree to see upstream fail).
        cache: where the tilelang install and the observations are kept.
        patched_key: the patched tree's content key (names its observations).
        reporter: progress.

    Raises:
        MissingToolError: no nvcc.
        PatchError: the release pins no tilelang, or the script crashed.
        BuildError: tilelang could not be installed.
    """
    reporter = reporter or Reporter(quiet=True)
    report = FitReport()
    if not pairs:
        return report
    nvcc = find_nvcc()
    tools = {"nvcc": _nvcc_version(nvcc)}
    pin = tilelang_pin(wheel)
    site, tilelang_key = tilelang_dir(env, pin, cache=cache, reporter=reporter)
    fits = [{"id": i, "module": f.module, "function": f.function, "heads": list(f.heads),
             "kv": list(f.kv), "tokens": list(f.tokens)} for i, (_e, f) in enumerate(pairs)]
    scripts = {p.name: sha256_file(p) for p in (SCRIPT, SCRIPT.parent / "sm120_device.py",
                                                SCRIPT.parent / "standins.py")}
    for code, overlay, code_key in (("upstream", None, "upstream"),
                                    ("patched", patched, patched_key)):
        key = sha256_json({"env": env.key, "code": code_key, "tilelang": tilelang_key,
                           "tools": tools, "scripts": scripts, "fits": fits,
                           "standins": env.standins})

        def run(folder: Path, overlay: Path | None = overlay, code: str = code
                ) -> dict[str, Any]:
            with reporter.working(f"kernel fit: compiling the kernels {code} code picks "
                                  "for sm_120"):
                return {"records": _run_script(env, fits, overlay, site, nvcc)}

        if code_key:
            records = cache.artifact("behaviour-kernel-fit", key, run, record="",
                                     valid=lambda meta: "records" in meta).meta["records"]
        else:  # an unnamed tree: nothing to key its observations by
            records = run(Path())["records"]
        for index, (entry, fit) in enumerate(pairs):
            mine = [r for r in records if r.get("fit") == index]
            refused = tuple(f"{r['call']}: {r['error']}" for r in mine
                            if "call" in r and r.get("error"))
            refused += tuple(f"{r['call']}: picked no TileLang kernel" for r in mine
                             if "call" in r and not r.get("error") and not r.get("kernels"))
            kernels = tuple(judge(r) for r in mine if "kernel" in r)
            report.results.append(FitResult(entry.name, fit, code, kernels, refused))
    return report


def require_fit(report: FitReport, target: str) -> None:
    """Raise when a kernel the patched code picks does not fit.

    Raises:
        PatchError: naming each kernel and the figure against the limit.
    """
    misses = [f"{k.describe()}: {'; '.join(k.misses)}" for r in report.results
              if r.code == "patched" for k in r.kernels if not k.fits]
    misses += [f"{r.fit.function} {refusal}" for r in report.results if r.code == "patched"
               for refusal in r.refused]
    misses += [f"{r.fit.name}: the dispatch picked no kernel" for r in report.results
               if r.code == "patched" and not r.kernels]
    if misses:
        raise PatchError(f"{len(misses)} kernel(s) the series selects on SM12x do not fit "
                         f"SM120 on {target}:\n  " + "\n  ".join(misses),
                         "give the patch an SM12x tile within the limits (builder/behaviour/"
                         "fit.py: SM120)")
