"""The SM12x patches judged by behaviour: the release's own code, its pinned dependencies.

The slow tests install each current target's release with its pinned Python dependencies on
a CPU torch (cached in the test cache), report the device as SM12x, and run every
behaviour the series declares on upstream's code and on the patched code
(``python -m builder behaviour``). Each behaviour must hold on the patched code and, when
it says what the patch changes (``expect``), fail on upstream's in some case. The fast
tests hold the series' declaration rules and the verdict rule on real declarations.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.version import Version

from builder.behaviour.preconditions import PreconditionResult, check_precondition
from builder.behaviour.run import (
    INVARIANT,
    BehaviourReport,
    BehaviourResult,
    CaseResult,
    behaviours_of,
    check_behaviours,
    checkpoint_cells,
    expand_zoo,
    wheel_for_interpreter,
)
from builder.core.config import load_targets
from builder.core.errors import ConfigurationError
from builder.patching.series import Behaviour, BehaviourCase, load_series
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.releases import UpstreamRelease
from tests.helpers.targets import current_targets

SERIES = REPO / "patches" / "series.toml"
#: The targets the behaviour stage judges: read from targets.toml and the series.
CURRENT = current_targets()
#: The first sgl-deep-gemm with the DeepGEMM SM120 kernel files: missing in 0.1.4.post1
#: (0.5.16's pin), present in 0.2.0 (0.5.20's) and 0.2.3.post2 (0.5.23's); read in the
#: wheels on PyPI. A rule on the pin, so a new target needs no entry here.
DEEP_GEMM_SM120_SINCE = Version("0.2.0")


def deep_gemm_has_sm120(pin: str) -> bool:
    """Whether sgl-deep-gemm ``pin`` ships the SM120 kernels (:data:`DEEP_GEMM_SM120_SINCE`)."""
    return Version(pin) >= DEEP_GEMM_SM120_SINCE


def _series(tmp_path: Path, behaviour: str) -> Path:
    text = SERIES.read_text()
    path = tmp_path / "patches" / "series.toml"
    path.parent.mkdir()
    for patch in (REPO / "patches").glob("*.patch"):
        (path.parent / patch.name).write_bytes(patch.read_bytes())
    path.write_text(text + "\n" + behaviour)
    return path


def test_declared_arguments_expand_to_every_combination_once() -> None:
    series = load_series(SERIES)
    entry = next(e for e in series.entries if e.name.startswith("0002-sm12x-nvfp4-moe-auto-"
                                                                "flashinfer-cutlass.patch"))
    first = entry.behaviours[0]
    described = [c.describe() for c in first.cases]
    # 2 models x (tp 1: ep 1 once; tp 2, 4, 8: ep 1 and ep = tp)
    assert len(described) == len(set(described)) == 2 * 7
    assert "deepseek-v3-nvfp4 tp_size=8 ep_size=8 moe_runner_backend=auto" in described
    assert first.capabilities == ((12, 0), (12, 1))


def test_every_copy_of_a_patch_carries_its_behaviours() -> None:
    series = load_series(SERIES)
    copies = [e for e in series.entries if e.name.startswith("0002-")]
    assert len(copies) >= 2
    assert len({tuple(b.name for b in e.behaviours) for e in copies}) == 1
    assert all(e.behaviours for e in series.entries if e.name.startswith(("0002-", "0003-")))


@pytest.mark.parametrize(("extra", "message"), [
    ('[[behaviour]]\npatches = ["nope-*.patch"]\nname = "x"\ncheck = "resolve"\n'
     'models = ["qwen3-moe-bf16"]\nexpect = { a = 1 }\n', "names no patch of the series"),
    ('[[behaviour]]\npatches = ["0002-*"]\nname = "x"\ncheck = "guess"\n'
     'models = ["qwen3-moe-bf16"]\nexpect = { a = 1 }\n', "unknown check 'guess'"),
    ('[[behaviour]]\npatches = ["0002-*"]\nname = "x"\ncheck = "resolve"\n'
     'models = ["qwen3-moe-bf16"]\nexpect = { a = 1 }\nunchanged = ["a"]\n',
     "give either expect (a table) or unchanged"),
    ('[[behaviour]]\npatches = ["0002-*"]\nname = "x"\ncheck = "resolve"\n'
     'models = ["qwen3-moe-bf16"]\ncapability = "sm120"\nexpect = { a = 1 }\n',
     "is not like \"12.0\""),
])
def test_a_malformed_behaviour_is_refused_with_one_message(tmp_path: Path, extra: str,
                                                           message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_series(_series(tmp_path, extra))


@pytest.mark.parametrize(("extra", "message"), [
    ('[[precondition]]\npatches = ["0003-*"]\nname = "x"\ncheck = "guess"\n'
     'distribution = "sgl-deep-gemm"\nfiles = ["a"]\nunmet = "y"\n', "unknown check 'guess'"),
    ('[[precondition]]\npatches = ["0003-*"]\nname = "x"\ncheck = "pinned-wheel-files"\n'
     'distribution = "sgl-deep-gemm"\nfiles = []\nunmet = "y"\n',
     "files must be a non-empty list"),
    ('[[precondition]]\npatches = ["nope-*"]\nname = "x"\ncheck = "pinned-wheel-files"\n'
     'distribution = "sgl-deep-gemm"\nfiles = ["a"]\nunmet = "y"\n',
     "names no patch of the series"),
])
def test_a_malformed_precondition_is_refused_with_one_message(tmp_path: Path, extra: str,
                                                              message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_series(_series(tmp_path, extra))


def test_every_copy_of_0003_carries_the_deep_gemm_precondition_and_its_answer() -> None:
    series = load_series(SERIES)
    copies = [e for e in series.entries if e.name.startswith("0003-")]
    assert len(copies) == 4 and all(e.preconditions for e in copies)
    (pre,) = {p for e in copies for p in e.preconditions}
    # the behaviour that answers an unmet pin is declared for the release that has one
    first = next(e for e in copies if e.name == "0003-sm12x-dsa-backends-tilelang.patch")
    assert pre.unmet in {b.name for b in first.behaviours}


def test_an_unmet_precondition_needs_its_behaviour_proven() -> None:
    series = load_series(SERIES)
    entry = next(e for e in series.entries if e.name == "0003-sm12x-dsa-backends-tilelang.patch")
    pre = entry.preconditions[0]
    answer = next(b for b in entry.behaviours if b.name == pre.unmet)
    refused = {"error": "ValueError: DSA on SM12x: the DSA indexer needs DeepGEMM's SM120 "
                        "paged MQA logits kernels ...", "stood_in_calls": []}
    served = {"dsa_prefill_backend": "trtllm", "stood_in_calls": []}
    report = BehaviourReport("t", "0.5.16", preconditions=[
        PreconditionResult(pre, "0.1.4.post1", "w.whl", pre.files)])
    assert not report.proven and report.unanswered
    report.results = [_result(answer, [served], [served])]
    assert not report.proven
    report.results = [_result(answer, [served], [refused])]
    assert report.proven and not report.unanswered
    # a met precondition needs no answer
    assert BehaviourReport("t", "0.5.20", preconditions=[
        PreconditionResult(pre, "0.2.0", "w.whl", ())]).proven


def test_a_refusal_is_judged_by_its_message_when_the_behaviour_names_it() -> None:
    series = load_series(SERIES)
    answer = next(b for e in series.entries for b in e.behaviours
                  if dict(b.expect).get("refused_with"))
    other = {"error": "ValueError: The tilelang DSA prefill/decode kernels only support ...",
             "stood_in_calls": []}
    served = {"dsa_prefill_backend": "trtllm", "stood_in_calls": []}
    assert not _result(answer, [served], [other]).proven


@pytest.mark.slow(reason="downloads each release's sgl-deep-gemm wheel")
@pytest.mark.parametrize("target", CURRENT)
def test_the_deep_gemm_precondition_is_read_in_the_pinned_wheel(target: str,
                                                                shared_cache: Path) -> None:
    """The real sgl-deep-gemm wheel each release pins, from PyPI (kept in the cache)."""
    from builder.core.cache import Cache
    from builder.source.fetch import fetch_pin

    spec = load_targets(REPO / "targets.toml").targets[target]
    cache = Cache(shared_cache)
    source = fetch_pin(wheel_for_interpreter(spec), spec.upstream_version, cache=cache)
    assert source.archive is not None
    entry = next(e for e in load_series(SERIES).entries
                 if e.name.startswith("0003-") and e.applies_to(spec.upstream_version))
    result = check_precondition(entry.preconditions[0], source.archive, cache=cache)
    assert result.wheel.startswith(f"sgl_deep_gemm-{result.pin}-")
    assert result.met is deep_gemm_has_sm120(result.pin), result.to_json()
    if not result.met:
        assert set(result.missing) == set(entry.preconditions[0].files)


def _result(behaviour: Behaviour, upstream: list[dict], patched: list[dict]) -> BehaviourResult:
    from builder.behaviour.run import _rule

    cases = tuple(CaseResult(BehaviourCase("m", ()), (12, 0), up, new, _rule(behaviour, new, up),
                             _rule(behaviour, up, up)) for up, new in zip(upstream, patched,
                                                                          strict=True))
    return BehaviourResult("p", behaviour, cases)


def test_the_verdict_needs_upstream_to_fail_and_a_stood_in_kernel_call_fails_a_case() -> None:
    series = load_series(SERIES)
    expect = next(b for e in series.entries for b in e.behaviours if b.expect)
    key = expect.expect[0][0]
    good = {**dict(expect.expect), "stood_in_calls": []}
    bad = {**good, key: "other"}
    assert _result(expect, [bad], [good]).proven
    # passes on upstream too: the patch proves nothing
    assert not _result(expect, [good], [good]).proven
    assert not _result(expect, [bad], [bad]).proven
    # a decision that called a stood-in compiled kernel is not trusted
    assert not _result(expect, [bad], [{**good, "stood_in_calls": ["sgl_kernel.x"]}]).proven
    assert not _result(expect, [bad], [{"error": "ValueError: no", "stood_in_calls": []}]).proven
    unchanged = next(b for e in series.entries for b in e.behaviours if b.unchanged)
    same = {k: "x" for k in unchanged.unchanged} | {"stood_in_calls": []}
    assert _result(unchanged, [same], [same]).proven
    assert not _result(unchanged, [same], [{**same, unchanged.unchanged[0]: "y"}]).proven


def test_an_sdist_target_is_refused_for_behaviour_checks() -> None:
    targets = load_targets(REPO / "targets.toml")
    with pytest.raises(ConfigurationError, match="pins no wheel"):
        wheel_for_interpreter(targets.targets["sglang-0.5.9"])


@pytest.mark.slow(reason="installs each release's environment, runs its matrix and kernel fit",
                  group="behaviour")
@pytest.mark.parametrize("target", CURRENT)
def test_every_sm12x_behaviour_fails_upstream_and_holds_patched(
        target: str, shared_cache: Path, tilelang_nvcc: Path, tmp_path: Path) -> None:
    """The whole matrix of the target: the CLI's exit status, then each behaviour."""
    done = run_cli("behaviour", "--target", target, "--json", cache=shared_cache)
    report = json.loads(done.stdout)
    assert done.returncode == 0, json.dumps(report, indent=1)[:4000]
    assert report["results"], "no behaviour declared"
    for result in report["results"]:
        assert result["holds"], result["behaviour"]
        if result["expect"]:
            assert result["fails_upstream"], result["behaviour"]
    names = " ".join(r["behaviour"] for r in report["results"])
    assert "expert parallelism" in names and "flashinfer_cudnn" in names
    assert set(report["standins"]) <= {"sgl_kernel", "deep_gemm"}
    (pre,) = [p for p in report["preconditions"] if p["distribution"] == "sgl-deep-gemm"]
    assert pre["met"] is deep_gemm_has_sm120(pre["pin"])
    assert "DSA on SM12x" in names
    # the checkpoint zoo: every invariant holds on the patched code (no crash, no wrong
    # numbers), upstream's code fails some case, and the docs' table is this run's
    invariants = [r for r in report["results"] if r["patch"] == INVARIANT]
    assert len(invariants) == len(load_series(SERIES).invariants)
    forms = {c["case"].split(" ", 1)[0] for r in invariants for c in r["cases"]}
    assert len(forms) >= 20
    outcomes = {c["upstream"]["outcome"] for r in invariants for c in r["cases"]}
    assert outcomes & {"crashes", "wrong-numbers"}
    assert all(r["holds"] for r in invariants)
    assert _docs_cells(target) == checkpoint_cells(report)


