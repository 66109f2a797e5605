"""What a server configuration loads from FlashInfer, and whether kernel wheels cover it.

The one owner of the mapping from the release's backend selection to FlashInfer module
groups (:data:`TABLE`), of the derivation (:func:`derive`) and of the comparison with a
kernel wheel's manifest (:func:`missing_from`, :func:`refusal`). Two callers:
``builder.kernels.derive`` (``kernels --model``, ``serve-command --check``) and the image's
launcher ``sglang-sm120-serve``, which loads this file by path from its own folder
(``builder/image/data/sglang_sm120_coverage.py`` is a link to it; the image build copies it
beside the launcher). So the builder and the image refuse the same kernel sets with the same
words.

Standard library only, Python 3.11 or newer; it reads no file (the callers read the
manifests and checkpoint files, each with its own JSON reader) and imports nothing of the
builder but ``builder.kernels.prune`` (stdlib only too: which dtype pairs a pruned fused MoE
module runs), which beside the launcher is ``sglang_sm120_prune.py``.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # the builder's
    from builder.kernels.prune import covers
except ImportError:  # beside the image's launcher: sglang_sm120_prune.py, a copy of it
    from sglang_sm120_prune import covers  # type: ignore[import-not-found,no-redef]

#: The manifest a kernel wheel of this builder carries (``builder.kernels.jitcache`` writes
#: it beside the package's ``__init__.py``, or in the provider's package from FlashInfer 0.7).
MANIFEST = "sm120-manifest.json"
#: The distributions kernel wheels install as (``flashinfer-jit-cache`` up to FlashInfer
#: 0.6, its providers ``flashinfer-jit-cache-sm120f`` from 0.7), normalised.
DISTRIBUTION_PREFIX = "flashinfer-jit-cache"


class CoverageError(ValueError):
    """A configuration with no kernel set: ``args[0]`` says why, ``hint`` what to do."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


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
        raise CoverageError(f"no arch to name the module groups after ({arch_list!r})",
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
    if "W4AFp8" in method or "Int4Fp8" in method:  # before "Fp8", which they contain
        return "fp8 x int4"
    if "Fp8" in method:
        return "fp8 x fp8"
    if "Mxfp4" in method:
        return "bf16 x mxfp4"
    return "bf16 x bf16"


#: The routed experts' dtype pair per ``quant_algo`` of a ModelOpt ``MIXED_PRECISION``
#: layer entry (``ModelOptMixedPrecisionConfig.get_quant_method``, sglang 0.5.16-0.5.23: an
#: FP8 layer gets ``ModelOptFp8MoEMethod``, an NVFP4 one ``ModelOptNvFp4FusedMoEMethod``).
#: Another algo is named as such: no prune rule covers it, so the module is built whole.
_MIXED_MOE_PAIRS = {"NVFP4": "nvfp4 x nvfp4", "FP8": "fp8 x fp8"}


def mixed_moe_pairs(config: dict[str, Any], hf_quant: dict[str, Any] | None) -> list[str]:
    """The dtype pairs of every routed-expert layer of a ModelOpt ``MIXED_PRECISION``
    checkpoint (each layer picks its own MoE method); ``[]`` for any other checkpoint, whose
    MoE layers all run the method the selection observed on one.

    An expert layer named in ``exclude_modules`` runs unquantized (``bf16 x bf16``).
    """
    tables = [config.get("quantization_config") or {}, (hf_quant or {}).get("quantization")
              or {}]
    for table in tables:
        if not isinstance(table, dict) or str(table.get("quant_algo")) != "MIXED_PRECISION":
            continue
        layers = table.get("quantized_layers") or {}
        algos = sorted({str(v.get("quant_algo")) for k, v in layers.items()
                        if ".experts." in str(k) and isinstance(v, dict)})
        pairs = [_MIXED_MOE_PAIRS.get(a, f"modelopt {a}") for a in algos]
        # a routed-expert pattern; a shared expert is a dense MLP, not a MoE layer
        if any(re.search(r"(?<!shared_)experts", str(m))
               for m in table.get("exclude_modules") or ()):
            pairs.append("bf16 x bf16")
        return pairs
    return []


def _moe_variants(selection: dict[str, Any]) -> tuple[str, ...]:
    """Every MoE dtype pair the server runs: the observed layer's, and each layer's of a
    mixed-precision checkpoint (:func:`mixed_moe_pairs`, in ``moe_layer_pairs``)."""
    return tuple(dict.fromkeys([_moe_variant(selection),
                                *(str(p) for p in selection.get("moe_layer_pairs") or ())]))


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
        "moe_fp4_quantization": moe if "nvfp4 x nvfp4" in _moe_variants(selection) else None,
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
        selection: ``builder.kernels.derive.select_backends``'s answer for one configuration.
        arch_list: the build's archs (the per-arch groups are named after the first).

    Returns:
        the :class:`Derived` set.

    Raises:
        CoverageError: the release refused the configuration at start-up (the server
            would not start: nothing to build for it), or ``arch_list`` names no arch.
    """
    if selection.get("refused"):
        raise CoverageError(f"the release refuses this configuration at start-up: "
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
        if row.group.startswith("fused_moe"):  # one need per dtype pair the layers run
            needs += [Need(row.group.format(**names), pair, f"{row.selected}={value}",
                           row.function.format(**names)) for pair in _moe_variants(selection)]
            continue
        variant = ""
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


def build_command(target: str, model: Path | str, flags: tuple[str, ...]) -> str:
    """The ``kernels`` command that builds the derived set."""
    words = ["python", "-m", "builder", "kernels", "build", "--target", target, "--model",
             str(model)]
    if flags:
        words += ["--", *flags]
    return shlex.join(words)


def refusal(missing: list[str], *, wheel: str, model: Path | str, target: str,
            flags: tuple[str, ...]) -> tuple[str, str]:
    """The one message refusing a kernel set that lacks ``missing``, and its hint (the
    ``kernels`` command that builds the set): ``serve-command --check`` and the image's
    launcher say the same.

    Args:
        missing: :func:`missing_from`'s phrases (not empty).
        wheel: the kernel wheel(s) compared, as the user knows them.
        model: the checkpoint folder.
        target: the builder's target the set is built for.
        flags: the server flags after ``--model-path``.

    Returns:
        ``(message, hint)``.
    """
    # A pruned pair is in the module FlashInfer loads: its stub raises whatever the JIT says.
    pruned = any(m.startswith("fused MoE dtype pair ") for m in missing)
    modules = len(missing) > sum(m.startswith("fused MoE dtype pair ") for m in missing)
    effect = "; ".join(
        ([("with FLASHINFER_DISABLE_JIT=1 the server fails when it first loads a missing "
           "module; with JIT on it compiles it for minutes at first use")] if modules else [])
        + (["a pruned pair's MoE layer raises the stub's RuntimeError when it first runs"]
           if pruned else []))
    return (f"the kernel wheel {wheel} does not cover {model} with these flags: missing "
            f"{'; '.join(missing)} ({effect})",
            f"build the set: {build_command(target, model, flags)}")


def checkpoint_facts(config: dict[str, Any], hf_quant: dict[str, Any] | None
                     ) -> dict[str, Any]:
    """What :func:`derive` reads from the checkpoint's own files besides the selection:
    ``fp4_linears`` (:func:`has_fp4_linears`), ``fp4_checkpoint`` (NVFP4 anywhere in
    its quantization declaration: the linears or the routed experts) and
    ``moe_layer_pairs`` (:func:`mixed_moe_pairs`: the selection observes one MoE layer).

    Args:
        config: the checkpoint's ``config.json``.
        hf_quant: its ``hf_quant_config.json`` (``None``: it has none).
    """
    linears = has_fp4_linears(config, hf_quant)
    declared = json.dumps([config.get("quantization_config"), hf_quant]).lower()
    return {"fp4_linears": linears, "fp4_checkpoint": linears or "fp4" in declared,
            "moe_layer_pairs": mixed_moe_pairs(config, hf_quant)}


def manifest_files() -> list[tuple[str, Path]]:
    """Where the kernel wheels installed in this Python keep their :data:`MANIFEST`, as
    ``(distribution and version, path)`` in the order ``importlib.metadata`` finds them
    (before FlashInfer 0.7 the one ``flashinfer-jit-cache``; from 0.7 one provider per arch,
    the shim holding none)."""
    found = []
    for dist in importlib.metadata.distributions():
        name = str(dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name.startswith(DISTRIBUTION_PREFIX):
            continue
        for file in dist.files or ():
            if file.name == MANIFEST:
                found.append((f"{name} {dist.version} (installed)", Path(str(file.locate()))))
    return found


def combined(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """One manifest covering what each of ``manifests`` covers (FlashInfer picks, per
    module, the installed provider that fits the GPU).

    One manifest is itself. Several: the union of groups, modules, head dims and archs; the
    FlashInfer version when they agree (else all, joined by ``/``, which equals no release);
    ``fast_build`` when any is one; a fused MoE module pruned only by its manifest's
    ``moe_variants`` keeps them as its own ``pruned`` record, so that
    :func:`moe_variants_of` still sees which dtype pairs it runs.
    """
    if len(manifests) == 1:
        return dict(manifests[0])
    versions = sorted({str(m.get("flashinfer_version")) for m in manifests
                       if m.get("flashinfer_version") is not None})
    modules = []
    for manifest in manifests:
        for module in manifest.get("modules") or ():
            if isinstance(module, dict) and manifest.get("moe_variants") and \
                    str(module.get("group", "")).startswith("fused_moe_sm") and \
                    not isinstance(module.get("pruned"), dict):
                module = {**module, "pruned": {"variants": list(manifest["moe_variants"])}}
            modules.append(module)
    merged: dict[str, Any] = {
        "groups": [g for m in manifests for g in m.get("groups") or ()],
        "modules": modules,
        "head_dims": [h for m in manifests for h in m.get("head_dims") or ()],
        "arch_list": [a for m in manifests for a in m.get("arch_list") or ()],
        "target": next((m["target"] for m in manifests if m.get("target")), None)}
    if versions:
        merged["flashinfer_version"] = "/".join(versions)
    if any(m.get("fast_build") for m in manifests):
        merged["fast_build"] = True
    return merged
