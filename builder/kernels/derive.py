"""The kernels a server will load, derived from the model and the server flags.

Three parts:

* :data:`TABLE`: the one mapping from what the release selects (MoE runner and its
  dtypes, FP4/FP8 GEMM backends, attention backend with its head dims and dtypes, sampling
  backend) to the FlashInfer module groups the builder compiles, each row naming the
  FlashInfer function that builds the module.
* :func:`select_backends`: the release's own selection for a checkpoint folder and server
  flags (``behaviour/script/select_backends.py`` in the target's behaviour environment, on
  the patched code, the device reported as SM120), and :func:`derive`, which turns it into
  module groups, head dims and the variants inside the groups (:class:`Derived`).
* :func:`missing_from` and :func:`require_coverage`: what a kernel wheel's manifest lacks
  for a derived set (a module group, a head dim, an arch, or a dtype pair its pruned fused
  MoE module left out: :mod:`builder.kernels.prune`), refused in one message that names
  the ``kernels`` command building it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core.arch import SM120
from builder.core.errors import BuildError, ConfigurationError
from builder.core.userfiles import parse_json
from builder.kernels.prune import covers

_SCRIPTS = Path(__file__).resolve().parent.parent / "behaviour" / "script"
SCRIPT = _SCRIPTS / "select_backends.py"
_PREFIX = "SELECTED "

#: The FlashInfer releases every row's function was read in (``flashinfer/jit/*.py`` of the
#: flashinfer-python the releases 0.5.16, 0.5.20 and 0.5.23 pin, as their behaviour
#: environments install it).
CHECKED_IN = ("0.6.14", "0.6.18", "0.7.2")


@dataclass(frozen=True)
class ModuleRow:
    """One row of :data:`TABLE`: when the selection has ``value`` for ``selected``, the
    server loads the module(s) of ``group``.

    Attributes:
        selected: the selection's field (``moe_runner``, ``fp4_gemm``, ``attention``,
            ``sampling``, ``moe_fp4_quantization``, ``always``).
        values: the backends (or quant methods) that load it.
        group: the module group (``{sm}`` is the arch's ``120``, ``{smf}`` ``120f`` for a
            ``12.0f`` build).
        function: the FlashInfer function that builds the module.
        why: where the release calls it.
    """

    selected: str
    values: tuple[str, ...]
    group: str
    function: str
    why: str


#: What each selected backend loads, checked in FlashInfer :data:`CHECKED_IN`.
TABLE: tuple[ModuleRow, ...] = (
    ModuleRow("moe_runner", ("flashinfer_cutlass",), "fused_moe_sm{sm}",
              "flashinfer.jit.fused_moe.gen_cutlass_fused_moe_sm{sm}_module",
              "fused_moe/core.py:get_cutlass_fused_moe_module; one module holds every "
              "dtype pair (variants say which the model runs)"),
    ModuleRow("moe_runner", ("flashinfer_cutlass",), "trtllm_utils",
              "flashinfer.jit.tllm_utils.gen_trtllm_utils_module",
              "autotuner.py's delay_kernel, called while profiling each MoE tactic"),
    ModuleRow("moe_fp4_quantization", ("flashinfer_cutlass",), "fp4_quantization_sm{smf}",
              "flashinfer.jit.fp4_quantization.gen_fp4_quantization_sm{smf}_module",
              "fp4_quantize of the NVFP4 MoE's activations "
              "(quantization/fp4_quantization.py:get_fp4_quantization_module)"),
    ModuleRow("fp4_gemm", ("flashinfer_cutlass",), "fp4_gemm_sm{sm}",
              "flashinfer.jit.gemm.core.gen_gemm_sm{sm}_module_cutlass_fp4",
              "gemm/gemm_base.py:mm_fp4 with backend cutlass (dense NVFP4 linears)"),
    ModuleRow("fp4_gemm", ("flashinfer_cutlass",), "trtllm_utils",
              "flashinfer.jit.tllm_utils.gen_trtllm_utils_module",
              "the FP4 GEMM's autotuner profiles its tactics with delay_kernel"),
    ModuleRow("fp4_gemm", ("flashinfer_cutlass", "flashinfer_b12x", "flashinfer_cudnn",
                           "flashinfer_cutedsl"), "fp4_quantization_sm{smf}",
              "flashinfer.jit.fp4_quantization.gen_fp4_quantization_sm{smf}_module",
              "sglang layers/quantization/fp4_utils.py quantizes the activations with "
              "flashinfer.fp4_quantize whatever the GEMM (b12x and cutedsl are CuTe DSL, "
              "cudnn a cuDNN graph: no JIT module of their own)"),
    ModuleRow("attention", ("flashinfer",), "attention",
              "flashinfer.aot.gen_fa2 (jit/attention/modules.py:gen_batch_prefill_module, "
              "gen_batch_decode_module)",
              "layers/attention/flashinfer_backend.py: FA2 paged prefill and decode for "
              "the model's head dim and dtypes"),
    ModuleRow("sampling", ("flashinfer",), "sampling",
              "flashinfer.jit.sampling.gen_sampling_module",
              "layers/sampler.py: top_k_top_p_sampling_from_probs, min_p_sampling_from_probs"),
    ModuleRow("always", ("*",), "norm", "flashinfer.jit.norm.gen_norm_module",
              "layers/layernorm.py imports flashinfer.norm (layernorm, rmsnorm_quant) "
              "whatever the model; not derived, kept (small)"),
    ModuleRow("always", ("*",), "rope", "flashinfer.jit.rope.gen_rope_module",
              "rotary embeddings may call it; not derived, kept (small)"),
    ModuleRow("always", ("*",), "activation",
              "flashinfer.jit.activation.gen_act_and_mul_module",
              "not derived, kept from the default set (small)"),
    ModuleRow("always", ("*",), "page", "flashinfer.jit.page.gen_page_module",
              "paged KV appends (DSA top-k backend); not derived, kept (small)"),
)

#: Attention dtypes the ``attention`` group compiles (q and KV the same:
#: ``flashinfer_aot._attention``).
ATTENTION_DTYPES = ("bfloat16", "float16")
_KV_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "bf16": "bfloat16",
              "bfloat16": "bfloat16", "float16": "float16", "fp16": "float16"}


@dataclass(frozen=True)
class Need:
    """One thing the server will load: a module group and, where known, the variant inside.

    Attributes:
        group: the module group.
        variant: the dtype/head-dim variant (``""``: the whole group).
        because: the selection that needs it (``moe_runner=flashinfer_cutlass``).
        function: the FlashInfer function that builds it (from :data:`TABLE`).
    """

    group: str
    variant: str
    because: str
    function: str

    def describe(self) -> dict[str, str]:
        """JSON-ready data."""
        return {"group": self.group, "variant": self.variant, "because": self.because,
                "function": self.function}


@dataclass(frozen=True)
class Derived:
    """The kernels a configuration loads: groups, attention head dims and every need.

    Attributes:
        groups: module groups, in :data:`TABLE` order.
        head_dims: the attention group's head dims (empty without ``attention``).
        needs: each group and variant with the selection that needs it.
        selection: the release's selection it was derived from.
        unbuildable: needs no module group of the builder compiles (with why).
    """

    groups: tuple[str, ...]
    head_dims: tuple[int, ...]
    needs: tuple[Need, ...]
    selection: dict[str, Any] = field(default_factory=dict)
    unbuildable: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        """JSON-ready data (the ``derived`` part of a plan)."""
        return {"groups": list(self.groups), "head_dims": list(self.head_dims),
                "needs": [n.describe() for n in self.needs],
                "unbuildable": list(self.unbuildable), "selection": self.selection}


def _arch_names(arch_list: tuple[str, ...]) -> dict[str, str]:
    """``{sm}`` and ``{smf}`` of the first arch (``12.0f`` -> ``120``, ``120f``)."""
    match = re.fullmatch(r"(\d+)\.(\d+)([af]?)", arch_list[0]) if arch_list else None
    if match is None:
        raise ConfigurationError(f"no arch to name the module groups after ({arch_list!r})",
                                 "give --arch-list, e.g. 12.0f")
    sm = match.group(1) + match.group(2)
    return {"sm": sm, "smf": sm + ("f" if match.group(3) == "f" else "")}


def _moe_variant(selection: dict[str, Any]) -> str:
    """The MoE's activation x weight dtypes, from the quant method the layer built."""
    method = str(selection.get("moe_method") or "")
    if "NvFp4" in method or "Fp4" in method:
        return "nvfp4 x nvfp4"
    if method.startswith("CompressedTensors"):
        return "nvfp4 x nvfp4" if selection.get("fp4_checkpoint") else "compressed-tensors"
    if "Fp8" in method:
        return "fp8 x fp8"
    if "W4AFp8" in method:
        return "fp8 x int4"
    if "Mxfp4" in method:
        return "bf16 x mxfp4"
    return "bf16 x bf16"


