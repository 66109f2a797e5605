"""The CI workflows in ci/: clean under actionlint and zizmor, thin calls of nox sessions
that exist, actions pinned by commit, secrets only where publishing happens, and the
build matrix produced by ``python -m builder plan --json`` for every target."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from builder import load_targets
from tests.helpers.paths import REPO

CI = REPO / "ci"
WORKFLOWS = sorted(CI.glob("*.yml"))
ACTIONLINT_CONFIG = CI / "actionlint.yaml"
BIN = Path(sys.executable).parent
PER_TARGET_JOBS = ("wheel", "kernels", "image", "smoke", "publish")
PLAN_MATRIX = "${{ fromJSON(needs.plan.outputs.plan).targets }}"
_OPERATORS = {">>", ">", "|", "||", "&&", ";", "&", "<", "(", ")"}


def _tool(name: str) -> str:
    """The test extra's executable (beside this interpreter, else on PATH); never a skip."""
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), path
    if True in data:  # YAML 1.1 reads the key `on` as true
        data["on"] = data.pop(True)
    return data


def _steps(workflow: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, step) for name, job in workflow["jobs"].items()
            for step in job.get("steps", [])]


def _nox_sessions(script: str) -> list[str]:
    """Session names a shell script passes to ``nox -s`` / ``--session(s)``."""
    names = []
    for line in script.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        for index, token in enumerate(tokens):
            if Path(token).name != "nox":
                continue
            rest = iter(tokens[index + 1:])
            for arg in rest:
                if arg in _OPERATORS or arg == "--":
                    break
                if arg in ("-s", "-e", "--session", "--sessions"):
                    for name in rest:
                        if name.startswith("-") or name in _OPERATORS:
                            break
                        names.append(name)
                    break
    return names


BUILD = _load(CI / "build.yml")
CALLED = sorted({name for path in WORKFLOWS for _, step in _steps(_load(path))
                 for name in _nox_sessions(step.get("run", ""))})


def test_the_workflows_are_there() -> None:
    assert [p.name for p in WORKFLOWS] == ["build.yml", "pull-request.yml", "upstream.yml"]
    assert set(CALLED) >= {"lint", "tests", "matrix", "plan", "build", "kernels", "image",
                           "smoke", "release", "upstream"}


# --- the linters ---------------------------------------------------------------------------

def _actionlint(*paths: Path, config: bool = True) -> subprocess.CompletedProcess[str]:
    args = [_tool("actionlint"), "-no-color", "-shellcheck", _tool("shellcheck")]
    if config:
        args += ["-config-file", str(ACTIONLINT_CONFIG)]
    return subprocess.run([*args, *map(str, paths)], capture_output=True, text=True,
                          timeout=120)


def _zizmor(*paths: Path) -> subprocess.CompletedProcess[str]:
    # offline (no GitHub here), no inline ignores honoured, schema errors fatal
    return subprocess.run([_tool("zizmor"), "--offline", "--no-config", "--no-ignores",
                           "--strict-collection", "--no-progress", "--format", "json",
                           *map(str, paths)], capture_output=True, text=True, timeout=120)


def test_actionlint_finds_nothing() -> None:
    done = _actionlint(*WORKFLOWS)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_actionlint_and_its_shellcheck_do_find_mistakes(tmp_path: Path) -> None:
    # without the config the SM120 runner's labels are unknown
    assert 'label "sm120" is unknown' in _actionlint(CI / "build.yml", config=False).stdout
    broken = tmp_path / "pull-request.yml"
    broken.write_text((CI / "pull-request.yml").read_text().replace(
        "- run: nox -s lint", "- run: nox -s $SESSION"))
    done = _actionlint(broken)
    assert done.returncode == 1 and "SC2086" in done.stdout


def test_zizmor_finds_nothing() -> None:
    done = _zizmor(*WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout) == []


def test_zizmor_does_find_mistakes(tmp_path: Path) -> None:
    text = (CI / "upstream.yml").read_text()
    broken = tmp_path / "upstream.yml"
    broken.write_text(text.replace("persist-credentials: false", "fetch-depth: 1").replace(
        "actions/setup-python@5fda3b95a4ea91299a34e894583c3862153e4b97", "actions/setup-python@v7"))
    done = _zizmor(broken)
    assert done.returncode != 0
    assert {f["ident"] for f in json.loads(done.stdout)} >= {"artipacked", "unpinned-uses"}


# --- structure -----------------------------------------------------------------------------

