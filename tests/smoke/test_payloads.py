"""The probe's seam, typed on both sides: one ``Status`` list, each result's data a
dataclass the probe writes and the host checks (the shapes taken from the fields' types)
and reads. Malformed data is one ``ProbeOutputError`` naming the result and the key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from builder.smoke.gpu import CheckResult, parse_probe_output
from builder.smoke.gpu.report import to_status
from builder.smoke.shared import (
    RESULT_PREFIX,
    STATUSES,
    CrashData,
    KernelsData,
    MoeData,
    MoeModule,
    ProbeCheck,
    ProbeData,
    ProbeOutputError,
    ProbeResults,
    RunnerData,
    RunnerInfo,
    SglangData,
    Status,
    VersionsData,
    conforms,
    describe,
)


def test_a_status_is_its_text_everywhere() -> None:
    assert STATUSES == ("passed", "failed", "warning", "not-run")
    assert [Status.parse(text) for text in STATUSES] == list(Status)
    for odd in ("ok", None, ["passed"], {"passed": 1}, 1):  # any JSON value: never a crash
        assert Status.parse(odd) is None
    assert Status.NOT_RUN == "not-run" and json.dumps(Status.NOT_RUN) == '"not-run"'
    assert f"{Status.FAILED:<8}|" == "failed  |" and str(Status.WARNING) == "warning"
    assert [s.ok for s in Status] == [True, False, True, False]
    assert to_status("skipped") is Status.FAILED  # the report's rule: unknown is a failure
    assert CheckResult("runner", Status.WARNING, "").ok


def test_shapes_are_named_from_the_field_types() -> None:
    assert describe(str) == "a string"
    assert describe(str | None) == "a string or null"
    assert describe(list[str]) == "a list of strings"
    assert describe(dict[str, str | None]) == "an object of strings or nulls"
    assert describe(dict[str, Any] | None) == "an object or null"
    assert describe(list[dict[str, Any]]) == "a list of objects"
    assert conforms(2, float) and not conforms(True, int) and not conforms(True, float)
    assert conforms({"a": None}, dict[str, str | None]) and not conforms({"a": 1},
                                                                         dict[str, str])
    assert not conforms(["a", 1], list[str]) and conforms([{"x": [1]}], list[dict[str, Any]])


def _line(name: str, status: Status, data: ProbeData | dict[str, Any]) -> str:
    payload = data.to_json() if isinstance(data, ProbeData) else data
    return RESULT_PREFIX + json.dumps(ProbeCheck(name, status, "d", payload).to_json())


SGLANG = SglangData(version="0.5.9", provenance="{}", requires=["torch==2.9.1"],
                    record={"sglang/a.py": "sha256=x", "sglang/a.pyc": None},
                    mismatched=[], missing=["sglang/b.py"], texts={"sglang/a.py": "x = 1\n"})
VERSIONS = VersionsData(versions={"flashinfer-python": "0.6.3", "flashinfer-cubin": None,
                                  "flashinfer-jit-cache": "0.6.3+sm120.1"},
                        manifest={"schema": 1}, manifest_error=None, torch_cuda="13.0")
RUNNER = RunnerData(torch="2.11.0", torch_cuda="13.0", gpu="NVIDIA RTX PRO 6000", devices=2,
                    compute_capability="12.0", flashinfer_arch="12.0f", driver="580",
                    driver_cuda="13.0", cuda_runtime="13.0",
                    shared_memory_per_block_optin=101376, multiprocessors=188,
                    memory_gib=95.0)


def test_what_the_probe_writes_the_host_reads_back() -> None:
    out = "\n".join([_line("runner", Status.PASSED, RUNNER),
                     _line("sglang-data", Status.PASSED, SGLANG),
                     _line("versions-data", Status.PASSED, VERSIONS)])
    results = parse_probe_output(out)
    assert RunnerData.read(results.runner) == RUNNER
    assert SglangData.read(results.sglang_data) == SGLANG
    assert VersionsData.read(results.versions_data) == VERSIONS
    assert results.runner is not None and results.runner.status is Status.PASSED
    assert SglangData.from_json({**SGLANG.to_json(), "trace": "kept, not read"}) == SGLANG
    with pytest.raises(ProbeOutputError, match="SglangData needs the data key 'version'"):
        SglangData.from_json({"provenance": None})
    # the wire keys, in the order the probe has always written them
    assert list(SGLANG.to_json()) == ["version", "provenance", "requires", "record",
                                      "mismatched", "missing", "texts"]
    assert list(RUNNER.to_json())[:4] == ["torch", "torch_cuda", "gpu", "devices"]
    assert RunnerInfo("2.11.0", None).to_json() == {"torch": "2.11.0", "torch_cuda": None}
    assert MoeModule("fused_moe_120").to_json() == {"module": "fused_moe_120"}
    assert list(MoeData("m", [], {}, "trtllm_utils", True, 0, []).to_json())[:3] == \
        ["module", "variants", "warnings"]
    assert list(KernelsData("/j", "1", [], [], []).to_json()) == \
        ["jit_cache_dir", "disable_jit", "modules", "known_answer_tests",
         "compiled_at_run_time"]
    # a failed collection has no payload to read, and a crash's trace is kept, not read
    crashed = ProbeCheck("sglang-data", Status.FAILED, "crashed", CrashData("t").to_json())
    assert SglangData.read(crashed) is None and SglangData.read(None) is None


@pytest.mark.parametrize(("name", "data", "message"), [
    ("runner", {**RUNNER.to_json(), "devices": "2"},
     "probe result 'runner': data key 'devices' must be an integer or null, not '2'"),
    ("runner", {**RUNNER.to_json(), "memory_gib": True},
     "data key 'memory_gib' must be a number or null, not True"),
    ("sglang-data", {**SGLANG.to_json(), "texts": {"sglang/a.py": 1}},
     "data key 'texts' must be an object of strings, not"),
    ("sglang-data", {k: v for k, v in SGLANG.to_json().items() if k != "record"},
     "probe result 'sglang-data' (passed) has no data key 'record'"),
    ("versions-data", {**VERSIONS.to_json(), "torch_cuda": 13},
     "data key 'torch_cuda' must be a string or null, not 13"),
])
def test_data_the_host_could_not_read_is_one_error(name: str, data: dict[str, Any],
                                                   message: str) -> None:
    with pytest.raises(ProbeOutputError) as raised:
        ProbeResults.from_output(_line(name, Status.PASSED, data))
    assert message in str(raised.value)