def has_fp4_linears(config: dict[str, Any], hf_quant: dict[str, Any] | None) -> bool:
    """Whether the checkpoint declares NVFP4 for layers other than the routed experts (the
    dense linears that run the FP4 GEMM).

    ModelOpt ``NVFP4`` quantizes every linear but the excluded ones; ``MIXED_PRECISION``
    lists its layers (``quantized_layers``, read as sglang 0.5.16-0.5.23's
    ``ModelOptMixedPrecisionConfig.from_config`` does); compressed-tensors NVFP4 targets
    ``Linear``. The routed experts run the MoE runner, not the GEMM.
    """
    tables = [config.get("quantization_config") or {}, (hf_quant or {}).get("quantization")
              or {}]
    for table in tables:
        algo = str(table.get("quant_algo") or "")
        if table.get("quant_method") == "compressed-tensors":
            return "nvfp4" in str(table.get("format", "")).lower()
        if algo == "MIXED_PRECISION":
            return any("NVFP4" in str(v.get("quant_algo", "")) and ".experts." not in k
                       for k, v in (table.get("quantized_layers") or {}).items())
        if "FP4" in algo:
            return True
    return False


def _present(selection: dict[str, Any]) -> dict[str, Any]:
    """The value of each :data:`TABLE` field in a selection (``None``: not selected)."""
    backend = selection.get("layer_moe_backend") or selection.get("moe_runner_backend")
    moe = backend if selection.get("moe_method") else None
    attention_backends = {selection.get(k) for k in (
        "attention_backend", "prefill_attention_backend", "decode_attention_backend")}
    return {
        "moe_runner": moe,
        "moe_fp4_quantization": moe if _moe_variant(selection) == "nvfp4 x nvfp4" else None,
        "fp4_gemm": selection.get("fp4_gemm_backend") if selection.get("fp4_linears")
        else None,
        "fp8_gemm": selection.get("fp8_gemm_backend")
        if "fp8" in str(selection.get("model_quantization")) else None,
        "attention": "flashinfer" if "flashinfer" in attention_backends else None,
        "sampling": selection.get("sampling_backend") or "flashinfer",
        "always": "*",
    }