def _docs_cells(target: str) -> dict[str, tuple[str, str]]:
    """The zoo table of docs/upstream.md, the two columns of ``target``."""
    text = (REPO / "docs" / "upstream.md").read_text()
    table = text.split("<!-- zoo-table:start -->")[1].split("<!-- zoo-table:end -->")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in table.strip().splitlines() if line.startswith("|")]
    head, body = rows[0], rows[2:]
    up, new = head.index(f"{target} upstream"), head.index(f"{target} patched")
    return {row[0].split("`")[1]: (row[up], row[new]) for row in body
            if row[up] != "not loaded"}


@pytest.mark.slow(reason="installs 0.5.16's behaviour environment")
def test_without_the_patches_the_behaviours_are_not_proven(upstream_0_5_16: UpstreamRelease,
                                                           tmp_path: Path) -> None:
    """The failing run: the same checks with upstream's tree as the 'patched' one. The tree
    is a copy: the code run from it writes no bytecode there (the tree put first on the
    path is a cache entry, checked by digest before a wheel is built from it)."""
    env, source, target = upstream_0_5_16.env, upstream_0_5_16.source, upstream_0_5_16.target
    pairs = [(e, b) for e, b in behaviours_of(load_series(SERIES), target.upstream_version)
             if b.expect and b.check == "resolve" and b.capabilities == ((12, 0),)][:2]
    tree = tmp_path / "tree"
    shutil.copytree(source.tree, tree, ignore=shutil.ignore_patterns("__pycache__"))
    # and the zoo invariant on the forms issue 34 names, each failing on upstream's code
    series = load_series(SERIES)
    zoo = expand_zoo(series.invariants[0], target.upstream_version)
    named = ("qwen3.6-35b-a3b-nvfp4-mixed", "gpt-oss-120b-nvfp4", "deepseek-v4-flash-nvfp4")
    pairs.append((None, replace(zoo, cases=tuple(c for c in zoo.cases if c.model in named))))
    results = check_behaviours(pairs, env, tree, models=tmp_path / "models")
    assert results and not any(r.proven for r in results)
    assert not any(r.holds for r in results)
    assert not list(tree.rglob("__pycache__"))
