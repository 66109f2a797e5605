"""What the operator reads is what runs (issue 37): the launch profiles' comments and
``docs/operator.md`` name the backends the wheel selects on SM120 and what of them compiles
at first use, read from the patch series itself, and every profile says for which model
size its caps were worked out.

The selection is read from the series, not written here; for each profile's release, from
the entries of ``patches/series.toml`` that apply to it:

- FP4 GEMM: the patch that changes ``initialize_fp4_gemm_config``
  (``layers/quantization/fp4_utils.py``) adds the line ``backend = "<name>"`` that
  ``--fp4-gemm-backend auto`` resolves to on SM120 (patch 0005: ``flashinfer_b12x``, with
  torch's CUDA 13 or newer); its header's ``Kernels:`` line says how that kernel is built
  (b12x: CuTe DSL, compiled at first use by nvidia-cutlass-dsl).
- MoE runner: the ``resolve`` behaviour the series proves on SM120 (capability 12.0) for
  ``--moe-runner-backend auto`` (patch 0002: ``flashinfer_cutlass``).
- DSA prefill / decode: the patch adds ``declared["dsa_..._backend"] = "<name>"`` (patch
  0003: ``tilelang``); a ``resolve`` behaviour of that patch that expects ``refused`` on
  SM120 for an automatic KV cache means the release refuses DSA models at start-up (0.5.16,
  whose pinned DeepGEMM has no SM120 paged MQA logits kernels). The patch's
  ``[[kernel_fit]]`` declarations are the kernels that backend's dispatch picks and that
  are compiled for sm_120 (``builder/behaviour/fit.py``): they compile at first use on
  the operator's GPU, unless the JIT cache artifact ships them (a framework of
  ``builder.kernels.jit_caches.FRAMEWORKS``).

A series that changes any of these changes what the texts must say.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

from builder.kernels.jit_caches import FRAMEWORKS
from builder.patching.series import Behaviour, Series, SeriesEntry, load_series
from tests.helpers.paths import REPO

PROFILES = sorted((REPO / "images" / "profiles").glob("*.toml"))
OPERATOR = REPO / "docs" / "operator.md"
#: The release docs/operator.md walks through (its title).
OPERATOR_RELEASE = "0.5.23"
#: The device the profiles are for: SM120 (RTX PRO 6000 Blackwell, RTX 5090).
SM120 = (12, 0)
_ADDED_BACKEND = re.compile(r'^\+\s+backend = "(\w+)"$', re.MULTILINE)
_ADDED_DSA = re.compile(r'^\+\s+declared\["dsa_(?:prefill|decode)_backend"\] = "(\w+)"$',
                        re.MULTILINE)
#: A patch header's word on how the kernel it selects is built.
_HEADER_KERNELS = re.compile(r"^Kernels: (\w+) is ([\w ]+?), compiled at first use by "
                             r"([\w.-]+)", re.MULTILINE)
#: The profiles' claims, in their comments.
_MOE_CLAIM = re.compile(r"[Pp]atch 0002 resolves 'auto' to (\w+)")
_DSA_CLAIM = re.compile(r"[Pp]atch 0003 sends (?:the other )?DSA models(?: on SM12x)? to (\w+)")
_FIRST_USE_CLAIM = re.compile(r"\b(\w+)(?:'s DSA kernels are| is an?) ([A-Z][\w ]*?) kernels? "
                              r"(?:that ([\w.-]+) compiles? |compiled )at first use")
_REFUSED = "refuses them at start-up"
_SHIPPED = "JIT cache artifact"


@functools.cache
def _series() -> Series:
    return load_series(REPO / "patches" / "series.toml")


def _entries(release: str) -> list[SeriesEntry]:
    return [e for e in _series().entries if e.applies_to(Version(release))]


def _behaviours(entry: SeriesEntry, release: str) -> Iterator[Behaviour]:
    """``entry``'s ``resolve`` behaviours checked on ``release`` with the device SM120."""
    for behaviour in entry.behaviours:
        if behaviour.versions is not None and Version(release) not in behaviour.versions:
            continue
        if behaviour.check == "resolve" and SM120 in behaviour.capabilities:
            yield behaviour


def _fp4_entries(release: str) -> list[tuple[SeriesEntry, str]]:
    found = []
    for entry in _entries(release):
        for part in entry.path.read_text().split("diff --git ")[1:]:
            if part.split("\n", 1)[0].endswith("layers/quantization/fp4_utils.py"):
                found += [(entry, name) for name in _ADDED_BACKEND.findall(part)]
    return found


