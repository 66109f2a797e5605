"""The documentation: the site builds with no warning, and the README's links lead somewhere.

The site is built with ``mkdocs build --strict`` as ``nox -s docs`` does, into a temporary
folder; MkDocs' own validation (``mkdocs.yml``: ``validation``) turns a link to a missing page
or anchor, or a page left out of ``nav``, into a warning, and the docs' griffe extension
(``docs/_ext/sphinx_roles.py``) turns a docstring cross-reference that names nothing in
``builder`` into one; strict mode fails on any.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.cli.main import build_parser
from tests.helpers.paths import REPO

ROOT = REPO

# a Markdown link's target: [text](target) or [text](target "title"); images too
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the project at ``root`` into ``site``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(root / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)


def _warnings(output: str) -> list[str]:
    return [line for line in output.splitlines() if re.match(r"(WARNING|ERROR)\b", line)]


@pytest.mark.slow(reason="builds the site")
def test_site_builds_with_no_warning(tmp_path: Path) -> None:
    result = _mkdocs_build(ROOT, tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert _warnings(output) == [], output
    # the API pages were generated from the docstrings, the roles turned into links
    core = (tmp_path / "site" / "reference" / "api" / "core" / "index.html").read_text()
    assert 'id="builder.core.errors.BuilderError"' in core
    home = (tmp_path / "site" / "index.html").read_text()
    assert "Nothing has run on SM120 hardware" in home  # README's section, included
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert ":func:" not in api and 'href="source/#builder.source.fetch.run_fetch"' in api


def _copy_project(dest: Path) -> Path:
    dest.mkdir()
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("docs", "builder"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    return dest


@pytest.mark.slow(reason="builds the site twice")
def test_broken_link_and_reference_fail_the_build(tmp_path: Path) -> None:
    """The same build over a copy with a broken page link, a broken anchor and a docstring
    role naming nothing fails, naming each."""
    project = _copy_project(tmp_path / "project")
    page = project / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [the matcher](hunk-matcher.md) and "
                    "[the statuses](patches.md#no-such-section).\n")
    init = project / "builder" / "__init__.py"
    text = init.read_text()
    init.write_text(text.replace(":func:`load_targets`", ":func:`load_targetss`", 1))
    assert init.read_text() != text

    result = _mkdocs_build(project, tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    warnings = "\n".join(_warnings(output))
    assert "hunk-matcher.md" in warnings, output
    assert "no-such-section" in warnings, output
    assert "load_targetss" in warnings, output


def _commands() -> list[str]:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return list(actions[0].choices)


def test_command_reference_names_every_command() -> None:
    """Every command ``python -m builder --help`` lists has a row in docs/reference/cli.md
    (the table is kept by hand: no well-kept MkDocs plugin renders argparse parsers)."""
    help_text = subprocess.run([sys.executable, "-m", "builder", "--help"], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)},
                               capture_output=True, text=True, check=True).stdout
    commands = _commands()
    assert len(commands) >= 13
    for command in commands:  # the parser's commands are the ones --help shows
        assert re.search(rf"^\s+{re.escape(command)}\b", help_text, re.MULTILINE), command
    table = (ROOT / "docs" / "reference" / "cli.md").read_text()
    rows = {m.group(1) for m in re.finditer(r"^\| `([a-z-]+)[ `]", table, re.MULTILINE)}
    assert sorted(set(commands) - rows) == []


def _slug(heading: str) -> str:
    """GitHub's and MkDocs' anchor for a heading: lower case, punctuation dropped,
    spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(markdown: Path) -> set[str]:
    return {_slug(m.group(1)) for m in
            re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", markdown.read_text(), re.MULTILINE)}


@pytest.mark.parametrize("document", ["README.md"])
def test_readme_links_lead_to_files_and_headings(document: str) -> None:
    """The README is read on the repository page and on PyPI, outside the site's build: its
    relative links are checked here."""
    source = ROOT / document
    assert len(source.read_text().splitlines()) <= 250  # a front door; the rest is in docs/
    links = [m.group(1) for m in _LINK.finditer(source.read_text())]
    relative = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert len(relative) >= 10
    broken = []
    for link in relative:
        path, _, anchor = link.partition("#")
        target = (source.parent / path).resolve() if path else source
        missing_anchor = bool(anchor) and target.exists() and (
            target.suffix != ".md" or anchor not in _anchors(target))
        if not target.exists() or missing_anchor:
            broken.append(link)
    assert broken == []


def test_slug_matches_the_site() -> None:
    assert _slug("Pinning a new release") == "pinning-a-new-release"
    assert _slug("Smoke test on a GPU runner: `smoke`") == "smoke-test-on-a-gpu-runner-smoke"


# a repository path in code spans: `builder/smoke/probe.py`, `ci/*.yml`, `reports/…/`
_PATH = re.compile(r"`((?:builder|tests|images|ci|patches|reports|benchmarks|docs|\.ci)/[^`\s]*)`")


def test_paths_named_in_the_docs_exist() -> None:
    """Every repository path the README and the pages name (in code) exists, so a module
    that moves cannot leave its old path in the docs."""
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {(doc.relative_to(ROOT).as_posix(), m.group(1))
             for doc in documents for m in _PATH.finditer(doc.read_text())}
    assert len(named) >= 40
    missing = sorted((doc, path) for doc, path in named if not list(ROOT.glob(path.rstrip("/"))))
    assert missing == []


def test_every_test_a_promise_names_is_in_the_file_it_names() -> None:
    """docs/promises.md says which tests hold each promise: each name is a test function
    of one of the files its bullet names, so a renamed or deleted test fails here."""
    text = (ROOT / "docs" / "promises.md").read_text()
    bullets = re.split(r"\n(?=- |## )", text)
    checked = 0
    for bullet in bullets:
        files = re.findall(r"`(tests/[\w/]+\.py)`", bullet)
        names = re.findall(r"(?<![/\w])(test_\w+)\b(?!\.py)", bullet)
        if not names:
            continue
        assert files, f"a promise names tests but no file: {bullet[:80]!r}"
        sources = [(ROOT / f).read_text() for f in files if (ROOT / f).is_file()]
        assert len(sources) == len(files), f"a promise names a missing file: {files}"
        for name in names:
            assert any(re.search(rf"^def {name}\(", s, re.M) for s in sources), \
                f"docs/promises.md names {name}, which none of {files} defines"
            checked += 1
    assert checked > 20
