"""The kernels for the model you serve (issue 36): the module table, the derivation from the
release's own selection, and the coverage check of a kernel wheel's manifest.

The fast tests feed :func:`derive` and :func:`missing_from` selections as the selection
script reports them; the slow ones run the script on every zoo form in 0.5.23's behaviour
environment (its patched code, the device reported as SM120).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import pytest

from builder.core.errors import ConfigurationError
from builder.kernels.derive import (
    TABLE,
    Derived,
    derive,
    has_fp4_linears,
    missing_from,
    read_model,
    require_coverage,
    run_select,
)
from builder.kernels.pins import default_groups
from tests.helpers.kernels import F, manifest_of, nvfp4_selection
from tests.helpers.releases import patched_release
from tests.helpers.tiers import BEHAVIOUR

MOE = ("fused_moe_sm120", "trtllm_utils", "fp4_quantization_sm120f")
COMMON = ("sampling", "norm", "rope", "activation", "page")


def test_every_row_names_a_group_the_builder_compiles_and_a_flashinfer_function() -> None:
    from builder.kernels.build import check_groups

    for row in TABLE:
        check_groups((row.group.format(sm="120", smf="120f"),))
        assert row.function.startswith("flashinfer.") and "gen_" in row.function, row
        assert row.why


def test_an_nvfp4_moe_loads_the_cutlass_moe_its_quantization_and_attention() -> None:
    derived = derive(nvfp4_selection(), F)
    assert derived.groups == (*MOE, "attention", *COMMON)
    assert derived.head_dims == (128,)
    moe = next(n for n in derived.needs if n.group == "fused_moe_sm120")
    assert moe.variant == "nvfp4 x nvfp4" and moe.because == "moe_runner=flashinfer_cutlass"
    assert moe.function == "flashinfer.jit.fused_moe.gen_cutlass_fused_moe_sm120_module"
    # the CUTLASS FP4 GEMM only with its backend
    assert "fp4_gemm_sm120" not in derived.groups
    cutlass = nvfp4_selection(fp4_gemm_backend="flashinfer_cutlass")
    assert "fp4_gemm_sm120" in derive(cutlass, F).groups
    # a 12.0a build names the per-arch groups after it
    assert "fp4_quantization_sm120" in derive(nvfp4_selection(), ("12.0a",)).groups


def test_a_triton_moe_with_triton_attention_loads_no_moe_and_no_attention_module() -> None:
    selection = {"moe_method": "Fp8MoEMethod", "layer_moe_backend": "triton",
                 "fp4_gemm_backend": "flashinfer_cutlass", "attention_backend": "triton",
                 "sampling_backend": "flashinfer", "attention": {"head_dim": 192,
                                                                  "attention_arch": "MLA"}}
    derived = derive(selection, F)
    assert derived.groups == COMMON and derived.head_dims == ()
    assert derive({**selection, "sampling_backend": "pytorch"}, F).groups == COMMON[1:]


def test_what_no_group_builds_is_named_not_dropped() -> None:
    fp8_kv = derive(nvfp4_selection(kv_cache_dtype="fp8_e4m3"), F)
    assert any("kv float8_e4m3fn" in note for note in fp8_kv.unbuildable)
    mla = derive(nvfp4_selection(attention={"head_dim": 576, "attention_arch": "MLA"}), F)
    assert "attention" not in mla.groups and "MLA" in mla.unbuildable[0]
    trtllm = derive(nvfp4_selection(layer_moe_backend="flashinfer_trtllm"), F)
    assert "fused_moe_sm120" not in trtllm.groups
    assert any("moe_runner=flashinfer_trtllm" in note for note in trtllm.unbuildable)


def test_a_refused_configuration_has_no_kernel_set() -> None:
    with pytest.raises(ConfigurationError, match="refuses this configuration at start-up: "
                       "ValueError: SM12x"):
        derive({"refused": "ValueError: SM12x: no kernels"}, F)


def test_fp4_linears_are_read_from_the_quantization_declaration() -> None:
    flat = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}
    assert has_fp4_linears(flat, None)
    experts_only = {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "model.layers.1.mlp.experts.0.up_proj": {"quant_algo": "NVFP4"},
        "model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"}}}
    assert not has_fp4_linears({}, {"quantization": experts_only})
    assert not has_fp4_linears({"quantization_config": {"quant_method": "fp8"}}, None)


def test_coverage_both_ways_and_one_message_with_the_kernels_command() -> None:
    derived = derive(nvfp4_selection(), F)
    full = manifest_of(default_groups(F))
    assert missing_from(full, derived, F, "0.7.2") == []
    lacking = manifest_of(tuple(g for g in default_groups(F) if g != "fused_moe_sm120"),
                        head_dims=(64,), arch=("9.0a",), flashinfer="0.6.18")
    assert missing_from(lacking, derived, F, "0.7.2") == [
        "module group fused_moe_sm120 (moe_runner=flashinfer_cutlass, nvfp4 x nvfp4)",
        "attention head dim 128", "arch 12.0f", "FlashInfer 0.7.2 (the wheel is for 0.6.18)"]
    with pytest.raises(ConfigurationError) as refused:
        require_coverage(lacking, derived, arch_list=F, flashinfer="0.7.2",
                         target="sglang-0.5.23", model=Path("/m/q"), flags=("--tp-size", "2"),
                         wheel="w.whl")
    assert "w.whl does not cover /m/q with these flags: missing module group " \
        "fused_moe_sm120" in refused.value.cause
    assert refused.value.hint == "build the set: python -m builder kernels build --target " \
        "sglang-0.5.23 --model /m/q -- --tp-size 2"
    assert refused.value.exit_status == 2


def test_a_fast_build_wheel_does_not_cover_a_fused_moe() -> None:
    derived = derive(nvfp4_selection(), F)
    fast = {**manifest_of(default_groups(F)), "fast_build": True}
    assert missing_from(fast, derived, F) == [
        "the full fused MoE module (the wheel is a --fast-build one)"]


def test_model_and_modules_are_refused_together() -> None:
    from builder.kernels.request import KernelOptions

    with pytest.raises(ConfigurationError, match="--model derives the module groups"):
        KernelOptions(model=Path("m"), groups=("norm",))
    with pytest.raises(ConfigurationError, match="server flags after -- need --model"):
        KernelOptions(server_flags=("--tp-size", "2"))


@pytest.mark.parametrize(("name", "content", "says"), [
    ("config.json", b'{"model_type": "qwen3_moe", "model_type": "llama"}', "appears twice"),
    ("config.json", b"", "not a checkpoint's JSON"),
    ("config.json", b'{"model_type": "\xff"}', "not a checkpoint's JSON"),
    ("config.json", b"[1, 2]", "holds a list"),
    ("hf_quant_config.json", b'{"quantization": {"quant_algo": "NVFP4", "quant_algo": "FP8"}}',
     "appears twice"),
])
def test_a_checkpoint_file_that_is_not_one_json_object_is_bad_input(
        tmp_path: Path, name: str, content: bytes, says: str) -> None:
    # Read before the release's selection runs on it: one configuration error (exit 2),
    # not a traceback after minutes of environment work.
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_moe"}')
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ConfigurationError, match=says):
        read_model(tmp_path)


def test_a_quantization_config_that_is_a_fifo_is_refused_not_read(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_moe"}')
    os.mkfifo(tmp_path / "hf_quant_config.json")
    with pytest.raises(ConfigurationError, match="is not a file"):
        read_model(tmp_path)


# --- the release's own selection on the zoo (0.5.23's behaviour environment) -----------------

#: Patched 0.5.23, default flags: the groups each zoo form loads beyond :data:`COMMON`
#: (``"refused"``: the series refuses the checkpoint's default backends on SM12x). Head dims
#: are the zoo's shrunk ones (32, 64), not the public checkpoints'.
EXPECTED_0523: dict[str, tuple[str, ...] | str] = {
    **{name: MOE for name in (
        "deepseek-r1-0528-nvfp4", "deepseek-v3-0324-nvfp4-bf16-shared", "glm-5-nvfp4",
        "deepseek-r1-ct-nvfp4", "gpt-oss-120b-nvfp4", "glm-5.3-flash-nvfp4",
        "step-3.5-flash-nvfp4", "step-3.5-flash-modelopt-nvfp4")},
    **{name: (*MOE, "attention") for name in (
        "qwen3-235b-a22b-nvfp4", "qwen3.6-35b-a3b-nvfp4-mixed",
        "qwen3.5-397b-a17b-nvfp4-mixed", "qwen3-30b-a3b-nvfp4-mixed", "minimax-m3-nvfp4-mixed",
        "qwen3-30b-a3b-ct-nvfp4")},
    "qwen3.6-35b-a3b-w4a16-nvfp4-mixed": ("attention",),
    "deepseek-v4-flash-nvfp4": "refused", "gpt-oss-20b-mxfp4": "refused",
    "gpt-oss-120b-mxfp4": "refused",
    **{name: () for name in ("deepseek-v3.2-fp8", "deepseek-v3.2-bf16", "glm-5-fp8",
                             "glm-5-bf16", "deepseek-v3-fp8", "deepseek-r1-w4afp8",
                             "deepseek-v3-bf16", "gpt-oss-20b-bf16")},
    **{name: ("attention",) for name in ("qwen3-30b-a3b-fp8", "qwen3-30b-a3b-bf16")},
}
#: The families the shipped default set claims (docs/kernels.md: what SGLang loads on SM120
#: for NVFP4 MoE models with the flashinfer_cutlass runner).
CLAIMED = ("nvfp4", "nvfp4-mixed", "ct-nvfp4", "nvfp4-clamp")
#: Forms run again with flags (the flags change the derived set).
WITH_FLAGS: list[tuple[str, tuple[str, ...]]] = [
    ("qwen3-235b-a22b-nvfp4", ("--fp4-gemm-backend", "flashinfer_cutlass")),
    ("qwen3-30b-a3b-bf16", ("--moe-runner-backend", "flashinfer_cutlass")),
    ("deepseek-v4-flash-nvfp4", ("--moe-runner-backend", "flashinfer_cutlass")),
    ("qwen3-30b-a3b-fp8", ("--kv-cache-dtype", "fp8_e4m3")),
    # the selection reads no tokenizer itself: the flag that says so too is no second value
    ("qwen3-30b-a3b-bf16", ("--skip-tokenizer-init",)),
]


@pytest.fixture(scope="module")
def zoo_0523(shared_cache: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[tuple[str, tuple[str, ...]], dict[str, Any]]:
    """Every 0.5.23 zoo form's selection (default flags, then :data:`WITH_FLAGS`), by
    (form, flags), from one run of the selection script on the patched release."""
    from builder.behaviour.run import zoo_forms

    release = patched_release(shared_cache, "sglang-0.5.23")
    zoo, root = zoo_forms(), tmp_path_factory.mktemp("zoo")
    forms = {f.name: zoo.write(f, root) for f in zoo.FORMS
             if f.buildable and f.in_release("0.5.23")}
    keys = [(name, ()) for name in forms] + WITH_FLAGS
    cases = [(forms[name], flags) for name, flags in keys]
    return dict(zip(keys, run_select(release.env, cases, release.tree), strict=True))


def _derived(zoo: dict[tuple[str, tuple[str, ...]], dict[str, Any]], name: str,
             flags: tuple[str, ...] = ()) -> Derived:
    return derive(zoo[(name, flags)], F)


@pytest.mark.slow(reason="runs 0.5.23's backend selection in its behaviour environment",
                  group=BEHAVIOUR)
def test_each_zoo_form_gets_its_derived_request(
        zoo_0523: dict[tuple[str, tuple[str, ...]], dict[str, Any]]) -> None:
    assert {name for name, flags in zoo_0523 if not flags} == set(EXPECTED_0523)
    for name, expected in EXPECTED_0523.items():
        if expected == "refused":
            with pytest.raises(ConfigurationError, match="SM12x: this checkpoint would run "
                               "backends with no kernels"):
                _derived(zoo_0523, name)
            continue
        derived = _derived(zoo_0523, name)
        assert derived.groups == (*expected, *COMMON), name
        assert derived.unbuildable == (), (name, derived.unbuildable)
        assert bool(derived.head_dims) == ("attention" in expected), name


@pytest.mark.slow(reason="runs 0.5.23's backend selection in its behaviour environment",
                  group=BEHAVIOUR)
def test_server_flags_change_the_derived_set(
        zoo_0523: dict[tuple[str, tuple[str, ...]], dict[str, Any]]) -> None:
    gemm = _derived(zoo_0523, *WITH_FLAGS[0])
    assert "fp4_gemm_sm120" in gemm.groups
    bf16 = _derived(zoo_0523, *WITH_FLAGS[1])
    moe = next(n for n in bf16.needs if n.group == "fused_moe_sm120")
    assert moe.variant == "bf16 x bf16"
    assert _derived(zoo_0523, *WITH_FLAGS[2]).groups[:3] == MOE  # V4 serves with the flag
    fp8_kv = _derived(zoo_0523, *WITH_FLAGS[3])
    assert any("kv float8_e4m3fn" in note for note in fp8_kv.unbuildable)
    assert _derived(zoo_0523, *WITH_FLAGS[4]) == _derived(zoo_0523, "qwen3-30b-a3b-bf16")


@pytest.mark.slow(reason="runs 0.5.23's backend selection in its behaviour environment",
                  group=BEHAVIOUR)
def test_the_default_set_covers_the_forms_it_claims_and_a_lacking_one_is_refused(
        zoo_0523: dict[tuple[str, tuple[str, ...]], dict[str, Any]]) -> None:
    from builder.behaviour.run import zoo_forms

    claimed = [f.name for f in zoo_forms().FORMS if f.family in CLAIMED
               and EXPECTED_0523.get(f.name) not in (None, "refused")]
    assert len(claimed) == 14
    for name in claimed:
        derived = _derived(zoo_0523, name)
        # the default set's groups; head dims as the form's (the zoo's are shrunk)
        shipped = manifest_of(default_groups(F), head_dims=derived.head_dims or (128,))
        assert missing_from(shipped, derived, F, "0.7.2") == [], name
        lacking = manifest_of(tuple(g for g in default_groups(F) if g != "fused_moe_sm120"),
                            head_dims=derived.head_dims or (128,))
        assert missing_from(lacking, derived, F, "0.7.2") == [
            "module group fused_moe_sm120 (moe_runner=flashinfer_cutlass, nvfp4 x nvfp4)"], name
    # the default set does not claim the MoE-less forms, and covers them too (a superset)
    assert missing_from(manifest_of(default_groups(F), (32,)),
                        _derived(zoo_0523, "qwen3-30b-a3b-bf16"), F) == []


@pytest.mark.slow(reason="runs 0.5.23's backend selection and parser in its environment",
                  group=BEHAVIOUR)
def test_serve_command_check_refuses_a_wheel_lacking_a_derived_module(
        shared_cache: Path, tmp_path: Path) -> None:
    from builder.behaviour.run import zoo_forms
    from tests.helpers.cli import run_cli

    zoo = zoo_forms()
    model = zoo.write(zoo.BY_NAME["qwen3-30b-a3b-ct-nvfp4"], tmp_path / "zoo")
    wheels = {}
    for name, groups in (("full", default_groups(F)),
                         ("lacking", tuple(g for g in default_groups(F) if g != "attention"))):
        wheels[name] = tmp_path / f"{name}.whl"
        with zipfile.ZipFile(wheels[name], "w") as archive:
            archive.writestr("flashinfer_jit_cache/sm120-manifest.json",
                             json.dumps(manifest_of(groups, head_dims=(32, 128))))
    common = ["serve-command", "--target", "sglang-0.5.23", "--gpu", "rtx-pro-6000", "--tp",
              "2", "--model", str(model)]
    done = run_cli(*common, "--check", str(wheels["full"]), "--json", cache=shared_cache)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "full.whl covers fused_moe_sm120, trtllm_utils" in json.loads(done.stdout)["checked"]
    bad = run_cli(*common, "--check", str(wheels["lacking"]), cache=shared_cache)
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert "missing module group attention (attention=flashinfer, head_dim 32, q bfloat16, " \
        "kv bfloat16)" in bad.stderr
    assert "python -m builder kernels build --target sglang-0.5.23 --model" in bad.stderr
    assert "--tp-size 2" in bad.stderr


@pytest.mark.slow(reason="runs 0.5.23's backend selection and parser in its environment",
                  group=BEHAVIOUR)
def test_kernels_plan_writes_the_derived_request(shared_cache: Path, tmp_path: Path) -> None:
    from builder.behaviour.run import zoo_forms
    from builder.kernels.build import KernelRequest
    from tests.helpers.cli import run_cli

    zoo = zoo_forms()
    model = zoo.write(zoo.BY_NAME["qwen3-30b-a3b-bf16"], tmp_path / "zoo")
    out = tmp_path / "request.json"
    flags = ("--moe-runner-backend", "flashinfer_cutlass")
    done = run_cli("kernels", "plan", "--target", "sglang-0.5.23", "--model", str(model),
                   "--output", str(out), "--", *flags, cache=shared_cache)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    request = KernelRequest.from_json(data)  # what `kernels build --request` builds
    assert request.groups == ("fused_moe_sm120", "trtllm_utils", "attention", *COMMON)
    assert request.head_dims == (32,)
    assert data["derived"]["server_flags"] == list(flags)
    assert {"group": "fused_moe_sm120", "variant": "bf16 x bf16",
            "because": "moe_runner=flashinfer_cutlass",
            "function": "flashinfer.jit.fused_moe.gen_cutlass_fused_moe_sm120_module"
            } in data["derived"]["needs"]
    # the fused MoE is pruned to the model's pair (builder.kernels.prune), and says so
    assert request.moe_variants == ("bf16 x bf16",)
    assert request.version.endswith(".moefp16fp16xbf16bf16")
    assert "moe_gemm_kernels_fp8_uint4.cu" in data["moe_prune"]["stubbed_units"]
    assert "fused MoE pruned to bf16 x bf16: keeps moe_gemm_kernels_fp16_fp16.cu, " \
        "moe_gemm_kernels_bf16_bf16.cu; stubs" in " ".join(done.stderr.split())
    bad = run_cli("kernels", "plan", "--target", "sglang-0.5.23", "--model", str(model),
                  "--output", str(out), "--", "--moe-runner-backend", "nope",
                  cache=shared_cache)
    assert bad.returncode == 2 and "own argument parser refuses the server flags" in bad.stderr


def _provider_site(site: Path, provider: str, version: str, manifest: dict[str, Any]) -> Path:
    """``site`` holding a provider kernel wheel's dist-info and manifest as pip installs it
    (FlashInfer 0.7's ``flashinfer_jit_cache/providers/<provider>/``)."""
    info = site / f"flashinfer_jit_cache_{provider}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flashinfer-jit-cache-"
                                   f"{provider}\nVersion: {version}\n")
    path = site / "flashinfer_jit_cache" / "providers" / provider / "sm120-manifest.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(manifest))
    (info / "RECORD").write_text(f"{path.relative_to(site).as_posix()},,\n")
    return site


