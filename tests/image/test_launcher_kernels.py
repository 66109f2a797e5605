"""The image's launcher checks the installed kernel wheels at start (issue 36).

``sglang-sm120-serve`` derives the FlashInfer modules the model and the full command line
load, with the release's own backend selection run in its own Python, and refuses kernel
wheels whose manifest lacks one. The slow tests run the launcher (its dry run) in each
release's behaviour environment, the patched code first on the path, as an image runs it in
its own Python; the kernel wheels are written by the builder's own packers
(``builder.kernels.jitcache``) and installed with pip, one module group left out or none.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from builder.core.config import load_targets
from builder.image.profile import (
    BESIDE_SOURCES,
    LAUNCHER_SOURCE,
    PROFILES_DIR,
    SELECT_FOLDER,
    launcher_module,
    load_profile,
    profile_path,
    profile_reader,
)
from builder.kernels import coverage, jitcache
from builder.kernels.derive import SCRIPT
from builder.kernels.pins import default_groups, uses_providers
from tests.helpers.paths import REPO
from tests.helpers.releases import patched_release
from tests.helpers.tiers import BEHAVIOUR

TARGETS = load_targets(REPO / "targets.toml")


def kernel_site(tmp: Path, target: str, flashinfer: str, groups: tuple[str, ...],
                moe_variants: tuple[str, ...] = ()) -> Path:
    """A folder with the kernel wheel(s) of ``groups`` installed by pip, as the builder
    packs them for ``flashinfer`` (a provider and its shim from 0.7, one wheel before);
    ``moe_variants``: the fused MoE module pruned to those dtype pairs."""
    arch = list(TARGETS.get(target).arch_list)
    version = f"{flashinfer}+sm120.1.cu130"
    manifest = {"schema": jitcache.MANIFEST_SCHEMA, "target": target,
                "flashinfer_version": flashinfer, "version": version, "arch_list": arch,
                "cuda_version": "13.0", "groups": list(groups), "head_dims": [32, 64, 128],
                "modules": [{"name": g, "group": g} for g in groups]}
    if moe_variants:
        manifest["moe_variants"] = list(moe_variants)
    modules = tmp / "modules"
    modules.mkdir(parents=True)
    if uses_providers(Version(flashinfer)):
        wheels = [jitcache.pack_provider(modules, version, manifest, 0, tmp),
                  jitcache.pack_shim(version, [jitcache.provider_id(arch[0])], flashinfer, 0,
                                     tmp)]
    else:
        wheels = [jitcache.pack(modules, version, manifest, 0, tmp)]
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(site), *map(str, wheels)], check=True, timeout=300)
    return site


def launch(python: str | Path, *args: str, path: str, launcher: Path = LAUNCHER_SOURCE,
           **env: str) -> subprocess.CompletedProcess[str]:
    """The launcher's dry run in ``python`` with ``path`` as its PYTHONPATH, no nvidia-smi
    on PATH, the 0.5.x profile given as ``SGLANG_SM120_PROFILE`` in ``env`` or none."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "SGLANG_SM120_"))}
    environ.update({"SGLANG_SM120_DRY_RUN": "1", "SGLANG_SM120_PROFILE": "none",
                    "PYTHONPATH": path, "PATH": "/usr/bin:/bin", **env})
    return subprocess.run([str(python), str(launcher), *args], env=environ,
                          capture_output=True, text=True, timeout=1200)


# --- fast: when nothing is checked, and the image carries what the check loads ----------------

