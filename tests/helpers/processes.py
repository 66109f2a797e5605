"""Whether a process the tests started is gone."""

from __future__ import annotations

import os
import time
from pathlib import Path


def left_over(pid: int, seconds: float = 5.0) -> str | None:
    """Wait up to ``seconds`` for process ``pid`` to be gone; what is left of it, if any.

    A zombie whose parent is not this process counts as gone: it has exited, and reaping it
    is its parent's job (PID 1's for an orphan; this machine's reaps only every second or
    two). A zombie of this process's own is left over (a child nobody waited for).

    Args:
        pid: the process id.
        seconds: how long to wait.

    Returns:
        None when it is gone, else ``"state S, parent 1234"`` from ``/proc/PID/stat``.
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return None
        state, parent = fields[0], int(fields[1])
        if state in ("Z", "X") and parent != os.getpid():
            return None
        if time.monotonic() > deadline:
            return f"state {state}, parent {parent}"
        time.sleep(0.05)
