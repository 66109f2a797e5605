"""The SM12x verdict on one served configuration, and the one table it reads.

The observations below have the shape the ``serve`` check records
(``builder/behaviour/script/serving.py``); the slow tests in ``test_behaviour.py`` feed the
judge the real ones, from each release's own code. Here each rule is held on its own, and the
table of backends without SM12x kernels is held against the copy patch 0007 ships.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builder.behaviour.run import (
    checkpoint_cells,
    expand_zoo,
    read_checkpoint_table,
    with_checkpoint_columns,
    zoo_forms,
)
from builder.behaviour.sm12x import NO_SM12X_KERNELS, judge, no_kernel
from builder.core.errors import ConfigurationError
from builder.patching.series import load_series
from tests.helpers.paths import REPO

PATCHES = REPO / "patches"

SERVING = {"form": "qwen3-235b-a22b-nvfp4", "family": "nvfp4", "tp_size": 2, "ep_size": 1,
           "moe_runner_backend": "flashinfer_cutlass", "layer_moe_backend": "flashinfer_cutlass",
           "fp4_gemm_backend": "flashinfer_cutlass", "model_quantization": "modelopt_fp4",
           "moe_method": "ModelOptNvFp4FusedMoEMethod", "skip_local_expert_mapping": True,
           "clamp_configured": False, "stood_in_calls": [],
           "payload": {"type": "FlashInferCutlassMoeQuantInfo", "clamp": {}, "ep_size": 1}}


def test_a_configuration_on_sm12x_kernels_serves() -> None:
    assert judge(SERVING).outcome == "serves"


def test_a_backend_without_sm12x_kernels_crashes_and_the_verdict_names_its_source() -> None:
    verdict = judge({**SERVING, "layer_moe_backend": "flashinfer_trtllm"})
    assert verdict.outcome == "crashes"
    assert "get_trtllm_moe_sm100_module" in verdict.why
    assert judge({**SERVING, "dsa_prefill_backend": "flashmla_sparse"}).outcome == "crashes"
    assert judge({**SERVING, "fp4_gemm_backend": "flashinfer_trtllm"}).outcome == "crashes"
    # the FP4 GEMM matters only where the checkpoint has FP4 linear layers
    bf16 = {**SERVING, "family": "bf16", "model_quantization": None,
            "fp4_gemm_backend": "flashinfer_trtllm"}
    assert judge(bf16).outcome == "serves"


def test_a_refusal_at_start_up_is_refused() -> None:
    verdict = judge({"refused": "ValueError: SM12x: DeepseekV4ForCausalLM (fp8) ..."})
    assert verdict.outcome == "refused" and "SM12x:" in verdict.why


def test_a_clamp_the_cutlass_runner_does_not_get_is_wrong_numbers() -> None:
    clamped = {**SERVING, "clamp_configured": True}
    assert judge(clamped).outcome == "wrong-numbers"
    passed = {"swiglu_alpha": True, "swiglu_beta": True, "swiglu_limit": True}
    assert judge({**clamped, "payload": {**SERVING["payload"], "clamp": passed}}).outcome \
        == "serves"
    unknown = {**clamped, "payload": None, "payload_error": "AssertionError: no GPU"}
    assert judge(unknown).outcome == "unjudged"


@pytest.mark.parametrize(("backend", "skip", "outcome"), [
    ("flashinfer_cutlass", True, "serves"), ("flashinfer_cutlass", False, "wrong-numbers"),
    ("triton", False, "serves"), ("triton", True, "wrong-numbers")])
def test_expert_ids_must_arrive_in_the_form_the_runner_expects(backend: str, skip: bool,
                                                             outcome: str) -> None:
    observed = {**SERVING, "ep_size": 2, "layer_moe_backend": backend,
                "skip_local_expert_mapping": skip,
                "payload": {"type": "FlashInferCutlassMoeQuantInfo" if backend ==
                            "flashinfer_cutlass" else "TritonMoeQuantInfo", "clamp": {}}}
    assert judge(observed).outcome == outcome


def test_a_stood_in_kernel_call_leaves_the_case_unjudged() -> None:
    assert judge({**SERVING, "stood_in_calls": ["sgl_kernel.x"]}).outcome == "unjudged"


def test_every_entry_of_the_table_has_a_source_and_patch_0007_ships_the_same_backends() -> None:
    assert all(e.source and e.kind in ("moe", "attention", "dsa", "fp4_gemm")
               for e in NO_SM12X_KERNELS)
    assert no_kernel("moe", "flashinfer_cutlass") is None
    for patch in sorted(PATCHES.glob("0007-*.patch")):
        added = "\n".join(line for line in patch.read_text().splitlines()
                          if line.startswith("+    "))
        shipped = set(re.findall(r'"(\w+)"', added))
        for entry in NO_SM12X_KERNELS:
            assert entry.backend in shipped, (patch.name, entry.backend)


def test_the_zoo_expands_to_the_forms_a_release_loads() -> None:
    series = load_series(PATCHES / "series.toml")
    first = series.invariants[0]
    on_16 = expand_zoo(first, "0.5.16")
    on_20 = expand_zoo(first, "0.5.20")
    names_16 = {c.model for c in on_16.cases}
    names_20 = {c.model for c in on_20.cases}
    assert len(names_20) >= 20 and "zoo" not in names_20
    # GLM-5.3-Flash's Glm5Next is registered from 0.5.20 on
    assert "glm-5.3-flash-nvfp4" in names_20 - names_16
    assert len(on_20.cases) == len(names_20) * len(first.cases)
    assert {f.name for f in zoo_forms().FORMS} >= names_20


def test_table_cells_count_each_outcome_worst_first() -> None:
    report = {"target": "t", "results": [{"patch": "series invariant", "cases": [
        {"case": "a tp_size=1", "upstream": {"outcome": "serves"},
         "patched": {"outcome": "serves"}},
        {"case": "a tp_size=8", "upstream": {"outcome": "crashes"},
         "patched": {"outcome": "refused"}}]}]}
    assert checkpoint_cells(report) == {"a": ("crashes 1, serves 1", "refused 1, serves 1")}


def test_a_new_targets_run_adds_its_columns_to_the_docs_table_in_release_order() -> None:
    # The checklist's behaviour step writes a new release's zoo columns (docs/new-release.md),
    # so the test that holds the table against each target's run needs no edit.
    page = (REPO / "docs" / "upstream.md").read_text()
    shipped = read_checkpoint_table(page)
    assert len(shipped) >= 2 and all(len(cells) >= 20 for cells in shipped.values())
    first, *_, last = shipped
    form = zoo_forms().FORMS[0].name
    report = {"target": "sglang-new", "release": "0.0.1", "results": [
        {"patch": "series invariant", "cases": [
            {"case": f"{form} tp_size=1", "upstream": {"outcome": "crashes"},
             "patched": {"outcome": "serves"}}]}]}
    releases = {first: "0.0.0", last: "0.0.2"}
    written = with_checkpoint_columns(page, report, releases)
    tables = read_checkpoint_table(written)
    assert tables["sglang-new"] == {form: ("crashes 1", "serves 1")}
    assert {t: c for t, c in tables.items() if t != "sglang-new"} == shipped  # others kept
    names = list(tables)
    assert names.index(first) < names.index("sglang-new") < names.index(last)
    # the text outside the table is unchanged
    assert written.split("<!-- zoo-table:start -->")[0] == page.split("<!-- zoo-table:start -->")[0]
    assert written.split("<!-- zoo-table:end -->")[1] == page.split("<!-- zoo-table:end -->")[1]
    # a second run of the same target replaces its columns, adding none
    again = dict(report, results=[{"patch": "series invariant", "cases": [
        {"case": f"{form} tp_size=1", "upstream": {"outcome": "serves"},
         "patched": {"outcome": "serves"}}]}])
    replaced = read_checkpoint_table(with_checkpoint_columns(written, again, releases))
    assert list(replaced) == names and replaced["sglang-new"] == {form: ("serves 1", "serves 1")}
    with pytest.raises(ConfigurationError, match="no zoo table"):
        with_checkpoint_columns("# a page without the table\n", report, releases)


@pytest.mark.parametrize("table", [
    "",  # the markers with nothing between them
    "| form | a upstream | a patched |\n| --- | --- | --- |\n| no backticks | x | y |\n",
    "| form | a upstream | a patched |\n| --- | --- | --- |\n| `f` | x |\n",
    "| form | a upstream |\n| --- | --- |\n",
])
def test_a_malformed_docs_table_is_refused_before_the_behaviour_run(
        tmp_path: Path, table: str) -> None:
    # It was an IndexError, once the run (minutes) was over.
    from tests.helpers.cli import run_cli

    page = tmp_path / "upstream.md"
    page.write_text(f"# page\n<!-- zoo-table:start -->\n{table}<!-- zoo-table:end -->\n")
    with pytest.raises(ConfigurationError, match="zoo table"):
        read_checkpoint_table(page.read_text())
    done = run_cli("behaviour", "--target", "sglang-0.5.16", "--docs-table", str(page),
                   cache=tmp_path / "cache")
    assert done.returncode == 2 and "zoo table" in done.stderr, done.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("venv"))


def test_a_docs_table_that_is_a_link_is_refused_before_the_run(tmp_path: Path) -> None:
    # The write replaces the page whole: a link would be swapped for a file after minutes.
    from tests.helpers.cli import run_cli

    page = tmp_path / "upstream.md"
    page.write_text((REPO / "docs" / "upstream.md").read_text())
    link = tmp_path / "link.md"
    link.symlink_to(page)
    done = run_cli("behaviour", "--target", "sglang-0.5.16", "--docs-table", str(link),
                   cache=tmp_path / "cache")
    assert done.returncode == 2 and "is a symbolic link" in done.stderr, done.stderr
    assert link.is_symlink() and not (tmp_path / "cache").exists()
    missing = run_cli("behaviour", "--target", "sglang-0.5.16", "--docs-table",
                      str(tmp_path / "upstrem.md"), cache=tmp_path / "cache")
    assert missing.returncode == 2 and "cannot read --docs-table" in missing.stderr