def test_without_a_local_checkpoint_or_with_the_skip_nothing_is_derived(tmp_path: Path) -> None:
    site = kernel_site(tmp_path / "k", "sglang-0.5.23", "0.7.2", ("norm",))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3_moe"}')
    remote = launch(sys.executable, "--model-path", "Qwen/Qwen3-30B-A3B", path=str(site))
    assert remote.returncode == 0, remote.stderr
    assert "kernel coverage not checked: Qwen/Qwen3-30B-A3B is not a local checkpoint " \
        "folder" in remote.stderr
    config = tmp_path / "server.yaml"  # the model in a --config file: not read here
    config.write_text(f"model-path: {model}\n")
    unnamed = launch(sys.executable, "--config", str(config), path=str(site))
    assert unnamed.returncode == 0, unnamed.stderr
    assert "kernel coverage not checked: no --model-path on the command line" in unnamed.stderr
    skipped = launch(sys.executable, "--model-path", str(model), path=str(site),
                     SGLANG_SM120_SKIP_KERNEL_CHECK="1")
    assert skipped.returncode == 0, skipped.stderr
    assert "kernel coverage not checked (SGLANG_SM120_SKIP_KERNEL_CHECK=1)" in skipped.stderr
    # no kernel wheel of the builder: FlashInfer compiles what it needs, nothing to check
    bare = launch(sys.executable, "--model-path", str(model), path=str(tmp_path / "none"))
    assert bare.returncode == 0 and "kernel" not in bare.stderr, bare.stderr
    # the builder's Python has no sglang: the selection's failure is said, the server starts
    crashed = launch(sys.executable, "--model-path", str(model), path=str(site))
    assert crashed.returncode == 0, crashed.stderr
    assert "kernel coverage not checked: the backend selection" in crashed.stderr
    assert shlex.split(crashed.stdout)[0] == "FLASHINFER_DISABLE_JIT=1"


def test_the_image_context_carries_the_launchers_rules_and_the_selection(
        tmp_path: Path) -> None:
    from builder.image.build import _context

    target = TARGETS.get("sglang-0.5.23")
    profile = load_profile(profile_path(REPO / PROFILES_DIR, target), target)
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM scratch\n")
    out = tmp_path / "context.tar"
    _context(dockerfile, [], 0, out, profile)
    with tarfile.open(out) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()  # type: ignore[union-attr]
                 if m.isfile()}
    # the links' targets, byte for byte: the image holds the builder's own rules
    assert files["sm120/sglang_sm120_coverage.py"] == \
        (REPO / "builder" / "kernels" / "coverage.py").read_bytes()
    assert files["sm120/sglang_sm120_arch.py"] == \
        (REPO / "builder" / "core" / "arch.py").read_bytes()
    assert {f"sm120/{s.name}" for s in BESIDE_SOURCES} <= set(files)
    selection = {name.split("/")[-1] for name in files
                 if name.startswith(f"sm120/{SELECT_FOLDER}/")}
    assert {p.name for p in SCRIPT.parent.glob("*.py")} == selection
    assert launcher_module().SELECT_DIRS[0] == SELECT_FOLDER
    dockerfile_text = (REPO / "images" / "Dockerfile").read_text()
    for source in BESIDE_SOURCES:  # the image installs each beside the launcher
        assert f"/tmp/sm120-files/{source.name} /usr/local/bin/{source.name}" in dockerfile_text
    assert f"cp -r /tmp/sm120-files/{SELECT_FOLDER} /usr/local/bin/{SELECT_FOLDER}" in \
        dockerfile_text
    # the image's layout: the launcher finds its rules beside it (a planted bad rules file
    # would be loaded, proving it is the one beside the launcher that is read)
    root = tmp_path / "bin"
    with tarfile.open(out) as tar:
        tar.extractall(root, filter="data")
    launcher = root / "sm120" / "sglang-sm120-serve"
    site = kernel_site(tmp_path / "k", "sglang-0.5.23", "0.7.2", ("norm",))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    done = launch(sys.executable, "--model-path", str(model), launcher=launcher, path=str(site))
    # it found the selection beside it (and ran it: this Python has no sglang)
    assert "kernel coverage not checked: the backend selection failed: " \
        "ModuleNotFoundError: No module named 'sglang'" in done.stderr, \
        done.stderr
    (root / "sm120" / "sglang_sm120_coverage.py").write_text("raise SystemExit(7)\n")
    planted = launch(sys.executable, "--model-path", str(model), launcher=launcher,
                     path=str(site))
    assert planted.returncode == 7, planted.stderr