def _attention_variant(selection: dict[str, Any]) -> tuple[str, int, str | None]:
    """The FA2 variant the attention backend loads: ``(variant, head dim, why no group
    compiles it or None)``."""
    attention = selection.get("attention") or {}
    if attention.get("attention_arch") == "MLA":
        return "MLA", 0, ("attention: flashinfer MLA (gen_batch_mla_module) is not a module "
                          "group of the builder")
    dim = int(attention.get("head_dim") or 0)
    v_dim = int(attention.get("v_head_dim") or dim)
    dtype = str(attention.get("dtype") or "bfloat16")
    kv = _KV_DTYPES.get(str(selection.get("kv_cache_dtype")), dtype)
    variant = f"head_dim {dim}, q {dtype}, kv {kv}"
    if v_dim != dim or kv != dtype or dtype not in ATTENTION_DTYPES:
        return variant, dim, (f"attention {variant}, v head dim {v_dim}: the attention group "
                              "compiles equal q/kv dtypes and head dims only")
    return variant, dim, None


def derive(selection: dict[str, Any], arch_list: tuple[str, ...]) -> Derived:
    """The module groups, head dims and variants a selection loads (:data:`TABLE`).

    Args:
        selection: :func:`select_backends`'s answer for one configuration.
        arch_list: the build's archs (the per-arch groups are named after the first).

    Returns:
        the :class:`Derived` set.

    Raises:
        ConfigurationError: the release refused the configuration at start-up (the server
            would not start: nothing to build for it).
    """
    if selection.get("refused"):
        raise ConfigurationError(f"the release refuses this configuration at start-up: "
                                 f"{selection['refused']}", "fix the server flags first")
    names = _arch_names(arch_list)
    present = _present(selection)
    needs: list[Need] = []
    unbuildable: list[str] = []
    head_dims: list[int] = []
    for row in TABLE:
        value = present.get(row.selected)
        if value is None or value not in row.values:
            continue
        variant = _moe_variant(selection) if row.group.startswith("fused_moe") else ""
        if row.selected == "attention":
            variant, dim, note = _attention_variant(selection)
            if note:
                unbuildable.append(note)
            if variant == "MLA":
                continue
            if dim and dim not in head_dims:
                head_dims.append(dim)
        needs.append(Need(row.group.format(**names), variant, f"{row.selected}={value}",
                          row.function.format(**names)))
    for name in ("moe_runner", "fp4_gemm", "fp8_gemm"):
        value = present[name]
        known = {v for row in TABLE if row.selected == name for v in row.values}
        if isinstance(value, str) and value.startswith("flashinfer") and value not in known:
            unbuildable.append(f"{name}={value}: no row of the table names its FlashInfer "
                               "module")
    groups = tuple(dict.fromkeys(n.group for n in needs))
    return Derived(groups, tuple(head_dims), tuple(needs), selection, tuple(unbuildable))


