"""One rule for what a launch profile means (issue 38, class A): ``serve-command``, the
image's launcher and the profile check read a profile and the user's TP size the same way
(``builder/image/data/sglang_sm120_profile.py``), and the image carries that very file."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from builder.core.config import load_targets
from builder.core.errors import BuilderError
from builder.image.profile import LAUNCHER_SOURCE, PROFILES_DIR, load_profile, profile_path
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO

TARGETS = load_targets(REPO / "targets.toml")
TARGET = TARGETS.get("sglang-0.5.23")
PROFILE = profile_path(REPO / PROFILES_DIR, TARGET)
#: TP 2 on an RTX 5090 in 0.5.23's profile; TP 4 has --max-running-requests 160 only.
TP2_CAPS = ["--max-running-requests", "128", "--cuda-graph-max-bs-decode", "128"]
#: Every way SGLang's parser (argparse, abbreviations allowed) reads a TP size of 2.
TP2_SPELLINGS = [["--tp", "2"], ["--tp=2"], ["--tp-size=2"], ["--tp-size", "2"],
                 ["--tensor-parallel-size", "2"], ["--tp-si", "2"], ["--tensor-p=2"]]


def launch(*args: str, profile: Path = PROFILE, gpu: str = "rtx-5090"
           ) -> subprocess.CompletedProcess[str]:
    """The image's launcher, in a dry run, from its own folder (as in the image)."""
    env = {**os.environ, "SGLANG_SM120_DRY_RUN": "1", "SGLANG_SM120_PROFILE": str(profile),
           "SGLANG_SM120_GPU": gpu, "PATH": os.path.dirname(sys.executable)}
    env.pop("SGLANG_SM120_TP", None)
    return subprocess.run([sys.executable, str(LAUNCHER_SOURCE), *args], env=env,
                          capture_output=True, text=True, timeout=60)


def serve(*extra: str, tp: str = "4", profile: Path | None = None
          ) -> subprocess.CompletedProcess[str]:
    more = ["--launch-profile", str(profile)] if profile else []
    return run_cli("serve-command", "--target", TARGET.name, "--gpu", "rtx-5090", "--tp", tp,
                   "--model", "/m", "--json", *more, "--", *extra)


@pytest.mark.parametrize("spelling", TP2_SPELLINGS, ids=" ".join)
def test_a_tp_size_after_dashdash_that_differs_from_tp_is_refused(spelling: list[str]
                                                                  ) -> None:
    done = serve(*spelling)
    assert done.returncode == 2, done.stdout
    error = json.loads(done.stdout)
    assert error["error"] == "the TP size is given more than once, with different values: " \
        f"--tp 4, {' '.join(spelling)}", error


@pytest.mark.parametrize("spelling", TP2_SPELLINGS, ids=" ".join)
def test_every_reader_takes_the_same_tp_size_from_the_same_spelling(spelling: list[str]
                                                                    ) -> None:
    # The launcher: the TP size the user gives (any spelling), with that size's caps.
    image = launch("--model-path", "/m", *spelling)
    assert image.returncode == 0, image.stderr
    assert shlex.split(image.stdout)[3:] == [*TP2_CAPS, "--model-path", "/m", *spelling]
    # serve-command: the same size given once more after -- is that size, said twice.
    done = serve(*spelling, tp="2")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["argv"][3:] == [*TP2_CAPS, "--model-path", "/m", *spelling]


def test_the_launcher_refuses_two_tp_sizes_that_differ() -> None:
    done = launch("--model-path", "/m", "--tp", "2", "--tensor-parallel-size=4")
    assert done.returncode == 2 and done.stdout == ""
    assert "the TP size is given more than once, with different values: --tp 2, " \
        "--tensor-parallel-size=4" in done.stderr
    done = launch("--model-path", "/m", "--tp-size")
    assert done.returncode == 2 and "--tp-size has no value" in done.stderr


@pytest.mark.parametrize(("old", "new", "message"), [
    ("[gpu.rtx-5090.tp.2]", '[gpu.rtx-5090.tp."02"]', "'02' is not written as a TP size"),
    ('match = "RTX 5090"', "match = 5090", "match = 5090 is not a non-empty string"),
    ("memory_gib = 32", 'memory_gib = "32"', "memory_gib = '32' is not a positive number"),
    ('"--max-running-requests" = 160', '"--max-running-requests" = inf', "is not an option"),
    ('"--max-running-requests" = 160', '"--tp" = 4', "'--tp' sets the TP size"),
    ('"--max-running-requests" = 160', '"--model-path" = "/p"', "sets the model path"),
    ('target = "sglang-0.5.23"', 'target = 523', "target = 523 is not a string"),
])
def test_the_profile_check_and_the_launcher_refuse_the_same_profile(
        tmp_path: Path, old: str, new: str, message: str) -> None:
    bad = tmp_path / "p.toml"
    text = PROFILE.read_text()
    assert old in text
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(BuilderError, match=message):
        load_profile(bad, TARGET)
    done = launch("--model-path", "/m", "--tp", "2", profile=bad)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert serve(tp="2", profile=bad).returncode == 2


