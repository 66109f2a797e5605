"""``label --bump``'s edit of the targets file (builder.core.labels), on the repository's
own targets.toml and on small files of other spellings: only the label's value changes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder.core.config import load_targets
from builder.core.labels import bump_label, next_label
from tests.helpers.paths import REPO


def _changed_lines(before: bytes, after: bytes) -> list[tuple[bytes, bytes]]:
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    assert len(old) == len(new)
    return [(a, b) for a, b in zip(old, new, strict=True) if a != b]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_bump_changes_only_the_label_and_keeps_the_line_endings(tmp_path: Path,
                                                                newline: bytes) -> None:
    targets = tmp_path / "targets.toml"
    before = (REPO / "targets.toml").read_bytes().replace(b"\n", newline)
    targets.write_bytes(before)
    first = next(iter(load_targets(targets).targets.values()))
    label = first.local_label

    assert bump_label(targets, first.name) == (label, next_label(label))

    after = targets.read_bytes()
    assert after.count(b"\r\n") == before.count(b"\r\n")
    assert _changed_lines(before, after) == [
        (f'local_label = "{label}"'.encode() + newline,
         f'local_label = "{next_label(label)}"'.encode() + newline)]
    labels = {n: t.local_label for n, t in load_targets(targets).targets.items()}
    assert labels == {n: next_label(t.local_label) if n == first.name else t.local_label
                      for n, t in load_targets(REPO / "targets.toml").targets.items()}


def test_bump_keeps_the_quote_style_and_the_comment_and_skips_other_tables(
        tmp_path: Path) -> None:
    shutil.copytree(REPO / "patches", tmp_path / "patches")
    body = ("[[target]]\n"
            'name = "{name}"\n'
            'upstream_version = "0.5.9"\n'
            "{label}\n"
            'series = "patches/series.toml"\n'
            'cuda_lane = "12.9"\n'
            'arch_list = ["12.0a"]\n\n'
            "[[target.source]]\n"
            'kind = "git"\nurl = "https://example.invalid/sglang.git"\n'
            'commit = "{commit}"\n\n')
    text = (body.format(name="a", label='local_label = "sm120"', commit="a" * 40)
            + body.format(name="b", label="local_label = 'sm120.9'   # raised per rebuild",
                          commit="b" * 40))
    targets = tmp_path / "targets.toml"
    targets.write_text(text)

    assert bump_label(targets, "b") == ("sm120.9", "sm120.10")
    assert targets.read_text() == text.replace("'sm120.9'", "'sm120.10'")
    assert bump_label(targets, "a") == ("sm120", "sm120.1")
    assert load_targets(targets).get("a").local_label == "sm120.1"


def test_bump_keeps_a_multi_line_string_as_one(tmp_path: Path) -> None:
    shutil.copytree(REPO / "patches", tmp_path / "patches")
    targets = tmp_path / "targets.toml"
    text = ('[[target]]\nname = "a"\nupstream_version = "0.5.9"\n'
            'local_label = """sm120.1"""\nseries = "patches/series.toml"\n'
            'cuda_lane = "12.9"\narch_list = ["12.0a"]\n\n[[target.source]]\nkind = "git"\n'
            f'url = "https://example.invalid/sglang.git"\ncommit = "{"a" * 40}"\n')
    targets.write_text(text)
    assert bump_label(targets, "a") == ("sm120.1", "sm120.2")
    assert targets.read_text() == text.replace("sm120.1", "sm120.2")


@pytest.mark.parametrize(("label", "raised"), [("sm120", "sm120.1"), ("sm120.1", "sm120.2"),
                                               ("sm120.cu129.9", "sm120.cu129.10")])
def test_next_label(label: str, raised: str) -> None:
    assert next_label(label) == raised
