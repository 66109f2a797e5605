"""nox sessions: build (the default target's wheel into dist/), kernels, image, release,
smoke, tests, lint, docs, benchmark, and the CI helpers plan, matrix, upstream, bump, propose.

Thin by design: each session installs the builder and calls its CLI or pytest.
"""

from __future__ import annotations

import json
import os

import nox

nox.options.sessions = ["build"]
nox.options.reuse_existing_virtualenvs = True

# Sessions use the interpreter that runs nox (Python >= 3.11).


@nox.session
def build(session: nox.Session) -> None:
    """Build a target's patched wheel into dist/ (``nox -s build -- --target NAME``)."""
    session.install(".")
    session.run("python", "-m", "builder", "wheel", *session.posargs)


@nox.session
def image(session: nox.Session) -> None:
    """Build the runtime OCI image (``nox -s image -- --base-image NAME@sha256:...``)."""
    session.install(".")
    session.run("python", "-m", "builder", "image", *session.posargs)


@nox.session
def release(session: nox.Session) -> None:
    """build -> image -> smoke -> publish; publishes only what passed the smoke gate.

    ``nox -s release -- --registry HOST:PORT --repository-url URL [--kernel-wheel WHEEL]``;
    credentials from TWINE_USERNAME / TWINE_PASSWORD (or keyring) and
    SGLANG_SM120_REGISTRY_USERNAME / _PASSWORD (or docker login). The summary lists exactly
    what got published.
    """
    session.install(".")
    session.run("python", "-m", "builder", "release", "image", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite, both tiers, as CI runs it (``nox -s tests -- ARGS`` adds pytest
    arguments: ``-m fast`` for the fast tier alone, a path for one file).

    Two pytest workers (pytest-xdist): the tests that start services share one worker and
    the kernel build tests another (``xdist_group``, set in tests/helpers/tiers.py); every other
    file runs whole on either (``--dist loadgroup``). docs/testing.md has the figures.
    """
    session.install(".[test]")
    session.run("pytest", "-n", "2", "--dist", "loadgroup", *session.posargs)


@nox.session(name="tests-fast")
def tests_fast(session: nox.Session) -> None:
    """The fast tier: no Docker Engine, services, nvcc or big downloads (docs/testing.md)."""
    session.install(".[test]")
    session.run("pytest", "-m", "fast", "-n", "2", "--dist", "loadgroup", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff and mypy, both clean."""
    session.install(".[lint]")
    session.run("ruff", "check", "builder", "tests", "benchmarks", "docs/_ext", "noxfile.py")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site into site/ (``mkdocs build --strict``: any warning fails).

    The API pages are generated from the docstrings of builder/ (read as source, not
    imported); ``nox -s docs -- --verbose`` passes options to mkdocs.
    """
    session.install(".[docs]")
    session.run("mkdocs", "build", "--strict", "--site-dir", "site", *session.posargs,
                env={"NO_MKDOCS_2_WARNING": "1"})  # Material's end-of-life banner


@nox.session
def benchmark(session: nox.Session) -> None:
    """Speed goals, reported as ratios measured in one run (not a test)."""
    session.install(".")
    session.run("python", "benchmarks/bench_startup.py")
    session.run("python", "benchmarks/bench_wheel.py", *session.posargs)
    session.run("python", "benchmarks/bench_unpack.py")
    session.run("python", "benchmarks/bench_matrix.py")
    session.run("python", "benchmarks/bench_repack.py")
    session.run("python", "benchmarks/bench_kernels.py")
    session.run("python", "benchmarks/bench_shards.py")  # needs root and redis-server
    session.run("python", "benchmarks/model_shards.py", "--measured", "424")  # the x2 run
    session.install(".[test]")  # the image benchmark starts an engine like the tests
    session.run("python", "benchmarks/bench_image.py")


# --- CI sessions (ci/*.yml call these; docs/ci.md) -------------------------------------


@nox.session
def plan(session: nox.Session) -> None:
    """The CI build matrix as JSON on stdout (``python -m builder plan --json``)."""
    session.install(".")
    session.run("python", "-m", "builder", "plan", "--json", *session.posargs)


@nox.session
def matrix(session: nox.Session) -> None:
    """The patch compatibility matrix as Markdown on stdout (for a job summary)."""
    session.install(".")
    session.run("python", "-m", "builder", "matrix", "--format", "markdown", *session.posargs)


@nox.session
def upstream(session: nox.Session) -> None:
    """Newer upstream releases checked against the series, as Markdown on stdout."""
    session.install(".")
    session.run("python", "-m", "builder", "upstream", "--format", "markdown",
                *session.posargs)


@nox.session(name="pin-images-check")
def pin_images_check(session: nox.Session) -> None:
    """Whether the base images' tags still point at the digests in images/pins.toml
    (through the registries' API, nothing pulled); fails when one moved or was never
    resolved (``nox -s pin-images-check``; fix with ``python -m builder pin-images``)."""
    session.install(".")
    session.run("python", "-m", "builder", "pin-images", "--verify", *session.posargs)


@nox.session
def bump(session: nox.Session) -> None:
    """Pin the newest upstream release: ``upstream --json`` says which releases are newer
    than every target, ``add-target VERSION`` pins the newest of them. With a new one,
    targets.toml gains its target, pr-body.md holds the pull request body, and GitHub
    Actions gets the outputs ``new=true`` and ``version=X`` (ci/upstream.yml)."""
    from packaging.version import Version

    session.install(".")
    # upstream exits 5 when the series needs a refresh: the report is then under "report".
    out = json.loads(str(session.run("python", "-m", "builder", "upstream", "--json",
                                     *session.posargs, silent=True, success_codes=[0, 5])))
    report = out.get("report", out)
    if "new_versions" not in report:
        session.error(f"upstream failed: {out.get('error')}")
    new = bool(report["new_versions"])
    version = max(report["new_versions"], key=Version) if new else report["newest_target"]
    if new:
        added = json.loads(str(session.run(
            "python", "-m", "builder", "add-target", version, "--json", "--body-file",
            "pr-body.md", *session.posargs, silent=True)))
        new = added["status"] in ("added", "replaced")
    session.log(f"bump: {'added' if new else 'up to date at'} {version}")
    if "GITHUB_OUTPUT" in os.environ:
        with open(os.environ["GITHUB_OUTPUT"], "a") as outputs:
            outputs.write(f"new={'true' if new else 'false'}\nversion={version}\n")


@nox.session(python=False)
def propose(session: nox.Session) -> None:
    """Open a pull request with the new target (``nox -s propose -- VERSION``), unless one
    for that release is open already. Needs git, the GitHub CLI and ``GH_TOKEN``."""
    (version,) = session.posargs
    branch = f"bump/sglang-{version}"
    listed = session.run("gh", "pr", "list", "--head", branch, "--state", "open", "--json",
                         "number", silent=True, external=True)
    if json.loads(str(listed)):
        session.log(f"a pull request for {branch} is open already")
        return
    session.run("gh", "auth", "setup-git", external=True)
    session.run("git", "switch", "-c", branch, external=True)
    session.run("git", "add", "targets.toml", external=True)
    session.run("git", "-c", "user.name=github-actions[bot]", "-c",
                "user.email=41898282+github-actions[bot]@users.noreply.github.com",
                "commit", "-m",
                f"targets: pin SGLang {version} (python -m builder add-target {version})",
                external=True)
    session.run("git", "push", "--force", "origin", branch, external=True)
    session.run("gh", "pr", "create", "--head", branch, "--title",
                f"Pin SGLang {version}", "--body-file", "pr-body.md", external=True)


@nox.session
def kernels(session: nox.Session) -> None:
    """FlashInfer kernels for the target as a flashinfer_jit_cache wheel in dist/, compiled
    in the CUDA build container (``nox -s kernels -- --target NAME --modules norm``; the
    default module set with no --modules; ``python -m builder kernels build`` compiles with
    this machine's toolkit)."""
    session.install(".")
    session.run("python", "-m", "builder", "kernels", "container", *session.posargs)


# --- smoke (issue 6) -------------------------------------------------------------------
@nox.session(venv_backend="none")
def smoke(session: nox.Session) -> None:
    """Smoke-test the artifacts on a GPU runner (``nox -s smoke -- host --json``).

    Runs in the current environment (no virtualenv): host mode tests the Python
    environment that has the wheels installed; image mode needs only docker-py here.
    """
    session.run("python", "-m", "builder", "smoke", *session.posargs)
