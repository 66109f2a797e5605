"""Every status string a patch report's JSON can hold is a member of the one vocabulary
(:mod:`builder.patching.status`), and every file status is reachable.

The statuses are collected, not listed by hand: the real patch cases (the inputs of
tests/patching/test_apply_cases.py, tests/patching/test_patchfile_forms.py with the folders
of tests/cases, and tests/patching/test_intent.py) run in a pytest of their own with
``tests/status_recorder`` on ``PYTHONPATH``, whose start-up hook records the JSON of every
outcome the engine decides, in that run and in the ``python -m builder`` processes it starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from builder.patching.hunks import HunkStatus
from builder.patching.status import FileStatus, PatchStatus
from tests.helpers.paths import TESTS

REPO = TESTS.parent
CASE_FILES = ("patching/test_apply_cases.py", "patching/test_patchfile_forms.py",
              "patching/test_intent.py")


def _record(tmp_path: Path) -> list[dict[str, Any]]:
    """Run the case files with the recorder; return every recorded outcome's JSON."""
    record = tmp_path / "outcomes.jsonl"
    path = os.pathsep.join(p for p in (str(TESTS / "status_recorder"),
                                       os.environ.get("PYTHONPATH", ""), str(REPO)) if p)
    env = {**os.environ, "PYTHONPATH": path, "SGLANG_SM120_STATUS_RECORD": str(record)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--basetemp", str(tmp_path / "run"), *(str(TESTS / name) for name in CASE_FILES)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    # Their own failures are theirs to report (1): the statuses they saw still count.
    assert done.returncode in (0, 1), done.stdout[-4000:] + done.stderr[-2000:]
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_every_status_in_a_report_is_in_the_vocabulary(tmp_path: Path) -> None:
    outcomes = _record(tmp_path)
    assert len(outcomes) > 50, "the recorder saw too few outcomes: is it installed?"
    patches = {o["status"] for o in outcomes}
    files = {f["status"] for o in outcomes for f in o["files"]}
    hunks = {h["status"] for o in outcomes for f in o["files"] for h in f["hunks"]}
    assert patches - set(PatchStatus) == set(), "patch statuses outside PatchStatus"
    assert files - set(FileStatus) == set(), "file statuses outside FileStatus"
    refusals = {s for s in FileStatus if s.refused}
    assert hunks - set(HunkStatus) - refusals == set(), \
        "hunk statuses outside HunkStatus and FileStatus's refusals"
    # The cases reach every file status: none is dead, and a new one needs a case.
    assert set(FileStatus) - files == set(), "file statuses no case produced"