def test_the_installed_kernel_wheels_manifest_is_found(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from builder.kernels.derive import installed_manifest

    assert installed_manifest() is None  # the builder's own environment has none
    monkeypatch.syspath_prepend(str(_provider_site(
        tmp_path / "site", "sm120f", "0.7.2+sm120.1.cu130", manifest_of(default_groups(F)))))
    found = installed_manifest()
    assert found is not None
    assert found[0] == "flashinfer-jit-cache-sm120f 0.7.2+sm120.1.cu130 (installed)"
    assert found[1]["groups"] == list(default_groups(F))
    # A second provider (another arch) beside it: both count, as in the image's launcher
    # (which combines every installed manifest); not the first one found alone.
    monkeypatch.syspath_prepend(str(_provider_site(
        tmp_path / "site2", "sm90a", "0.7.2+sm120.1.cu130.sm90a",
        manifest_of(("norm",), arch=("9.0a",)))))
    found = installed_manifest()
    assert found is not None
    assert sorted(found[1]["arch_list"]) == ["12.0f", "9.0a"], found
    assert "flashinfer-jit-cache-sm90a" in found[0] and "sm120f" in found[0]


def test_a_check_wheel_that_is_no_kernel_wheel_is_bad_input_at_once(tmp_path: Path) -> None:
    # Read before the release's parser: no environment, no hang on a fifo, exit 2.
    from tests.helpers.cli import run_cli

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "qwen3_moe"}')
    fifo = tmp_path / "fifo.whl"
    os.mkfifo(fifo)
    listed = tmp_path / "listed.whl"
    with zipfile.ZipFile(listed, "w") as archive:
        archive.writestr("flashinfer_jit_cache/sm120-manifest.json", "[1, 2]")
    (tmp_path / "text.whl").write_text("not a zip")
    for wheel, says in ((fifo, "not a file"), (tmp_path / "nothere.whl", "not a file"),
                        (tmp_path, "not a file"), (tmp_path / "text.whl", "not a kernel wheel"),
                        (listed, "holds a list")):
        done = run_cli("serve-command", "--target", "sglang-0.5.23", "--gpu", "rtx-5090",
                       "--tp", "2", "--model", str(tmp_path / "m"), "--check", str(wheel),
                       "--index-url", "http://127.0.0.1:9/simple", cache=tmp_path / "cache")
        assert done.returncode == 2 and says in done.stderr, (wheel, done.stderr)