def test_an_image_without_the_selection_says_so_and_starts(tmp_path: Path) -> None:
    root = tmp_path / "bin"
    root.mkdir()
    launcher = root / "sglang-sm120-serve"
    launcher.write_bytes(LAUNCHER_SOURCE.read_bytes())
    for source in BESIDE_SOURCES:
        (root / source.name).write_bytes(source.read_bytes())
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    site = kernel_site(tmp_path / "k", "sglang-0.5.23", "0.7.2", ("norm",))
    done = launch(sys.executable, "--model-path", str(model), launcher=launcher,
                  path=str(site))
    assert done.returncode == 0, done.stderr
    assert "kernel coverage not checked: no select_backends.py beside the launcher" in \
        done.stderr


def test_a_wheel_whose_arch_does_not_run_on_the_gpu_is_refused_before_any_selection(
        tmp_path: Path) -> None:
    """The GPU's compute capability is ``nvidia-smi``'s (a script standing in for the
    driver's tool here): a 12.0f wheel on a 9.0 GPU is refused at once; on a 12.0 GPU the
    check goes on to the selection (which this Python, without sglang, cannot run)."""
    site = kernel_site(tmp_path / "k", "sglang-0.5.23", "0.7.2", ("norm",))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    tools = tmp_path / "bin"
    tools.mkdir()
    for capability, name in (("9.0", "NVIDIA H200"), ("12.0", "NVIDIA RTX PRO 6000")):
        smi = tools / "nvidia-smi"
        smi.write_text(f'#!/bin/sh\ncase "$1" in --query-gpu=compute_cap) echo {capability};; '
                       f'*) echo "{name}";; esac\n')
        smi.chmod(0o755)
        done = launch(sys.executable, "--model-path", str(model), path=str(site),
                      PATH=f"{tools}:/usr/bin:/bin")
        if capability == "9.0":
            assert done.returncode == 2 and done.stdout == "", done.stderr
            assert "no installed kernel wheel holds an arch for this GPU (compute capability " \
                "9.0; they hold 12.0f)" in done.stderr
        else:
            assert done.returncode == 0, done.stderr
            assert "kernel coverage not checked: the backend selection failed" in done.stderr


