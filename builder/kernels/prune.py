"""Pruned CUTLASS fused MoE modules: the dtype pairs a configuration never runs, left out.

FlashInfer's ``gen_cutlass_fused_moe_module`` (``flashinfer/jit/fused_moe.py``, 0.6.14 and
0.7.2) compiles one module (``fused_moe_120``, ``fused_moe_90`` ...) from 14 per-dtype units
``moe_gemm_kernels_<act>_<weight>.cu``, each only an explicit instantiation of
``MoeGemmRunner<Act, Weight, Out ...>`` (``moe_gemm_template_dispatch.h``), the launchers
``generate_kernels.py:generate_gemm_operations`` writes (``*.generated.cu``), and shared
units. ``cutlass_fused_moe_instantiation.cu`` and the binding
(``flashinfer_cutlass_fused_moe_binding.cu``, ``FusedMoeRunner``'s constructor) name every
pair's runner, so a unit cannot just be left out: its members would be undefined symbols.

This module is the one owner of the rule (:func:`plan_sources`): a pruned pair's unit is
replaced by a stub (:func:`stub_source`) that defines the same ``MoeGemmRunner`` members as
explicit specialisations throwing one message (the constructor first: FlashInfer's
``FusedMoeRunner`` constructor then fails with it, a ``RuntimeError`` in Python), and a
generated launcher file is dropped when every launcher in it is of pruned pairs (so only the
pruned units could have called it). The member list is FlashInfer's
``include/moe_gemm_kernels.h``; :data:`CHECKED_HEADERS` holds its sha256 for each release
it was read in, and any other header is refused (:func:`check_header`), never guessed.

Standard library only: the kernel driver (``data/flashinfer_aot.py``) loads this file by
path in the build environment, where the builder is not installed.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

#: ``include/moe_gemm_kernels.h`` (under FlashInfer's ``data/csrc``) of each FlashInfer
#: release whose ``MoeGemmRunner`` member list :data:`MEMBERS` was checked against, by
#: sha256 (flashinfer-python 0.6.14, pinned by sglang 0.5.16; 0.7.2, pinned by 0.5.23; read
#: in their behaviour environments). Both declare the same members.
CHECKED_HEADERS = {
    "0.6.14": "70e3723835adf802ac49aee6e045f9474e3978f2d4803609d16e6c06b1b7737e",
    "0.7.2": "6ac2c9451d0c97cb10bacb3a292a2108b761b0d0e34380e40b13977fd8a1c38c",
}
HEADER = "nv_internal/tensorrt_llm/kernels/cutlass_kernels/include/moe_gemm_kernels.h"

#: The per-dtype units of ``gen_cutlass_fused_moe_module`` (FlashInfer 0.6.14 and 0.7.2 list
#: the same 14), by ``<act>_<weight>``.
UNITS = ("fp8_uint4", "fp8_fp8", "fp8_fp4", "fp4_fp4", "fp32_fp32", "fp16_uint8",
         "fp16_uint4", "fp16_fp16", "bf16_uint8", "bf16_uint4", "bf16_fp8", "bf16_bf16",
         "bf16_fp4", "fp16_fp4")
_UNIT = re.compile(r"^moe_gemm_kernels_([a-z0-9]+_[a-z0-9]+)\.cu$")

#: The MoE variant :func:`builder.kernels.derive.derive` reports -> the units whose runner
#: FlashInfer's binding builds for it (``FusedMoeRunner``'s constructor in
#: ``flashinfer_cutlass_fused_moe_binding.cu``, 0.6.14 and 0.7.2): NVFP4 (``isNvfp4Quant``,
#: bf16/fp16 or packed FP4 activations) runs ``CutlassMoeFCRunner<Fp4Type, Fp4Type>``; FP8
#: per-tensor runs fp8 x fp8, DeepSeek's block scales bf16 x fp8; W4A8 fp8 x uint4;
#: MXFP4 weights bf16 x fp4 (W4A16) or, on SM100+, fp8 x fp4. The unquantised variant keeps
#: fp16 too: the derivation does not see the checkpoint's dtype.
VARIANT_UNITS: dict[str, tuple[str, ...]] = {
    "nvfp4 x nvfp4": ("fp4_fp4",),
    "fp8 x fp8": ("fp8_fp8", "bf16_fp8"),
    "fp8 x int4": ("fp8_uint4",),
    "bf16 x mxfp4": ("bf16_fp4", "fp8_fp4"),
    "bf16 x bf16": ("bf16_bf16", "fp16_fp16"),
}

#: C++ type spellings in the units and the generated launchers -> the unit's dtype word.
_TYPES = {"half": "fp16", "cutlass::half_t": "fp16", "__nv_bfloat16": "bf16",
          "cutlass::bfloat16_t": "bf16", "float": "fp32", "__nv_fp8_e4m3": "fp8",
          "SafeFP4": "fp4", "__nv_fp4_e2m1": "fp4", "Fp4Type": "fp4",
          "cutlass::uint4b_t": "uint4", "uint8_t": "uint8"}
#: A launcher instantiation in a generated file: the TMA warp-specialised macro (after its
#: arch) or an explicit ``template void <launcher><Act, Weight, ...>``.
_LAUNCHER = re.compile(r"(?:INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM\(\s*\w+\s*,|"
                       r"template\s+void\s+\w+\s*<)\s*([\w:]+)\s*,\s*([\w:]+)\s*,")
_RUNNER = re.compile(r"template\s+class\s+MoeGemmRunner\s*<([^;]*)>\s*;")


class PruneError(ValueError):
    """Pruning cannot be done safely (an unknown variant, an unchecked FlashInfer)."""


def kept_units(variants: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The per-dtype units a fused MoE module pruned to ``variants`` keeps.

    Raises:
        PruneError: no variant given, or one :data:`VARIANT_UNITS` does not name.
    """
    if not variants:
        raise PruneError("no MoE variant to keep")
    unknown = [v for v in variants if v not in VARIANT_UNITS]
    if unknown:
        raise PruneError(f"MoE variant {', '.join(map(repr, unknown))} has no rule (known: "
                         f"{', '.join(VARIANT_UNITS)})")
    return tuple(u for u in UNITS if any(u in VARIANT_UNITS[v] for v in variants))


