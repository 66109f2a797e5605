"""A release's behaviour environment: its own pinned Python dependencies on a CPU torch.

One base environment holds ``torch==2.13.0`` as the user's pip resolves it (the code runs it
on the CPU either way): the ``+cpu`` build where PyTorch's CPU index or a wheelhouse offers it,
else PyPI's Linux build, which is a CUDA build with its ``nvidia-*`` wheels (:data:`SIZES`).
Each release's environment sees it through a ``.pth``
file and installs the release's wheel without its dependencies, then every dependency the
wheel's ``Requires-Dist`` names except :data:`NOT_INSTALLED`. Both are cache entries keyed
by what they hold, so a second run installs nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.cache import Cache, sha256_json
from builder.core.errors import BuildError
from builder.core.progress import Reporter
from builder.core.wheelmeta import requires_dist, wheel_metadata

#: The torch every behaviour environment shares, run on the CPU. ``==2.13.0`` also matches
#: ``2.13.0+cpu`` (PEP 440: a local label matches a specifier without one) and pip prefers it
#: where an index offers it; PyPI alone has only the CUDA build (issue 37's walk).
TORCH = "torch==2.13.0"

#: Dependencies not installed: compiled CUDA kernels a CPU cannot load (stood in for by
#: import name in :data:`STANDINS` where the release imports them while it decides) and the
#: CUDA builds of the torch family (the base environment's CPU torch serves instead).
NOT_INSTALLED = frozenset({
    "torch", "torchaudio", "torchvision", "torchcodec", "torchao", "sglang-kernel",
    "sgl-kernel", "sgl-deep-gemm", "sgl-deep-ep", "sgl-flash-mla", "flash-attn-4",
    "humming-kernels", "nvidia-cutlass-dsl", "nvidia-mathdx", "cuda-python",
    "quack-kernels", "tokenspeed-mla", "helion", "torch-memory-saver", "nvshmem4py-cu13",
    "tilelang", "py-spy", "deepseek-recipe", "tml-renderers",
    # NVIDIA's index publishes it; PyPI has only a placeholder (0.5.20 pins cuda-tile==1.6.0rc5)
    "cuda-tile"})

#: Import name -> distribution of the compiled packages stood in for while SGLang decides.
STANDINS = {"sgl_kernel": "sglang-kernel"}
#: Stood in from these releases on only, where SGLang imports them unconditionally while it
#: decides (0.5.20's ``layers/attention/dsa_backend.py`` imports ``deep_gemm`` at import
#: time); before, a stand-in could turn an ``ImportError`` fallback into a different choice.
STANDINS_FROM = {"deep_gemm": ("sgl-deep-gemm", "0.5.20")}

# torchvision's pure Python is needed (sglang's utils import torchvision.io); its CUDA
# ``_C.so`` is not loaded (the script side defines the two operator schemas it registers).
_TORCHVISION = "torchvision==0.28.0"


@dataclass(frozen=True)
class BehaviourEnv:
    """An environment that runs one release's code.

    Attributes:
        python: its interpreter.
        release: the sglang version installed.
        standins: import name -> the version the release pins, for the stood-in packages.
        not_installed: the requirements left out (their text, as the wheel gives them).
        key: the environment's cache key (what it holds).
    """

    python: Path
    release: str
    standins: dict[str, str]
    not_installed: tuple[str, ...]
    key: str = ""


def requirements(wheel: Path) -> tuple[list[str], list[str]]:
    """Split the wheel's ``Requires-Dist`` into what is installed and what is left out.

    Returns:
        ``(installed, left_out)``: requirement strings, extras dropped (``flashinfer_python
        [cu13]`` installs plain), markers evaluated for this interpreter.

    Raises:
        VerificationError: the wheel has no METADATA or a requirement does not parse.
    """
    keep, left = [], []
    for requirement in requires_dist(wheel_metadata(wheel), wheel.name):
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(requirement.name) in NOT_INSTALLED:
            left.append(str(requirement))
            continue
        requirement.extras = set()
        keep.append(f"{requirement.name}{requirement.specifier}")
    return keep, left


def _pin_of(left_out: list[str], distribution: str) -> str:
    for text in left_out:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) == distribution:
            match = re.fullmatch(r"==([\w.+!-]+)", str(requirement.specifier))
            return match.group(1) if match else "0+standin"
    return "0+standin"


#: The disk the behaviour stage takes, measured on SGLang 0.5.22 and 0.5.21 (issue 39):
#: each release's environment, the torch shared by all (once: 0.9 GB measured for
#: ``2.13.0+cpu`` from a wheelhouse; PyPI's CUDA build with its ``nvidia-*`` wheels is about
#: 4.7 GB, issue 37's walk, not measured here), and the TileLang install of a release's
#: kernel-fit check.
SIZES = {"environment": "3.8 GB per release",
         "torch": "0.9 GB once as the +cpu build (PyTorch's CPU index or a wheelhouse), "
                  "about 4.7 GB as PyPI's CUDA build",
         "tilelang": "0.28 GB per release"}
_NO_SPACE = re.compile(r"No space left on device|\[Errno 28\]|ENOSPC")


def _free(folder: Path) -> str:
    # The nearest existing folder: the one being written may be gone (removed on failure).
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return f"{shutil.disk_usage(folder).free / 1e9:.2f} GB"
    except OSError:
        return "unknown space"


def disk_full(folder: Path, what: str, need: str) -> BuildError:
    """The error for a disk that filled up while ``what`` was written under ``folder``.

    Args:
        folder: where it was written (its disk's free space is reported).
        what: what was being installed or written.
        need: the space it takes (:data:`SIZES`).

    Returns:
        The error to raise (exit 6), naming the disk, its free space and the need.
    """
    return BuildError(f"the disk is full: {what} could not be written under {folder} "
                      f"({_free(folder)} free there; it needs about {need})",
                      "free space on that disk (python -m builder cache prune), or pass "
                      "--cache-dir DIR on a disk with room; the behaviour stage needs "
                      + ", ".join(f"{k}: {v}" for k, v in SIZES.items()))


def pip_failure(done: subprocess.CompletedProcess[str], folder: Path, what: str,
                need: str, hint: str) -> BuildError:
    """The error for a failed ``pip install``: a full disk as such, else pip's last lines.

    Args:
        done: the finished pip run.
        folder: where it installed.
        what: what it installed.
        need: the space that takes (:data:`SIZES`).
        hint: the hint for any other failure.

    Returns:
        The error to raise.
    """
    output = (done.stderr or "") + (done.stdout or "")
    if _NO_SPACE.search(output):
        return disk_full(folder, what, need)
    tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-12:])
    return BuildError(f"could not install {what}:\n{tail}", hint)


def _pip(python: Path, args: list[str], reporter: Reporter, what: str,
         need: str = SIZES["environment"]) -> None:
    with reporter.working(what):
        done = subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                               "--disable-pip-version-check", *args],
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise pip_failure(done, python.parent.parent, f"the behaviour environment ({what})",
                          need,
                          "check the network (PyPI) and the release's pins")


def _venv(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True,
                   capture_output=True)
    return folder / "bin" / "python"


def _site_packages(python: Path) -> Path:
    done = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def behaviour_env(wheel: Path, release: str, *, cache: Cache,
                  reporter: Reporter | None = None) -> BehaviourEnv:
    """The behaviour environment of ``wheel`` (built once, then found in the cache).

    Args:
        wheel: the release's pinned wheel for this interpreter.
        release: its version.
        cache: where the environments live (``behaviour-torch``, ``behaviour-env``).
        reporter: progress (an install takes minutes; :data:`SIZES` gives the disk it takes).

    Raises:
        BuildError: pip failed (the tail of its output is in the message), or the disk
            filled up (said as such, with the space needed).
    """
    reporter = reporter or Reporter(quiet=True)
    tag = f"{sys.implementation.name}{sysconfig.get_python_version()}"
    base_key = sha256_json({"torch": TORCH, "torchvision": _TORCHVISION, "python": tag})

    def make_base(folder: Path) -> dict[str, str]:
        python = _venv(folder / "venv")
        _pip(python, [TORCH], reporter, f"{TORCH} for the behaviour checks (run on the CPU)",
             SIZES["torch"])
        _pip(python, ["--no-deps", _TORCHVISION], reporter, "torchvision's Python")
        return {"torch": TORCH}

    base = cache.artifact("behaviour-torch", base_key, make_base, record="",
                          on_damage="trust")
    keep, left = requirements(wheel)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    key = sha256_json({"wheel": digest, "requirements": keep, "base": base_key, "python": tag})

    def make(folder: Path) -> dict[str, object]:
        python = _venv(folder / "venv")
        base_site = _site_packages(base.path / "venv" / "bin" / "python")
        (_site_packages(python) / "zz-sm120-behaviour-torch.pth").write_text(f"{base_site}\n")
        constraint = folder / "torch-constraint.txt"
        constraint.write_text(f"{TORCH}\n{_TORCHVISION}\n")
        _pip(python, ["--no-deps", str(wheel)], reporter, f"sglang {release}")
        (folder / "requirements.txt").write_text("\n".join(keep) + "\n")
        _pip(python, ["-c", str(constraint), "-r", str(folder / "requirements.txt")],
             reporter, f"the pinned dependencies of sglang {release} ({len(keep)})")
        return {"release": release, "left_out": left}

    entry = cache.artifact("behaviour-env", key, make, record="", on_damage="trust")
    standins = {name: _pin_of(left, dist) for name, dist in STANDINS.items()}
    for name, (dist, first) in STANDINS_FROM.items():
        if Version(release) >= Version(first):
            standins[name] = _pin_of(left, dist)
    return BehaviourEnv(entry.path / "venv" / "bin" / "python", release, standins, tuple(left),
                        key)


#: The release's own server-argument parser, run by :func:`parse_with_release`.
PARSE_SCRIPT = Path(__file__).resolve().parent / "script" / "parse_server_args.py"


def parse_with_release(env: BehaviourEnv, argvs: list[list[str]]) -> list[dict[str, Any]]:
    """Parse each argv with the release's own server-argument parser (in ``env``).

    Args:
        env: the release's behaviour environment (:func:`behaviour_env`).
        argvs: argument lists as ``python -m sglang.launch_server`` would get them.

    Returns:
        one ``{"ok": True, "values": {...}}`` or ``{"ok": False, "error": ...}`` per list
        (``builder/behaviour/script/parse_server_args.py``).

    Raises:
        BuildError: the script printed no answer for every list (the release did not import).
    """
    request = {"argvs": argvs, "standins": env.standins}
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run([str(env.python), str(PARSE_SCRIPT)], input=json.dumps(request),
                          capture_output=True, text=True, env=environ, check=False,
                          timeout=600)
    found = [json.loads(line[len("PARSED "):]) for line in done.stdout.splitlines()
             if line.startswith("PARSED ")]
    if len(found) != len(argvs):
        tail = "\n".join(done.stderr.strip().splitlines()[-12:])
        raise BuildError(f"sglang {env.release}'s argument parser gave {len(found)} of "
                         f"{len(argvs)} answers (exit {done.returncode}):\n{tail}",
                         "run the script by hand in the behaviour environment to see why")
    return found
