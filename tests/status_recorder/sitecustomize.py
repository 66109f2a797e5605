"""Record every patch outcome the engine decides, for ``tests/patching/test_status.py``.

That test puts this folder first on ``PYTHONPATH`` of a pytest run, so Python imports
this module at start-up in that run and in every process it starts (``python -m builder``
of the CLI tests). It does nothing unless ``SGLANG_SM120_STATUS_RECORD`` names a file;
then a profile hook watches :func:`builder.patching.apply.replay_series` (every apply,
plan, refresh and matrix goes through it) return, and appends each outcome's
``to_json()`` to that file, one JSON document a line. It only observes: nothing of the
engine is replaced.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from types import FrameType
from typing import Any

RECORD = os.environ.get("SGLANG_SM120_STATUS_RECORD")


def _hook(frame: FrameType, event: str, arg: Any) -> None:
    if event != "return" or arg is None or frame.f_code.co_name != "replay_series" or \
            frame.f_globals.get("__name__") != "builder.patching.apply":
        return
    steps, _view = arg
    data = "".join(json.dumps(getattr(step, "outcome", step).to_json()) + "\n"
                   for step in steps)
    assert RECORD is not None
    # One write with O_APPEND: the processes of one run share the file.
    fd = os.open(RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


if RECORD:
    sys.setprofile(_hook)
    threading.setprofile(_hook)