def test_a_mixed_precision_checkpoint_needs_every_expert_layers_dtype_pair() -> None:
    # The selection observes one MoE layer (here an FP8 one); a ModelOpt MIXED_PRECISION
    # export picks each layer's method from its own entry, so layer 2 runs NVFP4.
    from builder.kernels.coverage import checkpoint_facts
    from builder.kernels.request import derived_moe_variants

    layers = {"model.layers.1.mlp.experts.0.down_proj": {"quant_algo": "FP8"},
              "model.layers.2.mlp.experts.0.down_proj": {"quant_algo": "NVFP4"}}
    quant = {"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": layers}}
    facts = checkpoint_facts({}, quant)
    assert facts["moe_layer_pairs"] == ["fp8 x fp8", "nvfp4 x nvfp4"]
    derived = derive(nvfp4_selection(moe_method="ModelOptFp8MoEMethod", **facts), F)
    assert [n.variant for n in derived.needs if n.group == "fused_moe_sm120"] == [
        "fp8 x fp8", "nvfp4 x nvfp4"]
    assert "fp4_quantization_sm120f" in derived.groups  # the NVFP4 layers quantize
    assert derived_moe_variants(derived, "0.7.2") == (("fp8 x fp8", "nvfp4 x nvfp4"), None)
    pruned = {**manifest_of(derived.groups), "moe_variants": ["fp8 x fp8"]}
    assert missing_from(pruned, derived, F, "0.7.2") == [
        "fused MoE dtype pair nvfp4 x nvfp4 (fused_moe_sm120 is pruned to fp8 x fp8)"]
    both = {**manifest_of(derived.groups), "moe_variants": ["fp8 x fp8", "nvfp4 x nvfp4"]}
    assert missing_from(both, derived, F, "0.7.2") == []
    # An excluded expert layer runs unquantized; an algo without a prune rule is named,
    # and the module is then built whole.
    quant["quantization"]["exclude_modules"] = ["model.layers.3.mlp.experts*"]
    layers["model.layers.4.mlp.experts.0.down_proj"] = {"quant_algo": "W4A16_NVFP4"}
    facts = checkpoint_facts({}, quant)
    assert facts["moe_layer_pairs"] == ["fp8 x fp8", "nvfp4 x nvfp4", "modelopt W4A16_NVFP4",
                                        "bf16 x bf16"]
    variants, why = derived_moe_variants(derive(nvfp4_selection(**facts), F), "0.7.2")
    assert variants == () and why
    # A shared expert is a dense MLP: excluding it adds no MoE pair.
    quant["quantization"]["exclude_modules"] = ["model.layers.*.mlp.shared_experts*"]
    assert "bf16 x bf16" not in checkpoint_facts({}, quant)["moe_layer_pairs"]
    # One method for every layer elsewhere: nothing added.
    assert checkpoint_facts({}, {"quantization": {"quant_algo": "NVFP4"}})[
        "moe_layer_pairs"] == []


def test_the_refusal_says_what_a_missing_module_and_a_pruned_pair_each_do() -> None:
    from builder.kernels.coverage import refusal

    common = {"wheel": "w", "model": "m", "target": "sglang-0.5.23", "flags": ()}
    module, hint = refusal(["module group attention (attention=flashinfer)"], **common)
    assert "compiles it for minutes" in module and "stub" not in module
    assert hint.startswith("build the set: python -m builder kernels build")
    pair, _ = refusal(["fused MoE dtype pair nvfp4 x nvfp4 (fused_moe_sm120 is pruned to "
                       "bf16 x bf16)"], **common)
    # FlashInfer loads the pruned module either way: nothing compiles, the stub raises
    assert "stub's RuntimeError" in pair and "compiles" not in pair
