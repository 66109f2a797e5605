"""Prepare the carry folders for the numerics report (runs on the CPU machine, no GPU).

What it writes (under CARRY, an ignored folder of the checkout the device tool sends):

* ``CARRY/dsa/kernels/<release>/upstream.py``:
  ``sglang/kernels/ops/attention/dsa/tilelang_kernel.py`` read from the release
  wheel (its sha256 checked against targets.toml first);
* ``.../patched.py``: the same file with the ``tilelang_kernel.py`` hunks of patch 0003 applied
  by GNU ``patch -p2`` (the patch's paths are ``a/python/sglang/...``, the wheel's ``sglang/...``);
* ``.../control_rowsplit.py`` and ``.../control_scale.py``: patched.py with ONE deliberate bug
  in ``_tilelang_sparse_fwd_sm12x`` (see CONTROLS), to show that the comparison can fail;
* ``CARRY/dsa/site.tar.xz``: tilelang (the release's Requires-Dist pin), apache-tvm-ffi,
  z3-solver and torch-c-dlpack-ext unpacked by pip into one folder and packed with xz
  (the wheels together are over the 64 MiB a device call carries);
* ``CARRY/moe/``: flashinfer-python 0.6.14, the prebuilt flashinfer-jit-cache wheel and
  apache-tvm-ffi, as wheels;
* ``CARRY/*/SHA256SUMS`` and ``CARRY/scripts/`` (a copy of this folder's scripts).

Usage: python prepare.py --carry /work/main/.cache/numerics --wheels DIR --prebuilt WHEEL
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
KERNEL = "sglang/kernels/ops/attention/dsa/tilelang_kernel.py"
RELEASES = {
    "0.5.20": "patches/0003-sm12x-dsa-backends-tilelang-0.5.20.patch",
    "0.5.23": "patches/0003-sm12x-dsa-backends-tilelang-0.5.23.patch",
}
# One bug each, in the SM12x function only (old text, new text).
CONTROLS = {
    # rows t*groups+g must carry token t's indices; .repeat gives row r the indices of token
    # r % num_tokens instead (wrong whenever tokens > 1 and heads > 16)
    "control_rowsplit": (
        "indices = indices.repeat_interleave(groups, dim=0)",
        "indices = indices.repeat(groups, 1, 1)",
    ),
    # softmax scale doubled (a swapped/duplicated scale)
    "control_scale": (
        "        sm_scale=sm_scale,\n        block_I=32,",
        "        sm_scale=sm_scale * 2,\n        block_I=32,",
    ),
}
PREBUILT_SHA256 = "6fd714c5cda522f144685d0359915876a5c4a9a1c7385f4c89fdace560d8ae9c"


def sha256(path: Path) -> str:
    """Return the hex sha256 of a file.

    Args:
        path: the file.

    Returns:
        Its sha256, lower-case hex.
    """
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pinned_wheel_sha(version: str, filename: str) -> str:
    """Return the sha256 targets.toml pins for one sglang wheel file.

    Args:
        version: sglang version, e.g. "0.5.23".
        filename: the wheel's file name.

    Returns:
        The pinned sha256.

    Raises:
        KeyError: targets.toml pins no such file.
    """
    data = tomllib.loads((REPO / "targets.toml").read_text())
    for target in data["target"]:
        for src in target.get("source", []):
            if src.get("version") == version and src.get("filename") == filename:
                return str(src["sha256"])
    raise KeyError(f"{filename} not pinned in targets.toml")


def kernel_hunks(patch_text: str) -> str:
    """Keep only the file sections of a patch that touch tilelang_kernel.py.

    Args:
        patch_text: the whole patch (header, then ``--- a/`` / ``+++ b/`` sections).

    Returns:
        The sections for tilelang_kernel.py, as a patch text.

    Raises:
        ValueError: no such section.
    """
    lines = patch_text.splitlines(keepends=True)
    out: list[str] = []
    keep = False
    for i, line in enumerate(lines):
        if line.startswith("--- a/") and i + 1 < len(lines) and lines[i + 1].startswith("+++ b/"):
            keep = lines[i + 1].rstrip().endswith("tilelang_kernel.py")
        elif line.startswith("diff --git "):
            keep = False
            continue
        if keep:
            out.append(line)
    if not out:
        raise ValueError("patch has no tilelang_kernel.py section")
    return "".join(out)


def make_kernels(release: str, wheel: Path, dest: Path) -> dict[str, str]:
    """Write upstream, patched and control copies of the DSA TileLang kernel file.

    Args:
        release: sglang version.
        wheel: the release wheel (checked against targets.toml).
        dest: output folder.

    Returns:
        File name -> sha256 of what was written.

    Raises:
        SystemExit: sha256 mismatch, patch failure, or a control's text not found once.
    """
    got, want = sha256(wheel), pinned_wheel_sha(release, wheel.name)
    if got != want:
        sys.exit(f"{wheel.name}: sha256 {got} != pinned {want}")
    dest.mkdir(parents=True, exist_ok=True)
    work = dest / "_tree"
    shutil.rmtree(work, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        z.extract(KERNEL, work)
    shutil.copy(work / KERNEL, dest / "upstream.py")
    hunks = kernel_hunks((REPO / RELEASES[release]).read_text())
    r = subprocess.run(
        ["patch", "-p2", "--forward", "--no-backup-if-mismatch", "-d", str(work)],
        input=hunks, text=True, capture_output=True,
    )
    print(r.stdout.strip())
    if r.returncode != 0:
        sys.exit(f"patch failed on {release}: {r.stderr}")
    patched = (work / KERNEL).read_text()
    (dest / "patched.py").write_text(patched)
    shutil.rmtree(work)
    for name, (old, new) in CONTROLS.items():
        if patched.count(old) != 1:
            sys.exit(f"{name}: text to break found {patched.count(old)} times, not once")
        (dest / f"{name}.py").write_text(patched.replace(old, new))
    return {p.name: sha256(p) for p in sorted(dest.glob("*.py"))}


def write_sums(folder: Path) -> None:
    """Write SHA256SUMS for every file under a folder (relative paths).

    Args:
        folder: the folder.
    """
    rows = [
        f"{sha256(p)}  {p.relative_to(folder)}"
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "SHA256SUMS"
    ]
    (folder / "SHA256SUMS").write_text("\n".join(rows) + "\n")


def make_site(wheels: list[Path], site: Path, tar: Path) -> None:
    """Unpack wheels for CPython 3.12 x86-64 into one folder and pack it as tar.xz.

    Args:
        wheels: the wheels.
        site: scratch folder (removed after).
        tar: the archive to write (its top folder is ``site``).
    """
    shutil.rmtree(site, ignore_errors=True)
    subprocess.run(
        # the device runs CPython 3.12 on x86-64 (KINDS.md); this machine may run another
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
         "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
         *(f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28)),
         "--platform=manylinux2014_x86_64", "--target", str(site), *map(str, wheels)],
        check=True,
    )
    # ROCm-only headers: the CUDA path never includes them
    shutil.rmtree(site / "tilelang/3rdparty/composable_kernel", ignore_errors=True)
    with tarfile.open(tar, "w:xz", preset=6) as t:
        t.add(site, arcname="site")
    shutil.rmtree(site)


def main() -> None:
    """Build the carry folders (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--carry", type=Path, required=True)
    ap.add_argument("--wheels", type=Path, required=True, help="downloaded PyPI wheels")
    ap.add_argument("--sglang-wheels", type=Path,
                    default=Path.home() / ".cache/sglang-sm120-tests/sdists")
    ap.add_argument("--prebuilt", type=Path, required=True)
    ap.add_argument("--reuse-site", action="store_true",
                    help="keep an existing dsa/site.tar.xz (xz takes minutes on 2 cores)")
    a = ap.parse_args()

    dsa, moe = a.carry / "dsa", a.carry / "moe"
    keep = a.carry / "site.tar.xz.keep"
    if a.reuse_site and (dsa / "site.tar.xz").exists():
        shutil.move(dsa / "site.tar.xz", keep)
    for d in (dsa, moe, a.carry / "scripts"):
        shutil.rmtree(d, ignore_errors=True)
    for rel in RELEASES:
        sums = make_kernels(
            rel, a.sglang_wheels / f"sglang-{rel}-cp311-cp311-manylinux_2_34_x86_64.whl",
            dsa / "kernels" / rel,
        )
        for k, v in sums.items():
            print(rel, k, v)

    dsa_wheels = sorted(
        p for p in a.wheels.glob("*.whl")
        if p.name.startswith(("tilelang-", "apache_tvm_ffi-", "z3_solver-", "torch_c_dlpack_ext-"))
    )
    (dsa / "WHEELS").write_text("".join(f"{sha256(p)}  {p.name}\n" for p in dsa_wheels))
    if keep.exists():
        shutil.move(keep, dsa / "site.tar.xz")
    else:
        make_site(dsa_wheels, a.carry / "_site_dsa", dsa / "site.tar.xz")

    moe.mkdir(parents=True, exist_ok=True)
    if sha256(a.prebuilt) != PREBUILT_SHA256:
        sys.exit(f"{a.prebuilt.name}: sha256 is not {PREBUILT_SHA256}")
    for p in [a.prebuilt, *a.wheels.glob("flashinfer_python-0.6.14-*.whl"),
              *a.wheels.glob("apache_tvm_ffi-0.1.11-cp312-*.whl")]:
        shutil.copy(p, moe / p.name)
    # SGLang 0.5.23's file holding materialize_swiglu_params_for_cutlass
    w523 = a.sglang_wheels / "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
    if sha256(w523) != pinned_wheel_sha("0.5.23", w523.name):
        sys.exit(f"{w523.name}: sha256 differs from targets.toml")
    with zipfile.ZipFile(w523) as z:
        (moe / "flashinfer_cutlass_0.5.23.py").write_bytes(
            z.read("sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py"))
    shutil.copytree(HERE, a.carry / "scripts",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for d in (dsa, moe):
        write_sums(d)
    for d in (dsa, moe, a.carry / "scripts"):
        size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        print(f"{d}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
