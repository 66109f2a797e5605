"""Intent checks: the vocabulary, on small trees written for this project."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder import BuilderError
from builder.patching.apply import PatchStatus, apply_series
from builder.patching.intent import IntentCheck, parse_intent_check
from builder.patching.series import Series, SeriesEntry
from builder.source.fetch import local_source
from tests.helpers.patch_trees import make_tree, series_of

FUNC = '''
def should_tune(args):
    backend = args.moe_runner_backend  # an alias of what is compared
    if backend not in [
        "a",
        # "b",
    ]:
        return False
    return True

OTHER = ["b"]
'''


def check(**table: object) -> IntentCheck:
    return parse_intent_check({"file": "python/m.py", **table}, "test")


def test_literal_contains_is_live_code_only() -> None:
    spec = check(check="literal-contains", function="should_tune",
                 compared_with="moe_runner_backend", value="b")
    outcome = spec.evaluate(FUNC)
    assert not outcome.holds and "not in the literal" in outcome.detail
    assert spec.evaluate(FUNC.replace('# "b",', '"b",')).holds


def test_literal_contains_ignores_lists_compared_with_something_else() -> None:
    spec = check(check="literal-contains", function="should_tune", compared_with="other",
                 value="a")
    assert not spec.evaluate(FUNC).holds


def test_literal_contains_in_an_assignment_and_renamed_functions() -> None:
    assert check(check="literal-contains", assignment="OTHER", value="b").evaluate(FUNC).holds
    renamed = check(check="literal-contains", function=["gone", "should_tune"], value="a")
    assert renamed.evaluate(FUNC).holds
    missing = check(check="literal-contains", function="gone", value="a").evaluate(FUNC)
    assert not missing.holds and "function gone not found" in missing.detail


def test_regex_present_and_absent() -> None:
    assert check(check="regex-present", pattern=r"^OTHER = ").evaluate(FUNC).holds
    absent = check(check="regex-absent", pattern=r"^\s+# \"b\",$").evaluate(FUNC)
    assert not absent.holds and "line 6" in absent.detail


def test_a_file_that_does_not_parse() -> None:
    outcome = check(check="literal-contains", function="f", value="x").evaluate("def f(:\n")
    assert not outcome.holds and "does not parse" in outcome.detail


def _series(tmp_path: Path, patch: str, *intents: dict[str, object]) -> Series:
    (entry,) = series_of(tmp_path, patch).entries
    checks = tuple(parse_intent_check(t, "test") for t in intents)
    return Series(path=None, entries=(SeriesEntry(
        path=entry.path, sha256=None, strip=1, versions=entry.versions, intents=checks),))


def test_patch_whose_intent_already_holds_is_obsolete_and_changes_nothing(tmp_path: Path
                                                                          ) -> None:
    # Upstream enabled "b" its own way (a new line first in the list): the patch's hunk
    # no longer matches, but what it means already holds.
    upstream = FUNC.replace('        "a",\n', '        "b",\n        "a",\n')
    tree = make_tree(tmp_path / "t", {"python/m.py": upstream})
    patch = ('--- a/python/m.py\n+++ b/python/m.py\n@@ -4,5 +4,5 @@\n     if backend not in [\n'
             '         "a",\n-        # "b",\n+        "b",\n     ]:\n         return False\n')
    before = (tree / "python/m.py").read_text()
    result = apply_series(local_source(tree, "1.0"), _series(
        tmp_path, patch, {"check": "literal-contains", "file": "python/*.py",
                          "function": "should_tune", "value": "b"}), in_place=True)
    assert result.report.patches[0].status == PatchStatus.OBSOLETE
    assert (tree / "python/m.py").read_text() == before


def test_intent_over_a_file_pattern(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"python/pkg/a.py": "X = 1\n", "python/pkg/sub/b.py": FUNC})
    series = _series(tmp_path, "--- a/python/pkg/a.py\n+++ b/python/pkg/a.py\n@@ -1 +1 @@\n"
                               "-X = 1\n+X = 2\n",
                     {"check": "regex-present", "file": "python/pkg/*.py", "pattern": "^X = 2"},
                     {"check": "regex-absent", "file": "python/pkg/*.py", "pattern": "TODO"})
    result = apply_series(local_source(tree, "1.0"), series, in_place=True)
    assert [i.holds for i in result.report.intents] == [True, True]
    assert "python/pkg/a.py" in result.report.intents[0].detail


def test_failing_intent_refuses_and_writes_nothing(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"python/m.py": FUNC})
    patch = ('--- a/python/m.py\n+++ b/python/m.py\n@@ -4,5 +4,5 @@\n     if backend not in [\n'
             '         "a",\n-        # "b",\n+        # "b",  (enabled)\n     ]:\n'
             '         return False\n')
    before = (tree / "python/m.py").read_text()
    with pytest.raises(BuilderError, match=r"intent check of 0001-case\.patch failed"):
        apply_series(local_source(tree, "1.0"), _series(
            tmp_path, patch, {"check": "literal-contains", "file": "python/m.py",
                              "function": "should_tune", "value": "b"}), in_place=True)
    assert (tree / "python/m.py").read_text() == before
