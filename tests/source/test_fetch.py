"""Source stage: sdists verified by sha256 before unpacking, safe extraction, index
lookup by hash, and git checkouts whose HEAD must equal the pin."""

from __future__ import annotations

import functools
import http.server
import io
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

import git
import pytest

from builder import (
    BuilderError,
    ConfigurationError,
    SourceError,
    VerificationError,
    load_targets,
)
from builder.core.cache import Cache
from builder.core.config import GitPin, SdistPin, Target
from builder.core.layout import Layout
from builder.source.fetch import fetch_source, local_source
from tests.helpers.project import git_source, target_toml
from tests.helpers.releases import RELEASES, UpstreamRepo
from tests.helpers.serve import serve_in_thread


def _target(*sources: SdistPin | GitPin, version: str = "0.5.9") -> Target:
    from packaging.version import Version

    return Target(name="t", upstream_version=Version(version), local_label="sm120.1",
                  series=Path("series.toml"), sources=sources,
                  prefer=sources[0].kind,
                  cuda_lane="12.9", arch_list=("12.0a",))


def _pin(sdists: dict[str, Path], version: str = "0.5.9", sha256: str | None = None
         ) -> SdistPin:
    return SdistPin("sglang", version, sha256 or RELEASES[version].sha256,
                    url=sdists[version].as_uri())


