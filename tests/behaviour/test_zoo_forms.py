"""The checkpoint zoo's forms (builder/behaviour/script/zoo_forms.py; issue 34): enough forms,
each cited, each written and read back as given. Standard library only, no SGLang: what each
release reads from a form is checked by ``zoo_forms.py check`` in the release's environment."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.helpers.paths import REPO

SCRIPT = REPO / "builder" / "behaviour" / "script"
FAMILIES = {"nvfp4", "nvfp4-mixed", "w4a16-nvfp4-mixed", "ct-nvfp4", "nvfp4-clamp",
            "dsv4-nvfp4", "dsa-bf16", "dsa-fp8", "fp8-block", "mxfp4", "w4afp8", "bf16"}


def _zoo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("zoo_forms", SCRIPT / "zoo_forms.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("zoo_forms", module)
    spec.loader.exec_module(module)
    return module


ZOO = _zoo()


def test_the_zoo_has_twenty_forms_with_unique_names_covering_every_family() -> None:
    names = [form.name for form in ZOO.FORMS]
    assert len(names) >= 20
    assert len(set(names)) == len(names)
    assert {form.family for form in ZOO.FORMS} == FAMILIES


@pytest.mark.parametrize("form", ZOO.FORMS, ids=lambda form: form.name)
def test_every_buildable_form_is_cited_and_declares_what_it_reads(form: Any) -> None:
    if not form.buildable:
        assert form.why
        return
    assert form.source and form.stands_for and form.copied
    assert form.config["architectures"] and form.config["model_type"]
    for release in ZOO.RELEASES:
        # Every release the form is in says what quantization it should read (None: bf16).
        assert "*" in form.expected or release in form.expected
    assert form.in_release("0.5.23")
    clamp_fields = {"swiglu_limit", "swiglu_limits"}
    text = form.config.get("text_config", form.config)
    assert form.clamp == bool(clamp_fields & set(text))


def test_releases_specifiers_select_the_releases_that_have_the_architecture() -> None:
    flash = ZOO.BY_NAME["glm-5.3-flash-nvfp4"]
    assert [flash.in_release(r) for r in ZOO.RELEASES] == [False, True, True]
    assert all(ZOO.BY_NAME["deepseek-r1-0528-nvfp4"].in_release(r) for r in ZOO.RELEASES)
    with pytest.raises(ValueError, match="unsupported release clause"):
        ZOO._holds("~=0.5", "0.5.16")


def test_write_round_trips_and_rewrites_only_what_changed(tmp_path: Path) -> None:
    for form in ZOO.FORMS:
        folder = ZOO.write(form, tmp_path)
        assert folder == tmp_path / form.name
        assert json.loads((folder / "config.json").read_text()) == form.config
        quant = folder / "hf_quant_config.json"
        if form.hf_quant_config is None:
            assert not quant.exists()
        else:
            assert json.loads(quant.read_text()) == form.hf_quant_config
    form = ZOO.BY_NAME["deepseek-r1-0528-nvfp4"]
    config = tmp_path / form.name / "config.json"
    before = config.stat().st_mtime_ns
    config.touch()
    touched = config.stat().st_mtime_ns
    ZOO.write(form, tmp_path)
    assert config.stat().st_mtime_ns == touched  # unchanged text: not rewritten
    assert touched >= before
    config.write_text("{}")
    ZOO.write(form, tmp_path)
    assert json.loads(config.read_text()) == form.config  # changed text: rewritten


def test_a_form_that_is_not_buildable_is_refused(tmp_path: Path) -> None:
    import dataclasses

    form = dataclasses.replace(ZOO.FORMS[0], buildable=False, why="no public config")
    with pytest.raises(ValueError, match="not buildable: no public config"):
        ZOO.write(form, tmp_path)
