"""The kernel stage's seams: what a saved request costs to start, and the numbers it takes.

``kernels --request FILE`` is what a build container (or any build machine without the
upstream source) runs: it must not import the source stage (gitpython, remotezip). The
shard, the parallel jobs and the step costs are numbers from flags and files: NaN, an
infinity, a negative or an absurd one is refused with one ConfigurationError (exit 2)
before any work, never carried into a split or a ninja command line.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version

from builder.core.errors import ConfigurationError
from builder.kernels.build import KernelRequest
from builder.kernels.pins import KernelPins
from builder.kernels.request import KernelOptions
from builder.kernels.shard import MAX_JOBS, MAX_SHARDS, MAX_STEP_SECONDS, Shard, StepCosts
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO

#: What only the source stage needs; a build from a saved request needs none of it.
SOURCE_ONLY = re.compile(r"^(git|remotezip|builder\.source)(\.|$)")


def _request(tmp_path: Path) -> Path:
    """A saved request as ``kernels plan`` writes it (sglang-0.5.9's pins, ``norm``)."""
    pins = KernelPins(Version("0.6.3"), Version("0.6.3"), ("sgl-kernel", "0.3.21"),
                      "torch==2.9.1", "cuda-python==12.9")
    request = KernelRequest("sglang-0.5.9", pins, "0.6.3+sm120.1.cu129", ("12.0a",), "12.9",
                            ("norm",), (), 1771834439)
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request.describe(), indent=2) + "\n")
    return path


def _imported(stderr: str) -> set[str]:
    """Module names in ``python -X importtime`` output (``import time: self | cum | name``)."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


def test_a_saved_request_imports_no_source_stage(tmp_path: Path) -> None:
    """``kernels build --request`` (what the build container runs) reads the request and
    reaches the build environment without the source stage; this Python has no FlashInfer
    0.6.3, so it stops there (exit 6), after the imports."""
    request = _request(tmp_path)
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "builder", "kernels",
                           "build", "--request", str(request), "--environment", "current",
                           "--cache-dir", str(tmp_path / "c")],
                          cwd=REPO, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 6, done.stderr[-3000:]
    assert "has no flashinfer-python, the target pins 0.6.3" in done.stderr
    modules = _imported(done.stderr)
    assert "builder.kernels.build" in modules and "builder.kernels.run" in modules
    assert sorted(m for m in modules if SOURCE_ONLY.match(m)) == []


# --- the numbers ---------------------------------------------------------------------------

def _not_a_count() -> st.SearchStrategy[object]:
    """Values no count may be: non-integers, booleans, zero and below, and past the cap."""
    return st.one_of(st.floats(), st.booleans(), st.integers(max_value=0),
                     st.integers(min_value=MAX_JOBS + 1), st.text(max_size=4))


@given(_not_a_count())
def test_jobs_that_are_not_a_sane_count_are_refused(jobs: object) -> None:
    with pytest.raises(ConfigurationError, match="jobs"):
        KernelOptions(jobs=jobs)  # type: ignore[arg-type]


@given(st.integers(min_value=1, max_value=MAX_JOBS))
def test_every_sane_jobs_count_is_taken(jobs: int) -> None:
    assert KernelOptions(jobs=jobs).jobs == jobs


@given(st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True)),
       st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True)))
def test_a_shard_is_taken_exactly_when_it_is_i_of_n_within_the_cap(index: object,
                                                                   count: object) -> None:
    sane = all(type(n) is int for n in (index, count)) and \
        1 <= index <= count <= MAX_SHARDS  # type: ignore[operator]
    text = f"{index}/{count}"
    if sane:
        assert Shard.parse(text) == Shard(index, count)  # type: ignore[arg-type]
        return
    with pytest.raises(ConfigurationError, match="is not I/N"):
        Shard.parse(text)
    with pytest.raises(ConfigurationError, match="is not I/N"):
        Shard(index, count)  # type: ignore[arg-type]


def test_shard_digits_are_ascii() -> None:
    with pytest.raises(ConfigurationError, match="is not I/N"):
        Shard.parse("\u0661/\u0662")  # Arabic-Indic 1/2: int() reads them, a CI matrix not


def test_an_absurd_shard_count_is_refused_by_the_cli_with_exit_2(tmp_path: Path) -> None:
    done = run_cli("kernels", "build", "--request", str(_request(tmp_path)), "--sccache",
                   "--shard", f"1/{10 ** 12}", "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "is not I/N" in done.stderr
    assert not (tmp_path / "c").exists()


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True)
                 .filter(lambda f: not 0 <= f <= MAX_STEP_SECONDS),
                 st.integers(min_value=MAX_STEP_SECONDS + 1), st.integers(max_value=-1)),
       st.sampled_from(["steps", "links"]))
def test_step_costs_that_are_not_seconds_are_refused(tmp_path_factory: pytest.TempPathFactory,
                                                     seconds: float, kind: str) -> None:
    path = tmp_path_factory.mktemp("costs") / "costs.json"
    # json writes NaN and Infinity as Python does (and reads them back): what a hand edit or
    # another tool may leave in the file.
    path.write_text(json.dumps({kind: {"a.o": 1.0, "b.o": seconds}, "jobs": 2}))
    with pytest.raises(ConfigurationError, match=r"b\.o"):
        StepCosts(path).read()


@given(st.floats(min_value=0, max_value=MAX_STEP_SECONDS))
def test_step_costs_within_the_cap_are_read_back(tmp_path_factory: pytest.TempPathFactory,
                                                 seconds: float) -> None:
    path = tmp_path_factory.mktemp("costs") / "costs.json"
    path.write_text(json.dumps({"steps": {"a.o": seconds}, "links": {"a.so": seconds}}))
    data = StepCosts(path).read()
    assert data["steps"] == {"a.o": seconds} and data["links"] == {"a.so": seconds}


@pytest.mark.parametrize("jobs", [0, -1, 1.5, "4", True, 10 ** 6])
def test_a_costs_file_with_a_bad_jobs_count_is_refused(tmp_path: Path, jobs: object) -> None:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"steps": {"a.o": 1.0}, "links": {}, "jobs": jobs}))
    with pytest.raises(ConfigurationError, match="jobs"):
        StepCosts(path).read()


def test_a_nan_step_costs_file_is_refused_by_the_cli_before_any_work(tmp_path: Path) -> None:
    costs = tmp_path / "costs.json"
    costs.write_text('{"steps": {"norm/norm.cuda.o": NaN}, "links": {}}')
    done = run_cli("kernels", "build", "--request", str(_request(tmp_path)), "--sccache",
                   "--shard", "1/2", "--step-costs", str(costs),
                   "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "norm/norm.cuda.o" in done.stderr and "nan" in done.stderr.lower()
    assert not (tmp_path / "c" / "kernel-env").exists()  # refused before the environment