def server_kwargs(env: Any, model: Path, flags: tuple[str, ...]) -> dict[str, Any]:
    """The ``ServerArgs`` keyword arguments the flags set, parsed by the release's own parser
    (the values that differ from a bare ``--model-path``).

    Raises:
        ConfigurationError: the release's parser refuses the flags.
    """
    from builder.behaviour.env import parse_with_release

    argvs = [["--model-path", str(model), *flags], ["--model-path", str(model)]]
    answers = parse_with_release(env, argvs)
    given, bare = answers
    if not given["ok"]:
        raise ConfigurationError(f"sglang {env.release}'s own argument parser refuses the "
                                 f"server flags: {given['error']}",
                                 "drop or fix the argument it names")
    return {k: v for k, v in given["values"].items()
            if k != "model_path" and bare["values"].get(k) != v}


def run_select(env: Any, cases: list[tuple[Path, dict[str, Any]]],
               overlay: Path | None) -> list[dict[str, Any]]:
    """Run ``select_backends.py`` in the release's environment, one answer per case.

    Args:
        env: the release's behaviour environment.
        cases: (checkpoint folder, ``ServerArgs`` keyword arguments) each.
        overlay: the patched tree, first on the path (``None``: upstream's code).

    Raises:
        BuildError: the script printed no answer for a case (it crashed).
    """
    request = {"cases": [{"id": str(i), "model_dir": str(m), "args": a}
                         for i, (m, a) in enumerate(cases)], "standins": env.standins}
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    environ["SM120_CAPABILITY"] = SM120
    environ["PYTHONDONTWRITEBYTECODE"] = "1"  # the overlay is a cache entry
    if overlay is not None:
        environ["PYTHONPATH"] = str(overlay)
    done = subprocess.run([str(env.python), str(SCRIPT)], input=json.dumps(request),
                          capture_output=True, text=True, env=environ, check=False,
                          timeout=3600)
    found: dict[str, dict[str, Any]] = {}
    for line in done.stdout.splitlines():
        if line.startswith(_PREFIX):
            record = json.loads(line[len(_PREFIX):])
            found[record["id"]] = record.get("observed") or {
                "refused": record.get("error", "no result")}
    if len(found) != len(cases):
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise BuildError(f"the backend selection printed {len(found)} of {len(cases)} "
                         f"answers (exit {done.returncode}):\n{tail}",
                         "run builder/behaviour/script/select_backends.py by hand in the "
                         "behaviour environment to see why")
    answers = []
    for index, (model, _args) in enumerate(cases):
        answer = found[str(index)]
        answer["fp4_linears"] = _fp4_linears(model)
        answer["fp4_checkpoint"] = answer["fp4_linears"] or _fp4_experts(model)
        answers.append(answer)
    return answers