def fp4_auto_on_sm120(release: str) -> str | None:
    """The FP4 GEMM backend ``auto`` resolves to on SM120 in the patched ``release``, from
    the series (None: no patch of the series changes that resolution for it)."""
    found = {name for _, name in _fp4_entries(release)}
    assert len(found) <= 1, found
    return found.pop() if found else None


def moe_auto_on_sm120(release: str) -> str | None:
    """The MoE runner ``--moe-runner-backend auto`` resolves to on SM120 for the patched
    ``release``, as the series' behaviours prove it (None: no behaviour says)."""
    found = {value for entry in _entries(release) for b in _behaviours(entry, release)
             if all(dict(case.args).get("moe_runner_backend") == "auto" for case in b.cases)
             for key, value in b.expect if key == "moe_runner_backend"}
    assert len(found) <= 1, found
    return found.pop() if found else None


def dsa_on_sm12x(release: str) -> tuple[str | None, bool, bool]:
    """The DSA prefill/decode backend the patched ``release`` selects on SM12x when the
    user sets none, whether it refuses DSA models at start-up (automatic KV cache), and
    whether the series declares the kernels that backend picks (``[[kernel_fit]]``)."""
    found: dict[str, SeriesEntry] = {}
    for entry in _entries(release):
        found.update((name, entry) for name in _ADDED_DSA.findall(entry.path.read_text()))
    assert len(found) <= 1, found
    if not found:
        return None, False, False
    ((backend, entry),) = found.items()
    refused = False
    for behaviour in _behaviours(entry, release):
        expect = dict(behaviour.expect)
        automatic = any(dict(c.args).get("kv_cache_dtype", "auto") == "auto"
                        for c in behaviour.cases)
        if expect.get("refused") is True and automatic:
            refused = True
        for key in ("dsa_prefill_backend", "dsa_decode_backend"):
            # what the behaviour stage proves agrees with what the patch adds
            assert expect.get(key, backend) == backend, (behaviour.name, expect)
    fits = [f for f in entry.kernel_fits
            if f.versions is None or Version(release) in f.versions]
    # each declared dispatch is the backend's own kernel module (tilelang_kernel.py)
    assert all(f.module.rsplit(".", 1)[-1].startswith(backend) for f in fits), fits
    return backend, refused, bool(fits)


def first_use_on_sm120(release: str) -> dict[str, tuple[str, str | None]]:
    """What the selected backends compile at first use on SM120: kernel name ->
    (framework, compiler or None), from the series."""
    found: dict[str, tuple[str, str | None]] = {}
    for entry, backend in _fp4_entries(release):
        for name, framework, compiler in _HEADER_KERNELS.findall(entry.path.read_text()):
            assert backend.endswith(f"_{name}"), (entry.name, backend, name)
            found[name] = (framework, compiler)
    backend, _, fits = dsa_on_sm12x(release)
    if backend is not None and fits:
        found[backend] = (backend, None)  # the backend is its framework (TileLang)
    return found


def _framework(name: str) -> str:
    """``TileLang`` -> ``tilelang``, ``CuTe DSL`` -> ``cutedsl``."""
    return name.lower().replace(" ", "")


def _comments(path: Path) -> str:
    return " ".join(line.lstrip("# ").rstrip() for line in path.read_text().splitlines()
                    if line.lstrip().startswith("#"))


def _sentence(text: str, match: re.Match[str]) -> str:
    """The sentence ``match`` starts in, from the match to its full stop."""
    return text[match.start():].split(". ", 1)[0]


