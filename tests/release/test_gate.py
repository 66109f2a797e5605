"""The release gate proves something: a smoke report opens it only when it ran, as counted
checks, every check the gate requires (runner, sglang, lockstep, kernels) for this artifact;
a malformed report is one clear configuration error naming the file, read before anything
is built. The index's digests are compared case-insensitively on the publish side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builder.core.cache import sha256_json
from builder.core.errors import ConfigurationError, PublishError
from builder.smoke.gpu import SmokeReport, load_report, require_passed
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.serve import serve_in_thread

PROVENANCE = {"target": "sglang-0.5.11", "version": "0.5.11+sm120.1"}
DIGEST = sha256_json(PROVENANCE)


def check(name: str, status: str = "passed", required: bool = True,
          data: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "status": status, "required": required, "detail": name,
            "data": data or {}}


def report(checks: list[Any], **extra: Any) -> dict[str, Any]:
    return {"schema": 1, "mode": "host", "artifacts": {"sglang": {"provenance_sha256": DIGEST}},
            "checks": checks, **extra}


GOOD = [check("runner"), check("sglang", data={"provenance_sha256": DIGEST}),
        check("lockstep"), check("kernels"), check("moe-autotune", "not-run", False),
        check("server", "not-run", False)]


def test_a_full_passing_report_opens_the_gate(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps(report(GOOD)))
    require_passed(load_report(tmp_path / "r.json"), sglang_provenance=PROVENANCE)


@pytest.mark.parametrize(("checks", "missing"), [
    ([], "runner, sglang, lockstep, kernels"),
    ([check("runner", "failed", False), check("sglang", "failed", False)],
     "runner, sglang, lockstep, kernels"),
    ([{**c, "required": False} if c["name"] == "kernels" else c for c in GOOD], "kernels"),
    ([c for c in GOOD if c["name"] != "lockstep"], "lockstep"),
])
def test_a_report_that_ran_nothing_proves_nothing(checks: list[Any], missing: str,
                                                  tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps(report(checks)))
    loaded = load_report(tmp_path / "r.json")
    assert not loaded.passed and loaded.exit_status == 1
    with pytest.raises(PublishError, match=f"did not run \\(as counted checks\\) {missing}:"):
        require_passed(loaded, sglang_provenance=PROVENANCE)


def test_the_artifact_is_the_one_the_sglang_check_verified(tmp_path: Path) -> None:
    forged = [check("sglang", data={"provenance_sha256": "0" * 64}) if c["name"] == "sglang"
              else c for c in GOOD]
    (tmp_path / "r.json").write_text(json.dumps(report(forged)))
    with pytest.raises(PublishError, match="not the one its sglang check verified"):
        require_passed(load_report(tmp_path / "r.json"), sglang_provenance=PROVENANCE)


MALFORMED = {
    "a list": ([GOOD], "not a smoke report"),
    "a check is a string": (report(["runner", *GOOD[1:]]), "a check is a str"),
    "required is a string": (report([{**GOOD[0], "required": "false"}, *GOOD[1:]]),
                             "required is 'false'"),
    "unknown check": (report([*GOOD, check("speed")]), "check 'speed' is not one of"),
    "check twice": (report([*GOOD, check("runner")]), "check runner appears more than once"),
    "artifacts a string": (report(GOOD, artifacts="sglang"), "artifacts must be an object"),
    "artifact a list": (report(GOOD, artifacts={"sglang": ["x"]}), "an object of objects"),
    "mode unknown": (report(GOOD, mode="cloud"), "mode 'cloud' is not host or image"),
    "data a list": (report([{**GOOD[0], "data": [1]}, *GOOD[1:]]), "data an object"),
    "status a list": (report([{**GOOD[0], "status": ["passed"]}, *GOOD[1:]]),
                      "unknown status"),
    "misconfigured a string": (report(GOOD, misconfigured_runner="no"),
                               "misconfigured_runner is 'no'"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_report_is_one_error_naming_the_file(case: str, tmp_path: Path) -> None:
    data, message = MALFORMED[case]
    (tmp_path / "r.json").write_text(json.dumps(data))
    with pytest.raises(ConfigurationError) as caught:
        load_report(tmp_path / "r.json")
    assert message in caught.value.cause and str(tmp_path / "r.json") in caught.value.cause


LEAVES = st.none() | st.booleans() | st.integers() | st.text(max_size=6) | st.sampled_from(
    ["runner", "sglang", "lockstep", "kernels", "passed", "failed", "host", DIGEST])
KEYS = st.sampled_from(["name", "status", "required", "detail", "data", "schema", "mode",
                        "checks", "artifacts", "sglang", "provenance_sha256"])
JSON = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=5)
                    | st.dictionaries(KEYS, inner, max_size=6), max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(checks=JSON, artifacts=JSON)
def test_any_report_is_read_or_refused_and_opens_the_gate_only_when_proven(
        checks: Any, artifacts: Any) -> None:
    data = {"schema": 1, "mode": "host", "checks": checks, "artifacts": artifacts}
    try:
        loaded = SmokeReport.from_json(data)
    except ConfigurationError:
        return
    try:
        require_passed(loaded, sglang_provenance=PROVENANCE)
    except PublishError:
        return
    counted = {c.name for c in loaded.checks if c.required and c.ok}
    assert {"runner", "sglang", "lockstep", "kernels"} <= counted
    assert loaded.check("sglang").data.get("provenance_sha256") == DIGEST


def test_publish_wheels_refuses_a_malformed_report_before_building(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps(MALFORMED["required is a string"][0]))
    done = run_cli("release", "wheels", "--repository-url", "http://127.0.0.1:9/",
                   "--gate", "smoke", "--smoke-report", str(tmp_path / "r.json"),
                   cwd=REPO, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"smoke report {tmp_path / 'r.json'}: check 'runner': required is 'false'" in \
        " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr and not (tmp_path / "cache").exists()


def test_a_release_stopped_by_a_stage_keeps_that_stages_status(tmp_path: Path) -> None:
    # An unknown target is the user's input (2), not a publishing fault (7); the summary
    # still says what was not published and why.
    done = run_cli("release", "wheels", "--repository-url", "http://127.0.0.1:9/",
                   "--gate", "build", "--target", "nope", "--json", cwd=REPO,
                   cache=tmp_path / "cache")
    error = json.loads(done.stdout)
    assert (done.returncode, error["kind"]) == (2, "configuration error"), done.stdout
    assert error["report"]["not_published"] == [
        {"artifact": "the wheels of target nope",
         "reason": f"stopped: unknown target 'nope' in {REPO / 'targets.toml'}"}]


@pytest.mark.parametrize(("args", "message"), [
    (["--repository-url", "notaurl", "--gate", "build"], "'notaurl' is not an http(s) URL"),
    (["--repository-url", "http://127.0.0.1:99999/", "--gate", "build"],
     "port 99999 is outside 1-65535"),
    (["--repository-url", "http://u:p@127.0.0.1:9/", "--gate", "build"],
     "'http://u:****@127.0.0.1:9/' carries credentials"),
    (["--repository-url", "http://127.0.0.1:9/"],
     "the smoke gate needs the smoke test's report from a GPU runner"),
    (["--repository-url", "http://127.0.0.1:9/", "--gate", "build", "--kernel-wheel",
      "/nonexistent/k.whl"], "--kernel-wheel /nonexistent/k.whl: no such file"),
])
def test_a_release_refuses_its_flags_before_any_build(tmp_path: Path, args: list[str],
                                                      message: str) -> None:
    done = run_cli("release", "wheels", *args, "--dist", str(tmp_path / "dist"),
                   "--json", cwd=REPO, cache=tmp_path / "cache")
    error = json.loads(done.stdout)
    assert (done.returncode, error["kind"]) == (2, "configuration error"), done.stdout
    assert message in error["error"], error
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize(("page", "expected"), [
    ('<a href="/f/{name}#sha256={upper}">{name}</a>', "already-published"),
    ('{{"meta": {{"api-version": "1.0"}}, "name": "sglang", "files": [{{"filename": 3}}]}}',
     "malformed page"),
])
def test_publish_reads_the_index_as_the_source_side_does(tmp_path: Path, page: str,
                                                         expected: str) -> None:
    import hashlib
    import http.server

    from builder.release.publish import Index, wheel_state

    name = "sglang-0.5.11+sm120.1-py3-none-any.whl"
    wheel = tmp_path / name
    wheel.write_bytes(b"not really a wheel")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    body = page.format(name=name, upper=sha.upper()).encode()
    kind = "application/vnd.pypi.simple.v1+json" if body.startswith(b"{") else "text/html"

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serve_in_thread(server)
    index = Index.from_urls(f"http://127.0.0.1:{server.server_address[1]}/")
    try:
        if expected == "already-published":
            assert wheel_state(index, wheel, sha) == expected
        else:
            with pytest.raises(PublishError, match=expected):
                wheel_state(index, wheel, sha)
    finally:
        server.shutdown()
        server.server_close()