def _read_quant(model: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    config = parse_json((model / "config.json").read_bytes())
    quant = model / "hf_quant_config.json"
    return config, parse_json(quant.read_bytes()) if quant.exists() else None


def _fp4_linears(model: Path) -> bool:
    return has_fp4_linears(*_read_quant(model))


def _fp4_experts(model: Path) -> bool:
    config, hf_quant = _read_quant(model)
    return "fp4" in json.dumps([config.get("quantization_config"), hf_quant]).lower()


def read_model(model: Path) -> Path:
    """The checkpoint folder (a ``config.json`` given: its folder), its JSON files read.

    Both files are read here, before the release's selection runs on them, so that a
    file that is not one JSON object is the user's input error, not a crash later.

    Raises:
        ConfigurationError: no ``config.json`` there, or ``config.json`` or
            ``hf_quant_config.json`` is not UTF-8 JSON holding one object (a key named
            twice included).
    """
    folder = model.parent if model.name == "config.json" else model
    if not (folder / "config.json").is_file():
        raise ConfigurationError(f"{model} has no config.json",
                                 "give the checkpoint folder (config.json, and "
                                 "hf_quant_config.json where the checkpoint has one)")
    for name in ("config.json", "hf_quant_config.json"):
        path = folder / name
        if name != "config.json" and not path.exists():
            continue
        if not path.is_file():  # a fifo would block the read
            raise ConfigurationError(f"{path} is not a file", f"give {name} as a file")
        try:
            data = parse_json(path.read_bytes())
        except (OSError, ValueError) as error:  # JSON, UTF-8 and duplicate-key errors
            raise ConfigurationError(f"{path} is not a checkpoint's JSON: {error}",
                                     f"fix or replace {name} (the checkpoint's own file)"
                                     ) from error
        if not isinstance(data, dict):
            raise ConfigurationError(f"{path} holds a {type(data).__name__}, not a JSON "
                                     "object", f"fix or replace {name}")
    return folder


def select_backends(options: Any, target: Any, model: Path, flags: tuple[str, ...]
                    ) -> dict[str, Any]:
    """The target's own selection for ``model`` and ``flags``, on its patched code.

    The release's pinned wheel is fetched, the series applied (the patch stage) and the
    behaviour environment found or installed (``builder.behaviour.env.behaviour_env``;
    the first run installs the release on a CPU torch, minutes).

    Raises:
        ConfigurationError: no ``config.json``, the target pins no wheel for this Python, or
            the release's parser refuses the flags.
        BuildError: the environment could not be installed or the selection crashed.
    """
    from builder.behaviour.env import behaviour_env
    from builder.behaviour.run import wheel_for_interpreter
    from builder.patching.apply import apply_series, read_series
    from builder.patching.series import select_series
    from builder.source.fetch import fetch_pin

    folder = read_model(model)
    series = select_series(options, target)
    read_series(series)
    pin = wheel_for_interpreter(target)
    source = fetch_pin(pin, target.upstream_version, cache=options.cache,
                       index_url=options.index_url, reporter=options.reporter)
    assert source.archive is not None  # a wheel pin always has its file
    patched = apply_series(source, series, cache=options.cache)
    env = behaviour_env(source.archive, str(target.upstream_version), cache=options.cache,
                        reporter=options.reporter)
    kwargs = server_kwargs(env, folder, flags)
    with options.reporter.working(f"sglang {target.upstream_version}'s backend selection "
                                  f"for {folder.name}"):
        return run_select(env, [(folder, kwargs)], patched.tree)[0]


def covered_by(manifest: dict[str, Any]) -> tuple[set[str], set[int], set[str]]:
    """What a kernel wheel's manifest covers: module groups, attention head dims, archs."""
    groups = {str(g) for g in manifest.get("groups") or ()} | \
        {str(m.get("group")) for m in manifest.get("modules") or () if isinstance(m, dict)}
    return groups, {int(h) for h in manifest.get("head_dims") or ()}, \
        {str(a) for a in manifest.get("arch_list") or ()}


def moe_variants_of(manifest: dict[str, Any], group: str) -> list[str] | None:
    """The dtype pairs a kernel wheel's fused MoE module ``group`` was pruned to (its
    modules' ``pruned`` records, else the manifest's ``moe_variants``); ``None``: not
    pruned (every pair), or not a fused MoE group."""
    if not group.startswith("fused_moe_sm"):
        return None
    for module in manifest.get("modules") or ():
        if isinstance(module, dict) and module.get("group") == group and \
                isinstance(module.get("pruned"), dict):
            return [str(v) for v in module["pruned"].get("variants") or ()]
    variants = manifest.get("moe_variants")
    return [str(v) for v in variants] if variants else None


def missing_from(manifest: dict[str, Any], derived: Derived, arch_list: tuple[str, ...],
                 flashinfer: str | None = None) -> list[str]:
    """What the configuration loads that the kernel wheel lacks, one phrase each.

    Args:
        manifest: the kernel wheel's ``sm120-manifest.json``.
        derived: the configuration's :class:`Derived` set.
        arch_list: the archs it must hold.
        flashinfer: the FlashInfer the release pins (``None``: not compared).
    """
    groups, head_dims, archs = covered_by(manifest)
    missing = [f"module group {n.group} ({n.because}"
               + (f", {n.variant}" if n.variant else "") + ")"
               for n in derived.needs if n.group not in groups]
    for need in derived.needs:
        kept = moe_variants_of(manifest, need.group) if need.group in groups else None
        if kept is not None and not covers(kept, need.variant):
            missing.append(f"fused MoE dtype pair {need.variant} ({need.group} is pruned to "
                           f"{', '.join(kept)})")
    missing = list(dict.fromkeys(missing))
    if "attention" in groups:
        missing += [f"attention head dim {h}" for h in derived.head_dims
                    if h not in head_dims]
    missing += [f"arch {a}" for a in arch_list if a not in archs]
    have = manifest.get("flashinfer_version")
    if flashinfer is not None and have is not None and str(have) != str(flashinfer):
        missing.append(f"FlashInfer {flashinfer} (the wheel is for {have})")
    if manifest.get("fast_build") and any(n.group.startswith("fused_moe") for n in
                                          derived.needs):
        missing.append("the full fused MoE module (the wheel is a --fast-build one)")
    return missing


def build_command(target: str, model: Path, flags: tuple[str, ...]) -> str:
    """The ``kernels`` command that builds the derived set."""
    import shlex

    words = ["python", "-m", "builder", "kernels", "build", "--target", target, "--model",
             str(model)]
    if flags:
        words += ["--", *flags]
    return shlex.join(words)


def require_coverage(manifest: dict[str, Any], derived: Derived, *, arch_list: tuple[str, ...],
                     flashinfer: str | None, target: str, model: Path,
                     flags: tuple[str, ...], wheel: str) -> None:
    """Refuse a kernel wheel that does not cover the configuration about to start.

    Raises:
        ConfigurationError: one message naming every missing module group, head dim, arch
            or FlashInfer version, with the ``kernels`` command that builds the set (exit 2).
    """
    missing = missing_from(manifest, derived, arch_list, flashinfer)
    if missing:
        raise ConfigurationError(
            f"the kernel wheel {wheel} does not cover {model} with these flags: missing "
            f"{'; '.join(missing)} (with FLASHINFER_DISABLE_JIT=1 the server fails when it "
            "first loads one; with JIT on it compiles it for minutes at first use)",
            f"build the set: {build_command(target, model, flags)}")


def installed_manifest() -> tuple[str, dict[str, Any]] | None:
    """The manifest of the kernel wheel installed in this Python (the provider's, from
    FlashInfer 0.7), with the distribution's name and version; ``None`` when none is."""
    import importlib.metadata

    from builder.kernels.jitcache import MANIFEST

    for dist in importlib.metadata.distributions():
        name = str(dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name.startswith("flashinfer-jit-cache"):
            continue
        for file in dist.files or ():
            if file.name == MANIFEST:
                data: dict[str, Any] = parse_json(Path(str(file.locate())).read_bytes())
                return f"{name} {dist.version} (installed)", data
    return None