def _release(path: Path) -> str:
    return str(tomllib.loads(path.read_text())["upstream_version"])


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_the_profile_names_the_fp4_gemm_backend_the_series_selects(path: Path) -> None:
    selected = fp4_auto_on_sm120(_release(path))
    claims = re.findall(r"'auto' (?:is|resolves to|to) (\w+) on SM120", _comments(path))
    if selected is None:
        assert not claims or set(claims) == {"flashinfer_cutlass"}, claims
        return
    assert claims, f"{path.name} says nothing of --fp4-gemm-backend auto on SM120"
    assert set(claims) == {selected}, (path.name, claims, selected)


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_the_profile_names_the_moe_runner_the_series_selects(path: Path) -> None:
    profile = tomllib.loads(path.read_text())
    selected = moe_auto_on_sm120(_release(path))
    claims = _MOE_CLAIM.findall(_comments(path))
    if selected is None:
        assert not claims, (path.name, claims)
        return
    assert claims, f"{path.name} says nothing of --moe-runner-backend auto on SM12x"
    assert set(claims) == {selected}, (path.name, claims, selected)
    # a runner the profile names itself is the one the release would select
    named = profile["args"].get("--moe-runner-backend", selected)
    assert named == selected, (path.name, named, selected)


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_the_profile_names_the_dsa_backend_the_series_selects(path: Path) -> None:
    backend, refused, _ = dsa_on_sm12x(_release(path))
    text = _comments(path)
    claims = list(_DSA_CLAIM.finditer(text))
    if backend is None:
        assert not claims, (path.name, [m.group(0) for m in claims])
        return
    assert claims, f"{path.name} says nothing of the DSA backends on SM12x"
    assert {m.group(1) for m in claims} == {backend}, (path.name, backend)
    for claim in claims:  # the release's refusal at start-up is said where it refuses
        assert (_REFUSED in _sentence(text, claim)) == refused, (path.name, refused)


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_the_profile_says_what_the_selected_backends_compile_at_first_use(
        path: Path) -> None:
    truth = first_use_on_sm120(_release(path))
    text = _comments(path)
    claims = {m.group(1): m for m in _FIRST_USE_CLAIM.finditer(text)}
    assert set(claims) == set(truth), (path.name, sorted(claims), sorted(truth))
    for name, (framework, compiler) in truth.items():
        claim = claims[name]
        assert _framework(claim.group(2)) == _framework(framework), (path.name, claim[0])
        assert claim.group(3) in (None, compiler), (path.name, claim[0], compiler)
        # "unless the JIT cache artifact ships them" only where it can
        shipped = _framework(framework) in FRAMEWORKS
        assert (_SHIPPED in _sentence(text, claim)) == shipped, (path.name, claim[0])


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_the_operator_sections_a_profile_cites_exist(path: Path) -> None:
    headings = {re.sub(r"^\d+\.\s*", "", line.lstrip("#").strip())
                for line in OPERATOR.read_text().splitlines() if line.startswith("#")}
    for cited in re.findall(r'docs/operator\.md, "([^"]+)"', _comments(path)):
        assert cited in headings, (path.name, cited)


def test_the_operator_page_names_the_backends_the_series_selects() -> None:
    selected = fp4_auto_on_sm120(OPERATOR_RELEASE)
    assert selected == "flashinfer_b12x"  # patch 0005, as the series holds it today
    text = OPERATOR.read_text()
    assert f"# Operator path: from a wheel to a served model on SGLang {OPERATOR_RELEASE}" in text
    row = re.search(r"\| FP4 GEMM backend \(`--fp4-gemm-backend auto`\) \| `(\w+)`", text)
    assert row is not None and row.group(1) == selected
    # no sentence left that names another backend as the one that runs
    others = re.findall(r"FP4 GEMM backend is `(\w+)`", text)
    assert others == [], others
    moe = re.search(r"\| MoE runner \(NVFP4 MoE, `auto`\) \| `(\w+)` \(patch 0002\)", text)
    assert moe is not None and moe.group(1) == moe_auto_on_sm120(OPERATOR_RELEASE)
    backend, refused, _ = dsa_on_sm12x(OPERATOR_RELEASE)
    dsa = re.search(r"\| DSA prefill / decode \([^|]*\) \| `(\w+)` \(patch 0003\)([^|]*)\|",
                    text)
    assert dsa is not None and dsa.group(1) == backend
    assert ("refuse" in dsa.group(2)) == refused


def test_the_operator_page_says_what_the_selected_backends_compile_at_first_use() -> None:
    truth = first_use_on_sm120(OPERATOR_RELEASE)
    text = OPERATOR.read_text()
    section = text[text.index("## 7. What compiles and tunes at first start"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    rows = {m.group(1): m for m in re.finditer(
        r"^\| [^|`]*`(\w+)` \([^|]*\) \| compiled at first use by ([\w.-]+)([^|]*)\|",
        section, re.MULTILINE)}
    fp4 = fp4_auto_on_sm120(OPERATOR_RELEASE)
    backend, _, _ = dsa_on_sm12x(OPERATOR_RELEASE)
    assert fp4 is not None and backend is not None
    # the rows name the backends by their selection names; the series, by kernel names
    names = {fp4: fp4.split("_", 1)[1], backend: backend}
    assert {names.get(row) for row in rows} == set(truth), (sorted(rows), sorted(truth))
    for row, match in rows.items():
        framework, compiler = truth[names[row]]
        assert _framework(match.group(2)) == _framework(compiler or framework), match[0]
        assert (_SHIPPED in match.group(3)) == (_framework(framework) in FRAMEWORKS), row


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_every_profile_says_for_which_model_its_caps_were_worked_out(path: Path) -> None:
    comments = _comments(path)
    assert re.search(r"Caps worked out for: \S", comments), path.name
    assert re.search(r"Change them when: \S", comments), path.name