def version_label(variants: tuple[str, ...] | list[str]) -> str:
    """The kernel wheel's local label segment for a module pruned to ``variants``
    (``moefp4fp4``; ``moefp16fp16xbf16bf16``): a pruned wheel never shares the full one's
    version, nor another pruning's.

    Raises:
        PruneError: see :func:`kept_units`.
    """
    return "moe" + "x".join(u.replace("_", "") for u in kept_units(tuple(variants)))


def moe_prune_plan(variants: tuple[str, ...]) -> dict[str, list[str]]:
    """What a module pruned to ``variants`` keeps and stubs, by unit (``kernels plan``'s
    record; which generated launcher files go is known once FlashInfer wrote them)."""
    kept = kept_units(variants)
    return {"variants": list(variants), "kept_units": [f"moe_gemm_kernels_{u}.cu" for u in kept],
            "stubbed_units": [f"moe_gemm_kernels_{u}.cu" for u in UNITS if u not in kept]}


def covers(kept: tuple[str, ...] | list[str], variant: str) -> bool:
    """Whether a module pruned to the variants ``kept`` runs ``variant`` (all its units are
    kept; a variant without a rule is never covered by a pruned module)."""
    try:
        return set(kept_units((variant,))) <= set(kept_units(tuple(kept)))
    except PruneError:
        return False


def check_header(version: str, header: bytes) -> None:
    """Refuse to prune a FlashInfer whose ``moe_gemm_kernels.h`` was not checked.

    Raises:
        PruneError: the release is not in :data:`CHECKED_HEADERS`, or its header's sha256
            differs from the one checked.
    """
    digest = hashlib.sha256(header).hexdigest()
    expected = CHECKED_HEADERS.get(version)
    if expected is None:
        raise PruneError(f"FlashInfer {version}'s MoeGemmRunner members were not checked "
                         f"(pruning is known for {', '.join(CHECKED_HEADERS)}); build the "
                         "full fused MoE module (no --moe-variants)")
    if digest != expected:
        raise PruneError(f"FlashInfer {version}'s {HEADER} has sha256 {digest}, not the "
                         f"checked {expected}; build the full fused MoE module")


def unit_of(source: Path) -> str | None:
    """``fp8_uint4`` for ``moe_gemm_kernels_fp8_uint4.cu``; ``None`` for any other file."""
    found = _UNIT.match(source.name)
    return found.group(1) if found else None


def launcher_units(text: str) -> set[str] | None:
    """The units whose dtypes a generated launcher file instantiates (``None``: a launcher
    whose types are not known, or none found: such a file is always kept)."""
    units = set()
    for act, weight in _LAUNCHER.findall(text):
        if act not in _TYPES or weight not in _TYPES:
            return None
        units.add(f"{_TYPES[act]}_{_TYPES[weight]}")
    return units or None


def plan_sources(sources: list[Path], kept: tuple[str, ...]
                 ) -> tuple[list[Path], list[Path], list[Path]]:
    """Split a fused MoE spec's sources for a module keeping the units ``kept``.

    Args:
        sources: the spec's sources (``JitSpec.sources`` of ``gen_cutlass_fused_moe_module``).
        kept: :func:`kept_units`.

    Returns:
        ``(compiled, stubbed, dropped)``: the sources compiled as they are, the per-dtype
        units to replace by :func:`stub_source`, and the generated launcher files left out
        (every launcher in them is of a stubbed unit's dtypes, so no kept unit calls them).
    """
    present = {unit_of(s) for s in sources} - {None}
    pruned = present - set(kept)
    compiled: list[Path] = []
    stubbed: list[Path] = []
    dropped: list[Path] = []
    for source in sources:
        unit = unit_of(source)
        if unit is not None:
            (stubbed if unit in pruned else compiled).append(source)
            continue
        if source.name.endswith(".generated.cu"):
            units = launcher_units(source.read_text())
            if units is not None and units <= pruned:
                dropped.append(source)
                continue
        compiled.append(source)
    return compiled, stubbed, dropped


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