def test_the_selection_key_holds_what_the_selection_reads_and_no_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``selection_key``: each input the selection reads changes it (a file of sglang
    edited in place, its RECORD unchanged; the model path's name, which picks SGLang's
    config parser; any file of the model folder; a file a flag names; the driver; a package
    on the path; SGLang's and the frameworks' variables); a place, the launcher's own
    variables, the recording hook and the JIT cache artifact on the path do not."""
    serve = launcher_module()
    site = tmp_path / "site"
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("__version__ = '0.5.23'\n")
    info = site / "sglang-0.5.23+sm120.1.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("sglang/__init__.py,sha256=one,22\n")
    monkeypatch.syspath_prepend(str(site))
    scripts = tmp_path / "select"
    scripts.mkdir()
    (scripts / "select_backends.py").write_text("# the selection\n")
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3_moe"}')
    (model / "model.safetensors").write_bytes(b"weights")
    decrypted = tmp_path / "config.dec"
    decrypted.write_text('{"head_dim": 32}')
    environ = {"SGLANG_CACHE_DIR": "/one", "SGLANG_ENABLE_X": "1", "HOME": "/h"}

    def key(where: Path = model, flags: tuple[str, ...] = ("--tp-size", "2"),
            capability: tuple[int, int] = (12, 0), driver: str = "590.10", **changed: str
            ) -> str:
        return str(serve.selection_key(str(where), list(flags), capability, str(scripts),
                                       {**environ, **changed}, driver))

    base = key()
    assert len(base) == 64 and key() == base
    assert key(SGLANG_CACHE_DIR="/two", SGLANG_TORCH_PROFILER_DIR="/p", HOME="/x",
               FLASHINFER_WORKSPACE_BASE="/w", SGLANG_SM120_JIT_CACHES="none",
               SGLANG_SM120_TRITON_WATCH="/watch", CUDA_VISIBLE_DEVICES="0") == base
    hook = tmp_path / "hook"  # what a recorded run adds to the path
    (hook / "sglang_sm120_jit_caches").mkdir(parents=True)
    (hook / "sitecustomize.py").write_text("import triton_watch\n")
    (hook / "triton_watch.py").write_text("")
    with monkeypatch.context() as inner:
        inner.syspath_prepend(str(hook))
        assert key() == base
    changed = [key(flags=("--tp-size", "4")), key(capability=(12, 1)), key(driver="595.10"),
               key(SGLANG_ENABLE_X="0"), key(SGLANG_SM120_STANDINS="{}"),
               key(SGLANG_SM120_FLASHMLA_BACKEND="x"), key(FLASHINFER_LOGLEVEL="3"),
               key(SM120_DEVICES="2"), key(SGLANG_DISABLE_RADIX_CACHE="1"),
               key(flags=("--decrypted-config-file", str(decrypted)))]
    mistral = tmp_path / "Mistral-Small-4-demo"  # 0.5.23's get_config reads params.json here
    shutil.copytree(model, mistral)
    changed.append(key(mistral))
    (model / "configuration_demo.py").write_text("class DemoConfig: head_dim = 32\n")
    changed.append(key())
    (model / "dspark").mkdir()
    (model / "dspark" / "config.json").write_text("{}")
    changed.append(key())
    decrypted.write_text('{"head_dim": 256}')
    changed.append(key(flags=("--decrypted-config-file", str(decrypted))))
    (scripts / "serving.py").write_text("# a helper of the selection\n")
    changed.append(key())
    (site / "sglang" / "__init__.py").write_text("__version__ = '0.5.23'  # by hand\n")
    changed.append(key())
    other = tmp_path / "other-srt"  # a folder of sglang that is a link, edited there
    other.mkdir()
    (other / "server_args.py").write_text("A = 1\n")
    (site / "sglang" / "srt").rmdir()
    (site / "sglang" / "srt").symlink_to(other)
    changed.append(key())
    (other / "server_args.py").write_text("A = 2\n")
    changed.append(key())
    (site / "triton_kernels").mkdir()  # a package the selection probes for
    changed.append(key())
    assert len(set(changed)) == len(changed) and base not in changed
    # the same files installed elsewhere: the same key
    edited = key()
    (site / "sglang" / "srt").unlink()
    shutil.copytree(other, site / "sglang" / "srt")
    assert key() == edited
    monkeypatch.syspath_prepend(str(shutil.copytree(site, tmp_path / "elsewhere")))
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and str(spec.origin).startswith(str(tmp_path / "elsewhere"))
    assert key() == edited


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# --- slow: the release's own selection in its environment, both directions -------------------

#: (target, zoo form, extra flags, the group left out, what the refusal names).
FORMS: list[tuple[str, str, tuple[str, ...], str, str]] = [
    ("sglang-0.5.23", "qwen3-30b-a3b-ct-nvfp4", (), "fused_moe_sm120",
     "module group fused_moe_sm120 (moe_runner=flashinfer_cutlass, nvfp4 x nvfp4)"),
    ("sglang-0.5.23", "qwen3-30b-a3b-bf16", (), "attention",
     "module group attention (attention=flashinfer, head_dim 32, q bfloat16, kv bfloat16)"),
    ("sglang-0.5.20", "deepseek-r1-0528-nvfp4", ("--tp-size", "2"), "fp4_quantization_sm120f",
     "module group fp4_quantization_sm120f (moe_fp4_quantization=flashinfer_cutlass)"),
]


def _release(shared_cache: Path, name: str) -> tuple[Any, Path]:
    """The release's behaviour environment and its patched tree (the test cache's)."""
    release = patched_release(shared_cache, name)
    return release.env, release.tree


@pytest.mark.slow(reason="runs the launcher's backend selection in a release's behaviour "
                  "environment", group=BEHAVIOUR)
@pytest.mark.parametrize(("target", "form", "flags", "left_out", "says"), FORMS,
                         ids=[f"{t}-{f}" for t, f, *_ in FORMS])
def test_the_launcher_refuses_a_wheel_lacking_a_derived_module_and_starts_with_one_covering(
        shared_cache: Path, tmp_path: Path, target: str, form: str, flags: tuple[str, ...],
        left_out: str, says: str) -> None:
    from builder.behaviour.run import zoo_forms

    env, patched = _release(shared_cache, target)
    flashinfer = subprocess.run(
        [str(env.python), "-c", "import importlib.metadata as m; "
         "print(m.version('flashinfer-python'))"], capture_output=True, text=True,
        check=True, timeout=120).stdout.strip()
    zoo = zoo_forms()
    model = zoo.write(zoo.BY_NAME[form], tmp_path / "zoo")
    arch = tuple(TARGETS.get(target).arch_list)
    full = default_groups(arch)
    assert left_out in full
    lacking = kernel_site(tmp_path / "lacking", target, flashinfer,
                          tuple(g for g in full if g != left_out))
    covering = kernel_site(tmp_path / "full", target, flashinfer, full)
    profile = str(REPO / PROFILES_DIR / f"{target}.toml")
    common = {"SGLANG_SM120_STANDINS": json.dumps(env.standins),
              "SGLANG_SM120_PROFILE": profile, "SGLANG_SM120_GPU": "rtx-pro-6000"}
    args = ("--model-path", str(model), *flags)
    refused = launch(env.python, *args, path=f"{patched}{os.pathsep}{lacking}", **common)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stdout == ""  # nothing started, not even the dry run's line
    line = refused.stderr.strip().splitlines()[-1]
    assert f"does not cover {model} with these flags: missing {says}" in line
    # the command builds for the whole command line: the profile's flags, then the user's
    profile_flags = shlex.join(load_profile(Path(profile), TARGETS.get(target)).argv(
        "rtx-pro-6000", 2 if flags else 1, profile_reader().given_options(list(args))))
    assert f"build the set: python -m builder kernels build --target {target} --model " \
        f"{model} -- {profile_flags}{' ' if flags else ''}{shlex.join(flags)}; or set " in line
    assert "SGLANG_SM120_SKIP_KERNEL_CHECK=1" in line
    started = launch(env.python, *args, path=f"{patched}{os.pathsep}{covering}", **common)
    assert started.returncode == 0, started.stderr[-3000:]
    assert "kernel wheels flashinfer-jit-cache" in started.stderr
    assert f"cover {left_out}" in started.stderr or f", {left_out}" in started.stderr
    words = shlex.split(started.stdout)
    assert words[0] == "FLASHINFER_DISABLE_JIT=1" and words[2:4] == ["-m",
                                                                     "sglang.launch_server"]


@pytest.mark.slow(reason="runs the launcher's backend selection in a release's behaviour "
                  "environment", group=BEHAVIOUR)
def test_the_selection_is_kept_by_its_inputs_and_shipped_in_the_jit_cache_artifact(
        shared_cache: Path, tmp_path: Path) -> None:
    """Run 6 of the derived-serving report: with every JIT cache shipped, the launcher's
    selection was about 30 s of each start. A start whose inputs are those of a kept
    selection takes it, and it decides as the selection it ran did (the refusal too); any
    input that differs runs it again; a recorded run's selection travels in the artifact."""
    from builder.behaviour.run import zoo_forms
    from builder.kernels.jit_caches import pack_jit_caches

    env, patched = _release(shared_cache, "sglang-0.5.23")
    zoo = zoo_forms()
    model = zoo.write(zoo.BY_NAME["qwen3-30b-a3b-bf16"], tmp_path / "zoo")
    full = default_groups(tuple(TARGETS.get("sglang-0.5.23").arch_list))
    covering = kernel_site(tmp_path / "full", "sglang-0.5.23", "0.7.2", full)
    lacking = kernel_site(tmp_path / "lacking", "sglang-0.5.23", "0.7.2",
                          tuple(g for g in full if g != "attention"))
    standins = json.dumps(env.standins)
    kept = tmp_path / "server" / "sglang-sm120" / "selection"

    def start(site: Path, *flags: str, cache: str = "server", **more: str
              ) -> subprocess.CompletedProcess[str]:
        return launch(env.python, "--model-path", str(model), *flags,
                      path=f"{patched}{os.pathsep}{site}", SGLANG_SM120_STANDINS=standins,
                      SGLANG_CACHE_DIR=str(tmp_path / cache), **more)

    first = start(covering)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "kernel wheels flashinfer-jit-cache" in first.stderr
    assert "selection kept" not in first.stderr  # it ran
    files = sorted(kept.iterdir())
    assert len(files) == 1, files
    record = json.loads(files[0].read_text())
    assert files[0].name == record["key"] + ".json"
    assert record["observed"]["attention_backend"] == "flashinfer"

    # the same inputs: taken, and the same refusal where the wheels lack a module
    again = start(covering)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"(the selection kept in {files[0]}, of the same inputs)" in again.stderr
    refused = start(lacking)
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr[-3000:]
    assert "missing module group attention" in refused.stderr
    assert f"the selection kept in {files[0]}" in refused.stderr

    # another input: it runs again (a flag; an SGLang variable), a place is no input
    other = start(covering, "--max-running-requests", "8")
    assert other.returncode == 0 and "selection kept" not in other.stderr, other.stderr
    variable = start(covering, SGLANG_ENABLE_TORCH_COMPILE="1")
    assert variable.returncode == 0 and "selection kept" not in variable.stderr
    assert len(list(kept.iterdir())) == 3
    placed = start(covering, SGLANG_TORCH_PROFILER_DIR=str(tmp_path / "profiles"))
    assert "selection kept" in placed.stderr, placed.stderr

    # a kept file of another key, or of this key with content no selection gives, is not
    # taken: the selection runs (a fresh walk crashed the launcher with the latter)
    assert files[0].stat().st_mode & 0o777 == 0o644 & ~_umask()
    good = files[0].read_text()
    for bad in (json.dumps({**record, "key": "0" * 64}), "[" * 200_000 + "]" * 200_000,
                json.dumps({**record, "observed": {**record["observed"], "attention": "x"}}),
                json.dumps({**record, "observed": {}})):
        files[0].write_text(bad)
        tampered = start(covering)
        assert tampered.returncode == 0, tampered.stderr[-3000:]
        assert "kernel wheels flashinfer-jit-cache" in tampered.stderr
        assert "selection kept" not in tampered.stderr
        assert files[0].read_text() == good  # kept again, as the selection gave it
    # a recorded run that cannot keep it says so (it would ship nothing)
    unkept = tmp_path / "unkept"
    unkept.mkdir()
    (unkept / "selection").write_text("a file")
    said = start(covering, SGLANG_SM120_TRITON_WATCH=str(unkept))
    assert said.returncode == 0, said.stderr[-3000:]
    assert f"the selection not kept in {unkept / 'selection'}" in said.stderr

    # a recorded run keeps it in the watch folder too; the artifact ships it to another
    # machine's first start (an empty SGLang cache)
    watch = tmp_path / "watch"
    recorded = start(covering, SGLANG_SM120_TRITON_WATCH=str(watch))
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    (triton := tmp_path / "triton" / "KEY").mkdir(parents=True)
    (triton / "k.cubin").write_bytes(b"cubin")
    (tmp_path / "triton" / "sm120-triton-cache.json").write_text(json.dumps(
        {"built_with": {"triton": "3.9.0", "arch": "12.0f"}}))
    packed = pack_jit_caches({"triton": tmp_path / "triton"}, target="sglang-0.5.23",
                             release="0.5.23", version="0.5.23+sm120.1", epoch=1_700_000_000,
                             out_dir=tmp_path / "dist", selections=watch / "selection")
    assert packed.manifest["selection"]["entries"] == 1
    artifact = tmp_path / "artifact-site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(artifact), str(packed.wheel)], check=True, timeout=300)
    shipped = start(covering, cache="fresh",
                    SGLANG_SM120_JIT_CACHES=str(artifact / "sglang_sm120_jit_caches"))
    assert shipped.returncode == 0, shipped.stderr[-3000:]
    assert f"(the selection kept in {artifact / 'sglang_sm120_jit_caches' / 'selection'}" \
        in shipped.stderr