def test_actions_are_pinned_by_commit_with_their_release() -> None:
    seen: dict[str, str] = {}
    for path in WORKFLOWS:
        for line in path.read_text().splitlines():
            if re.match(r"\s*(- )?uses:", line):
                match = re.fullmatch(r"\s*(?:- )?uses: ([\w.-]+/[\w./-]+)@([0-9a-f]{40}) "
                                     r"# (v\d+\.\d+\.\d+)", line)
                assert match, f"{path.name}: not pinned by commit with a # vX.Y.Z: {line}"
                action, commit, release = match.groups()
                # one release per action everywhere, and one commit per release
                assert seen.setdefault(action, f"{commit} {release}") == f"{commit} {release}"
    assert set(seen) == {"actions/checkout", "actions/setup-python", "actions/upload-artifact",
                         "actions/download-artifact", "aws-actions/configure-aws-credentials",
                         "docker/login-action"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_run_step_is_a_thin_nox_call(path: Path) -> None:
    for job, step in _steps(_load(path)):
        if "run" not in step:
            continue
        lines = [line.strip() for line in step["run"].splitlines() if line.strip()]
        if lines == ["python -m pip install nox==2026.10.20"]:
            continue
        work = [line for line in lines if line not in ("{", "}") and
                not line.startswith(("echo ", "} >>"))]
        assert work and all(line.startswith("nox -s ") for line in work), (job, step["run"])


@pytest.fixture(scope="module")
def defined_sessions() -> set[str]:
    done = subprocess.run([sys.executable, "-m", "nox", "--list", "--no-color"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return {m.group(1) for m in re.finditer(r"^[*-] (\S+)", done.stdout, re.MULTILINE)}


@pytest.mark.parametrize("session", CALLED)
def test_every_session_a_workflow_calls_exists(session: str, defined_sessions: set[str]
                                               ) -> None:
    assert session in defined_sessions, f"noxfile.py has no session {session!r}"


def test_permissions_are_minimal_and_secrets_only_in_publish() -> None:
    for path in WORKFLOWS:
        workflow = _load(path)
        assert workflow["permissions"] == {}, path.name
        assert "secrets." not in json.dumps({k: v for k, v in workflow.items() if k != "jobs"})
        for name, job in workflow["jobs"].items():
            allowed = {"contents": "read"}
            if (path.name, name) in (("build.yml", "kernels"), ("build.yml", "kernel-shards")):
                allowed["id-token"] = "write"  # OIDC for the sccache bucket
            if (path.name, name) == ("upstream.yml", "pull-request"):
                # its own branch and pull request, with the new target (bump --latest)
                allowed = {"contents": "write", "pull-requests": "write"}
            assert job["permissions"] == allowed, (path.name, name)
            uses_secrets = "secrets." in json.dumps(job)
            assert uses_secrets == ((path.name, name) == ("build.yml", "publish")), \
                (path.name, name)


def test_publish_runs_on_version_tags_after_the_smoke_test() -> None:
    jobs = BUILD["jobs"]
    assert BUILD["on"]["push"] == {"branches": ["main"], "tags": ["v*"]}
    publish = jobs["publish"]
    assert "smoke" in publish["needs"]
    assert publish["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert publish["environment"] == "release"
    assert "image" in jobs["smoke"]["needs"]
    assert {"wheel", "kernels"} <= set(jobs["image"]["needs"])
    for name, job in jobs.items():
        if name == "kernels":  # runs after failed shards too (it compiles what they left)
            assert job["if"] == "${{ !cancelled() && needs.plan.result == 'success' }}"
            continue
        assert name == "publish" or "if" not in job  # nothing else is held back


def test_runners_large_for_kernels_and_sm120_for_smoke() -> None:
    jobs = BUILD["jobs"]
    assert jobs["kernels"]["runs-on"] == \
        "${{ vars.KERNELS_RUNNER || 'ubuntu-latest-16-cores' }}"
    labels = jobs["smoke"]["runs-on"]
    assert labels[0] == "self-hosted" and {"gpu", "sm120"} <= set(labels)
    declared = yaml.safe_load(ACTIONLINT_CONFIG.read_text())["self-hosted-runner"]["labels"]
    assert set(declared) == {"gpu", "sm120"}
    # the shared sccache backend comes from variables, never secrets
    env = jobs["kernels"]["env"]
    assert {k for k in env if k.startswith("SCCACHE_")} == {
        "SCCACHE_REDIS_ENDPOINT", "SCCACHE_BUCKET", "SCCACHE_REGION", "SCCACHE_S3_KEY_PREFIX"}
    assert all(v.startswith("${{ vars.") for v in env.values())


def test_pull_requests_and_schedule() -> None:
    pr = _load(CI / "pull-request.yml")
    assert list(pr["on"]) == ["pull_request"]
    runs = {name: [s["run"] for s in job["steps"] if "run" in s]
            for name, job in pr["jobs"].items()}
    assert runs["lint"][-1] == "nox -s lint" and runs["tests"][-1] == "nox -s tests"
    assert runs["matrix"][-1] == 'nox -s matrix >> "$GITHUB_STEP_SUMMARY"'
    upstream = _load(CI / "upstream.yml")
    assert set(upstream["on"]) == {"schedule", "workflow_dispatch"}
    (cron,) = upstream["on"]["schedule"]
    assert len(cron["cron"].split()) == 5
    jobs = upstream["jobs"]
    assert set(jobs) == {"upstream", "bump", "pull-request"}
    runs = [step["run"] for step in jobs["upstream"]["steps"] if "run" in step]
    assert runs[-2:] == ['nox -s upstream >> "$GITHUB_STEP_SUMMARY"',
                         "nox -s pin-images-check"]
    # The pin check reports even when the series check failed first.
    assert jobs["upstream"]["steps"][-1]["if"] == "${{ !cancelled() }}"
    # bump --latest daily; a new release becomes a pull request, written by a job that
    # runs nothing but the proposal, only when bump wrote a target
    assert len(cron["cron"].split()) == 5 and cron["cron"].split()[2:] == ["*", "*", "*"]
    bump = jobs["bump"]
    assert any(s.get("run") == "nox -s bump" for s in bump["steps"])
    proposal = jobs["pull-request"]
    assert proposal["needs"] == "bump"
    assert proposal["if"] == "needs.bump.outputs.new == 'true'"
    assert proposal["steps"][-1]["run"] == 'nox -s propose -- "$VERSION"'
    assert proposal["steps"][-1]["env"]["GH_TOKEN"] == "${{ github.token }}"


# --- the matrix comes from plan --json ----------------------------------------------------

def _github_outputs(text: str) -> dict[str, str]:
    """Parse a $GITHUB_OUTPUT file: ``name=value`` and ``name<<DELIM`` ... ``DELIM``."""
    outputs: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            body = []
            for inner in lines:
                if inner == delimiter:
                    break
                body.append(inner)
            else:
                raise AssertionError(f"output {name} is not closed by {delimiter}")
            outputs[name] = "\n".join(body)
        elif line:
            name, value = line.split("=", 1)
            outputs[name] = value
    return outputs


@pytest.mark.slow(reason="runs the plan job's nox session")
def test_the_plan_job_gives_every_target_to_every_per_target_job(tmp_path: Path) -> None:
    jobs = BUILD["jobs"]
    assert jobs["plan"]["outputs"] == {"plan": "${{ steps.plan.outputs.plan }}"}
    (step,) = [s for s in jobs["plan"]["steps"] if s.get("id") == "plan"]
    assert _nox_sessions(step["run"]) == ["plan"]
    # Run the step's script as the runner does (bash -eo pipefail, $GITHUB_OUTPUT set).
    script = tmp_path / "plan.sh"
    script.write_text(step["run"])
    output = tmp_path / "github_output"
    output.touch()
    env = {**os.environ, "GITHUB_OUTPUT": str(output),
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    include = json.loads(_github_outputs(output.read_text())["plan"])["targets"]
    targets = load_targets(REPO / "targets.toml")
    assert [entry["target"] for entry in include] == list(targets.targets)
    for name in PER_TARGET_JOBS:
        job = jobs[name]
        assert "plan" in job["needs"], name
        assert job["strategy"]["matrix"] == {"include": PLAN_MATRIX}, name
    # every matrix property the workflow reads is in every entry
    text = (CI / "build.yml").read_text()
    shards_text = text[text.index("  kernel-shards:"):text.index("\n  kernels:")]
    used = set(re.findall(r"matrix\.(\w+)", text.replace(shards_text, "")))
    assert used and all(used <= set(entry) for entry in include)
    # the kernel shard jobs: every target once per shard, I/N, then the final job
    shards = json.loads(_github_outputs(output.read_text())["plan"])["kernel_shards"]
    assert jobs["kernel-shards"]["strategy"]["matrix"] == {
        "include": "${{ fromJSON(needs.plan.outputs.plan).kernel_shards }}"}
    assert sorted((e["target"], e["shard"]) for e in shards) == sorted(
        (t, f"{i}/4") for t in targets.targets for i in range(1, 5))
    used = set(re.findall(r"matrix\.(\w+)", shards_text))
    assert "shard" in used and all(used <= set(entry) for entry in shards)
    assert "kernel-shards" in jobs["kernels"]["needs"]
    (final,) = [s["run"] for s in jobs["kernels"]["steps"] if "nox -s kernels" in s.get("run", "")]
    (shard,) = [s["run"] for s in jobs["kernel-shards"]["steps"] if "nox -s" in s.get("run", "")]
    assert "--sccache" in final and "--shard" not in final
    assert '--sccache --shard "$SHARD"' in shard
