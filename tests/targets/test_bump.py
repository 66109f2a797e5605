"""``bump`` against a real simple index on 127.0.0.1 (PEP 691 JSON, HTTP range requests)
serving the real SGLang 0.5.13 and 0.5.16 wheels and a torch wheel whose METADATA is the
header of PyPI's torch 2.11.0 wheel (tests/data/torch-2.11.0-METADATA): what it writes
into targets.toml, what it refuses, and the matrix it reports."""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from builder.core.basepins import load_base_pins
from builder.core.config import WheelPin, load_targets
from builder.image.profile import load_profile
from tests.helpers.cli import run_cli
from tests.helpers.index import TORCH_WHEEL
from tests.helpers.index import serve as _serve
from tests.helpers.paths import REPO
from tests.helpers.releases import MATRIX_RELEASES


def _bump(project: Path, cache: Path, *args: str) -> tuple[int, dict]:
    done = run_cli("add-target", *args, "--json", cwd=project, cache=cache)
    return done.returncode, json.loads(done.stdout)


def test_bump_writes_the_target_from_the_index(index: str, project: Path,
                                               tmp_path: Path) -> None:
    before = (project / "targets.toml").read_text()
    code, report = _bump(project, tmp_path / "cache", "0.5.16", "--index-url", index)
    assert code == 0, report
    assert report["status"] == "added"
    after = (project / "targets.toml").read_text()
    assert after.startswith(before)  # comments, order and spacing kept
    target = load_targets(project / "targets.toml").get("sglang-0.5.16")
    assert str(target.upstream_version) == "0.5.16" and target.local_label == "sm120.1"
    assert target.prefer == "wheel"
    assert target.cuda_lane == "13.0"  # torch 2.11.0 pins cuda-toolkit==13.0.2
    assert target.arch_list == ("12.0f",)  # FlashInfer 0.6.14 >= 0.6.7
    assert target.sources == (WheelPin("sglang", "0.5.16",
                                       "sglang-0.5.16-cp311-cp311-manylinux_2_34_x86_64.whl",
                                       MATRIX_RELEASES["0.5.16"].sha256),)
    assert "# torch 2.11.0 is built for CUDA 13.0" in after
    assert report["target"]["flashinfer_python"] == "0.6.14"
    assert report["target"]["python_tags"] == ["cp311"]
    cells = {p["name"]: p["cells"]["0.5.16"]["status"] for p in report["matrix"]["patches"]}
    assert cells["0002-sm12x-nvfp4-moe-auto-flashinfer-cutlass.patch"] == "clean"
    assert cells["0003-sm12x-dsa-backends-tilelang.patch"] == "clean"
    assert cells["0001-enable-flashinfer-cutlass-autotune-0.5.11.patch"] == "obsolete"
    assert [(f["patch"], f["action"]) for f in report["findings"]] == [
        ("0001-enable-flashinfer-cutlass-autotune-0.5.11.patch", "obsolete")]
    assert report["unpatched"] is False