#: ``MoeGemmRunner``'s members declared out of line in ``moe_gemm_kernels.h`` (0.6.14 and
#: 0.7.2, :data:`CHECKED_HEADERS`): ``(return type, name and parameters, qualifier)``;
#: ``{G}`` is the runner's ``GroupedGemmInput<T, WeightType, ScaleBiasType, OutputType>``.
#: The member templates (``dispatchToArch``, ``runGemm``) are called only from these.
MEMBERS = (
    ("", "MoeGemmRunner()", ""),
    ("void", "moeGemmBiasAct({G}, TmaWarpSpecializedGroupedGemmInput)", ""),
    ("void", "moeGemm({G}, TmaWarpSpecializedGroupedGemmInput)", ""),
    ("std::vector<cutlass_extensions::CutlassGemmConfig>", "getConfigs(bool)", "const"),
    ("std::vector<cutlass_extensions::CutlassGemmConfig>", "getConfigs(int, bool)", ""),
    ("std::vector<cutlass_extensions::CutlassGemmConfig>",
     "getTmaWarpSpecializedConfigs(int, bool)", ""),
    ("std::vector<cutlass_extensions::CutlassGemmConfig>", "getAmpereConfigs(int)", ""),
    ("bool", "isTmaWarpSpecialized(cutlass_extensions::CutlassGemmConfig)", "const"),
    ("bool", "supportsTmaWarpSpecialized(int)", ""),
    ("bool", "isFusedGatedActivation(cutlass_extensions::CutlassGemmConfig, ActivationType, "
     "int, int)", "const"),
    ("bool", "supportsFusedGatedActivation(ActivationType, int, int)", "const"),
    ("size_t", "getMaxWorkspaceSize(int)", "const"),
    ("int", "getSM()", "const"),
    ("int", "queryOccupancyForConfig(cutlass_extensions::CutlassGemmConfig const&)", ""),
    ("size_t", "calcMaxWorkspaceSize(int)", "const"),
)


def stub_source(unit_text: str, unit: str, kept: tuple[str, ...]) -> str:
    """The stub that replaces a pruned unit: its ``MoeGemmRunner`` instantiations (under
    the same ``#if`` guards) become explicit specialisations of every member in
    :data:`MEMBERS`, each throwing the same message.

    Args:
        unit_text: the unit's source (``moe_gemm_kernels_fp8_uint4.cu``).
        unit: its ``<act>_<weight>``.
        kept: the units the module keeps (named in the message).

    Raises:
        PruneError: the unit holds no ``template class MoeGemmRunner<...>;``.
    """
    text = _strip_comments(unit_text)
    if not _RUNNER.search(text):
        raise PruneError(f"moe_gemm_kernels_{unit}.cu instantiates no MoeGemmRunner")
    message = (f"moe_gemm_kernels_{unit}.cu was pruned from this FlashInfer fused MoE "
               f"module by sglang-sm120-builder `kernels` (it keeps {', '.join(kept)}): "
               "build the kernel set for this model and flags (python -m builder kernels "
               "build --model DIR -- FLAGS), or without --model for every dtype")

    def specialise(found: re.Match[str]) -> str:
        arguments = " ".join(found.group(1).split())
        args = [a.strip() for a in arguments.split(",")]
        scale = args[3] if len(args) > 3 else args[2]
        grouped = f"GroupedGemmInput<{args[0]}, {args[1]}, {scale}, {args[2]}>"
        runner = f"MoeGemmRunner<{arguments}>"
        lines = []
        for result, member, qualifier in MEMBERS:
            declarator = f"{runner}::{member.format(G=grouped)}"
            head = f"template <> {result + ' ' if result else ''}{declarator}"
            tail = f" {qualifier}" if qualifier else ""
            lines.append(f'{head}{tail} {{ sm120_pruned("{runner}"); }}')
        return "\n".join(lines)

    body, included = re.subn(r'#include\s+"moe_gemm_template_dispatch.h"',
                  '#include <stdexcept>\n#include <string>\n#include "tensorrt_llm/kernels/'
                  'cutlass_kernels/include/moe_gemm_kernels.h"\n\n'
                  "namespace {\n[[noreturn]] void sm120_pruned(char const* runner) {\n"
                  f'  throw std::runtime_error(std::string(runner) + ": {message}");\n'
                  "}\n}  // namespace", text)
    if included != 1:
        raise PruneError(f"moe_gemm_kernels_{unit}.cu does not include "
                         "moe_gemm_template_dispatch.h once")
    body = _RUNNER.sub(specialise, body)
    return f"// Generated by sglang-sm120-builder (builder/kernels/prune.py): stub of " \
           f"moe_gemm_kernels_{unit}.cu\n{body}"