@pytest.mark.parametrize("cap", [["--max-running-requests", "64"], ["--max-running-requests=64"],
                                 ["--max-running", "64"]], ids=" ".join)
def test_a_request_cap_below_the_profiles_graph_bound_lowers_the_bound(cap: list[str]
                                                                      ) -> None:
    # TP 2 on an RTX 5090: the profile's cap and graph bound are 128 (TP2_CAPS).
    note = "--cuda-graph-max-bs-decode 128 lowered to 64"
    image = launch("--model-path", "/m", "--tp", "2", *cap)
    assert image.returncode == 0 and note in image.stderr, image.stderr
    argv = shlex.split(image.stdout)
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "64"
    assert argv[-len(cap):] == cap  # the user's cap is the last word: it wins at the server
    done = serve(*cap, tp="2")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["argv"][answer["argv"].index("--cuda-graph-max-bs-decode") + 1] == "64"
    assert [note in line for line in answer["notes"]] == [True]


def test_a_graph_bound_the_user_gives_or_a_higher_cap_is_left_alone() -> None:
    done = serve("--max-running-requests", "64", "--cuda-graph-max-bs-decode", "100", tp="2")
    answer = json.loads(done.stdout)
    assert answer["notes"] == [] and answer["argv"].count("--cuda-graph-max-bs-decode") == 1
    done = serve("--max-running-requests", "512", tp="2")
    answer = json.loads(done.stdout)
    argv = answer["argv"]
    assert answer["notes"] == [] and argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "128"
    image = launch("--model-path", "/m", "--tp", "2", "--max-running-requests", "many")
    assert image.returncode == 0 and "lowered" not in image.stderr  # SGLang's parser says


def test_a_profile_naming_another_target_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text(PROFILE.read_text().replace('target = "sglang-0.5.23"',
                                               'target = "sglang-0.5.20"'))
    with pytest.raises(BuilderError, match=r"is for target sglang-0\.5\.20, not sglang-0\.5\.23"):
        load_profile(bad, TARGET)
    done = serve(profile=bad)
    assert done.returncode == 2 and "is for target sglang-0.5.20" in done.stdout


def test_the_image_carries_the_reader_the_builder_uses(tmp_path: Path) -> None:
    """The launcher imports its reader from its own folder; the build context puts the
    builder's own file there, byte for byte (no second copy to drift)."""
    from builder.image.build import _context
    from builder.image.profile import READER_SOURCE

    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM scratch\n")
    out = tmp_path / "context.tar"
    _context(dockerfile, [], 0, out, load_profile(PROFILE, TARGET))
    with tarfile.open(out) as tar:
        names = tar.getnames()
        reader = tar.extractfile(f"sm120/{READER_SOURCE.name}")
        assert reader is not None and reader.read() == READER_SOURCE.read_bytes()
    assert "sm120/sglang-sm120-serve" in names
    assert f"/tmp/sm120-files/{READER_SOURCE.name} /usr/local/bin/{READER_SOURCE.name}" in \
        (REPO / "images" / "Dockerfile").read_text()
    # The launcher and its reader in one folder elsewhere, as the image has them, run.
    for source in (LAUNCHER_SOURCE, READER_SOURCE):
        (tmp_path / source.name).write_bytes(source.read_bytes())
    (tmp_path / LAUNCHER_SOURCE.name).chmod(0o755)
    env = {**os.environ, "SGLANG_SM120_DRY_RUN": "1", "SGLANG_SM120_PROFILE": str(PROFILE),
           "SGLANG_SM120_GPU": "rtx-5090"}
    done = subprocess.run([sys.executable, str(tmp_path / LAUNCHER_SOURCE.name), "--tp", "2"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and shlex.split(done.stdout)[3:] == [*TP2_CAPS, "--tp", "2"]


def test_a_profile_without_its_release_says_so(tmp_path: Path) -> None:
    # An empty file once read as "the profile is for sglang None".
    for text in ("", PROFILE.read_text().replace('upstream_version = "0.5.23"\n', "")):
        bad = tmp_path / "p.toml"
        bad.write_text(text)
        with pytest.raises(BuilderError, match="no upstream_version"):
            load_profile(bad, TARGET)
        done = serve(profile=bad)
        assert done.returncode == 2 and "None" not in done.stdout + done.stderr


def test_the_launcher_refuses_a_profile_that_is_a_fifo_at_once(tmp_path: Path) -> None:
    # It blocked the container's start, reading the pipe.
    os.mkfifo(tmp_path / "p.toml")
    done = launch("--model-path", "/m", profile=tmp_path / "p.toml")
    assert done.returncode == 2 and "is not a regular file" in done.stderr, done.stderr