def test_an_existing_target_is_never_overwritten_silently(index: str, project: Path,
                                                          tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _bump(project, cache, "0.5.16", "--index-url", index)[0] == 0
    written = (project / "targets.toml").read_bytes()
    done = run_cli("add-target", "0.5.16", "--index-url", index, cwd=project, cache=cache)
    assert done.returncode == 2
    assert "already has a target for 0.5.16" in done.stderr and "--replace" in done.stderr
    assert (project / "targets.toml").read_bytes() == written
    code, report = _bump(project, cache, "0.5.16", "--index-url", index, "--replace",
                         "--local-label", "sm120.2")
    assert code == 0 and report["status"] == "replaced"
    targets = load_targets(project / "targets.toml")
    assert [t.local_label for t in targets.targets.values()
            if str(t.upstream_version) == "0.5.16"] == ["sm120.2"]


def test_an_index_without_ranges_is_one_clear_error(index_root: Path, project: Path,
                                                    tmp_path: Path) -> None:
    server, url = _serve(index_root, ranges=False)
    try:
        before = (project / "targets.toml").read_bytes()
        done = run_cli("add-target", "0.5.16", "--index-url", url, cwd=project,
                       cache=tmp_path / "cache")
        assert done.returncode == 4
        assert "could not read the METADATA of" in done.stderr
        assert "--cuda-lane" in done.stderr
        assert (project / "targets.toml").read_bytes() == before
        code, report = _bump(project, tmp_path / "cache", "0.5.16", "--index-url", url,
                             "--cuda-lane", "13.0")
        assert code == 0 and report["target"]["cuda_lane"] == "13.0"
    finally:
        server.shutdown()
        server.server_close()


def test_bad_arguments(project: Path, tmp_path: Path) -> None:
    for args, message in ((("0.5.16", "--latest"), "unrecognized arguments: --latest"),
                          ((), "the following arguments are required: VERSION"),
                          (("not-a-version",), "is not a PEP 440 version"),
                          (("0.5.16", "--cuda-lane", "13"), "is not like 13.0")):
        done = run_cli("add-target", *args, cwd=project, cache=tmp_path / "cache")
        assert done.returncode == 2 and message in done.stderr, done.stderr


def _edited_series(project: Path) -> None:
    """The repo's series in ``project/patches``, with three real gaps for 0.5.16: 0003's
    range ends before it (0.5.12.post1 still gets it), 0004 gets an intent that holds
    nowhere, and 0005's behaviours are gone."""
    import shutil

    shutil.copytree(REPO / "patches", project / "patches")
    path = project / "patches/series.toml"
    text = path.read_text()
    start = text.index('file = "0003-sm12x-dsa-backends-tilelang.patch"')
    text = text[:start] + text[start:].replace('versions = ">=0.5.15,<0.5.17"',
                                               'versions = ">=0.5.12,<0.5.16"', 1)
    start = text.index('file = "0004-sm12x-nvfp4-shared-expert-fusion.patch"')
    end = text.index("max_fuzz = 0\n", start) + len("max_fuzz = 0\n")
    text = text[:end] + ('\n[[patch.intent]]\ncheck = "regex-present"\n'
                         'file = "python/sglang/srt/server_args.py"\n'
                         "pattern = '^NO_SUCH_LINE_SM120$'\n") + text[end:]
    blocks = re.split(r"(?m)^(?=\[\[)", text)
    text = "".join(b for b in blocks if not (
        b.startswith("[[behaviour]]") and "0005-sm12x-fp4-gemm-auto-b12x" in b))
    path.write_text(text)
    targets = project / "targets.toml"
    targets.write_text(targets.read_text().replace(str(REPO / "patches"),
                                                   str(project / "patches")))


def test_add_target_writes_its_stubs_and_prints_what_it_lacks(index: str, project: Path,
                                                              tmp_path: Path) -> None:
    _edited_series(project)
    cache = tmp_path / "cache"
    code, report = _bump(project, cache, "0.5.16", "--index-url", index, "--dry-run")
    assert code == 0 and not (project / "images").exists()  # a dry run writes nothing
    dry_gaps = report["gaps"]
    code, report = _bump(project, cache, "0.5.16", "--index-url", index)
    assert code == 0, report
    pins, profile = project / "images/pins.toml", project / "images/profiles/sglang-0.5.16.toml"
    assert report["written"] == [str(pins), str(profile)]
    base = load_base_pins(pins).pin_for(Version("0.5.16"), "13.0")
    assert (base.name, base.digest) == ("docker.io/lmsysorg/sglang:v0.5.16-cu130-runtime", "")
    target = load_targets(project / "targets.toml").get("sglang-0.5.16")
    assert load_profile(profile, target).args == {}  # a stub the image stage accepts
    gaps = [(g["kind"], g["subject"]) for g in report["gaps"]]
    assert gaps == [
        ("patch", "0004-sm12x-nvfp4-shared-expert-fusion.patch"),
        ("patch-range", "0003-sm12x-dsa-backends-tilelang.patch"),
        ("base-digest", "images/pins.toml"),
        ("launch-profile", "images/profiles/sglang-0.5.16.toml"),
        ("behaviour", "0005-sm12x-fp4-gemm-auto-b12x.patch")]
    # The dry run reports the gaps the real run leaves (read from the files it would write).
    assert dry_gaps == report["gaps"]
    details = {g["kind"]: g["detail"] for g in report["gaps"]}
    assert "intent checks fail" in details["patch"]
    assert details["patch-range"] == "its range <0.5.16,>=0.5.12 ends before 0.5.16"
    assert details["base-digest"].endswith("digest unresolved")
    assert details["launch-profile"] == "no launch profile values"
    # Human-readable: the same gaps, each with its fix; the stubs are never overwritten.
    profile.write_text(profile.read_text() + '"--max-running-requests" = 64\n\n'
                       '[gpu.rtx-pro-6000.args]\n"--cuda-graph-max-bs" = 256\n')
    kept = profile.read_bytes()
    done = run_cli("add-target", "0.5.16", "--index-url", index, "--replace", cwd=project,
                   cache=cache)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "sglang-0.5.16 still lacks:" in text
    assert "patch-range: 0003-sm12x-dsa-backends-tilelang.patch" in text
    assert "base-digest: images/pins.toml" in text and "pin-images --target sglang-0.5.16" in text
    assert "launch-profile" not in text and "wrote" not in text
    assert profile.read_bytes() == kept
    assert len(load_base_pins(pins).runtime()) == 1


@pytest.mark.parametrize(("member", "text", "message"), [
    ("torch-2.11.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.10.0\n",
     "says version 2.10.0, but the pin and the file name say 2.11.0"),
    ("torch-2.11.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tensorflow\n"
     "Version: 2.11.0\n", "says it is tensorflow"),
    ("torch-2.11.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n"
     + "Requires-Dist: x\n" * 80_000, "over 1048576"),
])
def test_a_range_read_metadata_must_be_its_file_and_small(
        tmp_path: Path, member: str, text: str, message: str) -> None:
    from builder.core.errors import VerificationError
    from builder.source.fetch import remote_wheel_metadata

    (tmp_path / "files").mkdir()
    with zipfile.ZipFile(tmp_path / "files" / TORCH_WHEEL, "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr("torch/lib/padding.bin", os.urandom(300_000))
        out.writestr(member, text)
    server, url = _serve(tmp_path, ranges=True)
    try:
        with pytest.raises(VerificationError, match=re.escape(message)):
            remote_wheel_metadata(url.replace("/simple", f"/files/{TORCH_WHEEL}"), TORCH_WHEEL)
    finally:
        server.shutdown()
        server.server_close()
