"""What the operator reads is what runs (issue 37): the launch profiles' comments and
``docs/operator.md`` name the FP4 GEMM backend the wheel selects on SM120, read from the
patch series itself, and every profile says for which model size its caps were worked out.

The selection is read from the series, not written here: for each profile's release, the
patch of ``patches/series.toml`` that applies to it and changes
``initialize_fp4_gemm_config`` (``layers/quantization/fp4_utils.py``) adds the line
``backend = "<name>"`` that ``--fp4-gemm-backend auto`` resolves to on SM120 (patch 0005:
``flashinfer_b12x``, with torch's CUDA 13 or newer). A series that changes it changes what
the texts must say.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from builder.patching.series import load_series
from tests.helpers.paths import REPO

PROFILES = sorted((REPO / "images" / "profiles").glob("*.toml"))
OPERATOR = REPO / "docs" / "operator.md"
#: The release docs/operator.md walks through (its title).
OPERATOR_RELEASE = "0.5.23"
_ADDED_BACKEND = re.compile(r'^\+\s+backend = "(\w+)"$', re.MULTILINE)


def fp4_auto_on_sm120(release: str) -> str | None:
    """The FP4 GEMM backend ``auto`` resolves to on SM120 in the patched ``release``, from
    the series (None: no patch of the series changes that resolution for it)."""
    series = load_series(REPO / "patches" / "series.toml")
    found = set()
    for entry in series.entries:
        if not entry.applies_to(Version(release)):
            continue
        text = entry.path.read_text()
        for part in text.split("diff --git ")[1:]:
            if part.split("\n", 1)[0].endswith("layers/quantization/fp4_utils.py"):
                found.update(_ADDED_BACKEND.findall(part))
    assert len(found) <= 1, found
    return found.pop() if found else None


def _comments(path: Path) -> str:
    return " ".join(line.lstrip("# ").rstrip() for line in path.read_text().splitlines()
                    if line.lstrip().startswith("#"))


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_the_profile_names_the_fp4_gemm_backend_the_series_selects(path: Path) -> None:
    release = tomllib.loads(path.read_text())["upstream_version"]
    selected = fp4_auto_on_sm120(release)
    claims = re.findall(r"'auto' (?:is|resolves to|to) (\w+) on SM120", _comments(path))
    if selected is None:
        assert not claims or set(claims) == {"flashinfer_cutlass"}, claims
        return
    assert claims, f"{path.name} says nothing of --fp4-gemm-backend auto on SM120"
    assert set(claims) == {selected}, (path.name, claims, selected)


def test_the_operator_page_names_the_fp4_gemm_backend_the_series_selects() -> None:
    selected = fp4_auto_on_sm120(OPERATOR_RELEASE)
    assert selected == "flashinfer_b12x"  # patch 0005, as the series holds it today
    text = OPERATOR.read_text()
    assert f"# Operator path: from a wheel to a served model on SGLang {OPERATOR_RELEASE}" in text
    row = re.search(r"\| FP4 GEMM backend \(`--fp4-gemm-backend auto`\) \| `(\w+)`", text)
    assert row is not None and row.group(1) == selected
    # no sentence left that names another backend as the one that runs
    others = re.findall(r"FP4 GEMM backend is `(\w+)`", text)
    assert others == [], others


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_every_profile_says_for_which_model_its_caps_were_worked_out(path: Path) -> None:
    comments = _comments(path)
    assert re.search(r"Caps worked out for: \S", comments), path.name
    assert re.search(r"Change them when: \S", comments), path.name