@pytest.mark.slow(reason="runs the launcher's backend selection in a release's behaviour "
                  "environment", group=BEHAVIOUR)
def test_the_launcher_refuses_a_fused_moe_pruned_to_other_dtype_pairs(
        shared_cache: Path, tmp_path: Path) -> None:
    from builder.behaviour.run import zoo_forms

    env, patched = _release(shared_cache, "sglang-0.5.23")
    zoo = zoo_forms()
    model = zoo.write(zoo.BY_NAME["qwen3-30b-a3b-ct-nvfp4"], tmp_path / "zoo")
    pruned = kernel_site(tmp_path / "pruned", "sglang-0.5.23", "0.7.2",
                         default_groups(("12.0f",)), ("bf16 x bf16",))
    done = launch(env.python, "--model-path", str(model), path=f"{patched}{os.pathsep}{pruned}",
                  SGLANG_SM120_STANDINS=json.dumps(env.standins))
    assert done.returncode == 2, done.stderr[-3000:]
    assert "missing fused MoE dtype pair nvfp4 x nvfp4 (fused_moe_sm120 is pruned to " \
        "bf16 x bf16)" in done.stderr


def test_several_installed_manifests_keep_a_pruned_moe_and_unite_the_rest() -> None:
    pruned = {"groups": ["fused_moe_sm120"], "moe_variants": ["bf16 x bf16"],
              "modules": [{"name": "fused_moe_120", "group": "fused_moe_sm120"}],
              "arch_list": ["12.0f"], "flashinfer_version": "0.7.2", "target": "sglang-0.5.23"}
    other = {"groups": ["norm"], "modules": [{"name": "norm", "group": "norm"}],
             "arch_list": ["9.0a"], "flashinfer_version": "0.7.2"}
    assert coverage.combined([pruned]) == pruned
    merged = coverage.combined([pruned, other])
    assert coverage.moe_variants_of(merged, "fused_moe_sm120") == ["bf16 x bf16"]
    assert merged["groups"] == ["fused_moe_sm120", "norm"]
    assert merged["arch_list"] == ["12.0f", "9.0a"] and merged["target"] == "sglang-0.5.23"
    assert merged["flashinfer_version"] == "0.7.2"
    assert coverage.combined([pruned, {**other, "flashinfer_version": "0.6.18"}])[
        "flashinfer_version"] == "0.6.18/0.7.2"


def test_the_shared_rules_are_the_builders() -> None:
    """The launcher loads the same table and refusal as ``serve-command --check``."""
    from builder.kernels import derive

    assert derive.TABLE is coverage.TABLE and derive.missing_from is coverage.missing_from
    assert jitcache.MANIFEST == coverage.MANIFEST
    assert (LAUNCHER_SOURCE.parent / "sglang_sm120_coverage.py").resolve() == \
        Path(coverage.__file__).resolve()