def test_sdist_is_verified_unpacked_and_cached(sdists: dict[str, Path], tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    source = fetch_source(_target(_pin(sdists)), cache=cache)
    assert source.layout == Layout("sdist")
    assert (source.tree / "sglang" / "srt" / "model_executor" / "model_runner.py").is_file()
    assert source.key == f"sdist-{RELEASES['0.5.9'].sha256}"
    # the newest member of the 0.5.9 sdist is from its release day, 2026-02-23
    assert 1771804800 <= source.source_date_epoch < 1771891200
    again = fetch_source(_target(_pin(sdists)), cache=cache)
    assert again.tree == source.tree


def test_sha256_mismatch_is_refused_and_nothing_cached(sdists: dict[str, Path],
                                                       tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    wrong = RELEASES["0.5.7"].sha256  # the 0.5.9 file does not have 0.5.7's hash
    with pytest.raises(VerificationError, match="sha256 mismatch .* pinned " + wrong):
        fetch_source(_target(_pin(sdists, sha256=wrong)), cache=cache)
    assert not (tmp_path / "cache" / "downloads" / wrong).exists()
    assert not any((tmp_path / "cache" / "source").glob("*")) if \
        (tmp_path / "cache" / "source").exists() else True


def test_damaged_cache_entry_is_not_trusted(sdists: dict[str, Path], tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    pin = _pin(sdists)
    fetch_source(_target(pin), cache=cache)
    archive = cache.entry("downloads", pin.sha256) / pin.filename
    archive.write_bytes(b"truncated")
    fetch_source(_target(pin), cache=Cache(tmp_path / "cache"))
    assert archive.read_bytes() == sdists["0.5.9"].read_bytes()


def _tar_with(tmp_path: Path, name: str, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    path = tmp_path / name
    with tarfile.open(path, "w:gz") as tar:
        ok = tarfile.TarInfo("pkg-1.0/ok.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        tar.addfile(member, io.BytesIO(data) if data else None)
    return path


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "link-outside"])
def test_unsafe_archives_are_refused(tmp_path: Path, kind: str) -> None:
    import hashlib

    if kind == "dotdot":
        member = tarfile.TarInfo("pkg-1.0/../../evil.txt")
        member.size = 4
        archive = _tar_with(tmp_path, "pkg-1.0.tar.gz", member, b"evil")
    elif kind == "absolute":
        member = tarfile.TarInfo("/tmp/evil-absolute.txt")
        member.size = 4
        archive = _tar_with(tmp_path, "pkg-1.0.tar.gz", member, b"evil")
    else:
        member = tarfile.TarInfo("pkg-1.0/link")
        member.type = tarfile.SYMTYPE
        member.linkname = "../../../etc/passwd"
        archive = _tar_with(tmp_path, "pkg-1.0.tar.gz", member)
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    pin = SdistPin("pkg", "1.0", sha, url=archive.as_uri())
    cache = Cache(tmp_path / "cache")
    with pytest.raises(BuilderError, match=r"unsafe archive|is a link"):
        fetch_source(_target(pin, version="1.0"), cache=cache)
    assert not (tmp_path / "evil.txt").exists()
    assert not cache.lookup("source", f"sdist-{sha}")


class _Index(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def local_index(sdists: dict[str, Path], tmp_path: Path) -> Iterator[str]:
    """A PEP 503 (HTML) simple index on 127.0.0.1 serving the real 0.5.9 sdist."""
    root = tmp_path / "index"
    (root / "simple" / "sglang").mkdir(parents=True)
    (root / "files").mkdir()
    (root / "files" / "sglang-0.5.9.tar.gz").write_bytes(sdists["0.5.9"].read_bytes())
    sha = RELEASES["0.5.9"].sha256
    (root / "simple" / "sglang" / "index.html").write_text(
        f'<html><body><a href="../../files/sglang-0.5.9.tar.gz#sha256={sha}">'
        "sglang-0.5.9.tar.gz</a></body></html>")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Index, directory=str(root)))
    serve_in_thread(server)
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()


def test_sdist_is_found_on_an_index_by_its_sha256(local_index: str, tmp_path: Path) -> None:
    pin = SdistPin("sglang", "0.5.9", RELEASES["0.5.9"].sha256)
    source = fetch_source(_target(pin), cache=Cache(tmp_path / "cache"), index_url=local_index)
    assert (source.tree / "PKG-INFO").is_file()


def test_pin_not_on_index_names_what_is_there(local_index: str, tmp_path: Path) -> None:
    pin = SdistPin("sglang", "0.5.9", "0" * 64)
    with pytest.raises(VerificationError, match=r"sha256 mismatch: .* the index has "
                                                r"sglang-0\.5\.9\.tar\.gz \(sha256 11b1"):
        fetch_source(_target(pin), cache=Cache(tmp_path / "cache"), index_url=local_index)


def test_a_pin_the_index_does_not_list_is_unavailable_not_forged(local_index: str,
                                                                 tmp_path: Path) -> None:
    # No file answered wrongly: the index lacks the release (exit 4, a retry or another
    # index may help), unlike a listed file with other bytes (exit 1, above).
    pin = SdistPin("sglang", "0.5.8", "0" * 64)
    with pytest.raises(SourceError, match=r"sglang-0\.5\.8\.tar\.gz is not listed there"):
        fetch_source(_target(pin), cache=Cache(tmp_path / "cache"), index_url=local_index)


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_source_dir_that_is_not_a_folder_is_the_users_input(tmp_path: Path,
                                                              kind: str) -> None:
    path = tmp_path / "tree"
    if kind == "file":
        path.write_text("not a tree")
    with pytest.raises(ConfigurationError, match=r"does not exist|is not a folder"):
        local_source(path, "0.5.9")


def test_unreachable_index_is_one_clear_error(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_RETRIES", "0")  # pip's variable: the same error, no 15 s backoff
    pin = SdistPin("sglang", "0.5.9", RELEASES["0.5.9"].sha256)
    with pytest.raises(BuilderError, match=re.escape("could not reach http://127.0.0.1:9/simple/sglang/")):
        fetch_source(_target(pin), cache=Cache(tmp_path / "cache"),
                     index_url="http://127.0.0.1:9/simple")


def test_git_checkout_head_equals_the_pin(upstream_repo: UpstreamRepo, tmp_path: Path) -> None:
    commit = upstream_repo.commits["0.5.9"]
    source = fetch_source(_target(GitPin(str(upstream_repo.path), commit)),
                          cache=Cache(tmp_path / "cache"))
    repo = git.Repo(source.tree)
    assert repo.head.commit.hexsha == commit
    assert not repo.is_dirty(untracked_files=True)
    assert source.layout == Layout("git")
    assert source.source_date_epoch == repo.head.commit.committed_date


def test_git_commit_missing_from_repository(upstream_repo: UpstreamRepo, tmp_path: Path) -> None:
    missing = "1" * 40
    with pytest.raises(BuilderError, match=f"commit {missing} is not in"):
        fetch_source(_target(GitPin(str(upstream_repo.path), missing)),
                     cache=Cache(tmp_path / "cache"))


def test_git_mirror_fetches_new_commits(upstream_repo: UpstreamRepo, tmp_path: Path) -> None:
    # A clone to commit in (the workers share upstream_repo); no files checked out: the
    # index of HEAD and the one new file make the next commit.
    repo = git.Repo.clone_from(upstream_repo.path, tmp_path / "upstream", no_checkout=True)
    repo.git.read_tree("HEAD")
    cache = Cache(tmp_path / "cache")
    fetch_source(_target(GitPin(str(repo.working_dir), upstream_repo.commits["0.5.7"])),
                 cache=cache)
    (tmp_path / "upstream" / "NEWS").write_text("later\n")
    repo.git.add("NEWS")
    repo.git.commit("-m", "later commit", env={"GIT_AUTHOR_NAME": "test",
                                               "GIT_AUTHOR_EMAIL": "t@example.invalid",
                                               "GIT_COMMITTER_NAME": "test",
                                               "GIT_COMMITTER_EMAIL": "t@example.invalid"})
    newer = repo.head.commit.hexsha
    repo.close()
    source = fetch_source(_target(GitPin(str(tmp_path / "upstream"), newer)), cache=cache)
    assert (source.tree / "NEWS").is_file()
    assert (source.tree / "python" / "pyproject.toml").is_file()  # the rest of the tree


def test_a_tag_is_never_a_pin(tmp_path: Path) -> None:
    targets = tmp_path / "targets.toml"
    targets.write_text(target_toml("t", "0.5.9", git_source("https://example.invalid/s.git",
                                                            "v0.5.9")))
    with pytest.raises(BuilderError, match="not a full 40-hex commit"):
        load_targets(targets)


def test_source_dir_version_comes_from_pkg_info(unpacked: dict[str, Path]) -> None:
    source = local_source(unpacked["0.5.7"])
    assert str(source.upstream_version) == "0.5.7" and source.pin is None


def test_source_dir_that_is_not_sglang(tmp_path: Path) -> None:
    with pytest.raises(BuilderError, match=r"no pyproject\.toml, python/pyproject"):
        local_source(tmp_path)


def test_released_wheel_is_read_as_an_sdist_layout_tree(matrix_files: dict[str, Path],
                                                        tmp_path: Path) -> None:
    from builder.core.config import WheelPin
    from tests.helpers.releases import MATRIX_RELEASES

    wheel = matrix_files["0.5.11"]
    pin = WheelPin("sglang", "0.5.11", wheel.name, MATRIX_RELEASES["0.5.11"].sha256,
                   wheel.as_uri())
    source = fetch_source(_target(pin, version="0.5.11"), cache=Cache(tmp_path / "cache"))
    assert source.layout == Layout("sdist")
    assert (source.tree / "sglang" / "srt" / "model_executor" / "model_runner.py").is_file()
    assert source.tree_sha256


@pytest.mark.parametrize("member", ["../evil.py", "/abs.py", "link"])
def test_unsafe_wheels_are_refused(tmp_path: Path, member: str) -> None:
    import hashlib
    import stat
    import zipfile

    from builder.core.config import WheelPin

    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/ok.py", "ok = 1\n")
        info = zipfile.ZipInfo(member)
        if member == "link":
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(info, "../../etc/passwd" if member == "link" else "evil = 1\n")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    cache = Cache(tmp_path / "cache")
    pin = WheelPin("pkg", "1.0", wheel.name, sha, wheel.as_uri())
    with pytest.raises(BuilderError, match="unsafe archive"):
        fetch_source(_target(pin, version="1.0"), cache=cache)
    assert not (tmp_path / "evil.py").exists()
    assert cache.lookup("source", f"wheel-{sha}") is None
