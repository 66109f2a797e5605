"""The hunk search: the same places as testing every line, in linear time.

A hypothesis property compares the search (``_occurrences``) with testing each place line
by line (``_matches``, the definition), over small alphabets where windows repeat and
overlap; and the worst failing search we constructed (benchmarks/bench_hunk_search.py)
costs at most a small multiple of GNU patch's time on the same input.
"""

from __future__ import annotations

import importlib.util
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from builder.patching.hunks import _matches, _occurrences
from tests.helpers.paths import REPO

LINES = st.lists(st.sampled_from(["a\n", "b\n", "c\n", "a"]), max_size=40)
# Two lines only: windows that repeat and overlap themselves are common.
NARROW = st.lists(st.sampled_from(["a\n", "b\n"]), max_size=8)


@settings(max_examples=500, deadline=None)
@given(lines=LINES | st.lists(st.just("a\n"), max_size=30), pattern=NARROW,
       skip_front=st.integers(0, 3), skip_back=st.integers(0, 3), low=st.integers(1, 45),
       high=st.integers(-2, 45))
def test_the_search_finds_exactly_the_places_that_match(
        lines: list[str], pattern: list[str], skip_front: int, skip_back: int, low: int,
        high: int) -> None:
    skip_back = min(skip_back, max(len(pattern) - skip_front, 0))
    high = min(high, len(lines) - (len(pattern) - skip_back) + 1)
    expected = [w for w in range(low, high + 1)
                if _matches(lines, pattern, w, skip_front, skip_back)]
    window = pattern[skip_front:len(pattern) - skip_back]
    assert _occurrences(lines, window, low, high, skip_front) == expected


def test_the_worst_failing_search_costs_a_small_multiple_of_gnu_patch() -> None:
    spec = importlib.util.spec_from_file_location("bench_hunk_search",
                                                  REPO / "benchmarks/bench_hunk_search.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = sys.argv
    sys.argv = ["bench", "--lines", "20000", "--context", "200", "--rounds", "3", "--json"]
    try:
        import contextlib
        import io
        import json

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert bench.main() == 0
    finally:
        sys.argv = argv
    figures = json.loads(out.getvalue())
    assert figures["ratio"] < 5, figures
