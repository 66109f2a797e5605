"""Run ``python -m builder ARGS`` and stop it (``SIGSTOP``) at one moment of a file write.

For the ``kill -9`` tests (tests/core/test_userfiles_kill.py): the parent waits for the stop,
then sends ``SIGKILL``, so the kill lands at that moment and no other. The moments are
found with the interpreter's own debugging hooks (PEP 578 audit hooks, ``sys.setprofile``),
not by any switch in the builder: in the folders watched,

* ``write``: a file object's ``write`` is about to run on a file there (a temporary file
  or the user's file itself; the profile hook is armed by the first write-open there);
* ``rename``: ``os.rename``/``os.replace`` is about to move a file into a folder there;
* ``renamed``: the first audit event after such a rename (the rename is done).

Usage: stop_at_write.py LOG STOP WATCHED[:WATCHED...] -- ARGS. Every moment reached is
appended to LOG as a JSON line (kind, path); with STOP = N the process stops at moment N
(counted from 0), with STOP = -1 it runs to the end.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
from pathlib import Path
from typing import Any

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC


class Stopper:
    """The hooks' state: where to stop, what was reached."""

    def __init__(self, log: str, stop: int, watched: list[str]) -> None:
        self.log, self.stop = log, stop
        self.watched = [os.path.realpath(w) for w in watched]
        self.reached = 0
        self.busy = False  # the hooks' own calls raise audit events too
        self.after_rename = False

    def inside(self, path: object) -> str | None:
        if isinstance(path, int) or path is None:
            return None
        real = os.path.realpath(os.fsdecode(path))  # type: ignore[arg-type]
        return real if os.path.dirname(real) in self.watched else None

    def moment(self, kind: str, path: str) -> None:
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, (json.dumps({"kind": kind, "path": path}) + "\n").encode())
        os.close(fd)
        if self.reached == self.stop:
            os.kill(os.getpid(), signal.SIGSTOP)  # the parent kills it here
        self.reached += 1

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.busy:
            return
        self.busy = True
        try:
            if self.after_rename:
                self.after_rename = False
                self.moment("renamed", event)
            if event == "open" and isinstance(args[2], int) and args[2] & _WRITE_FLAGS and \
                    self.inside(args[0]):
                sys.setprofile(self.profile)
            elif event == "os.rename" and (path := self.inside(args[1])):
                self.moment("rename", path)
                self.after_rename = True
        finally:
            self.busy = False

    def profile(self, frame: object, event: str, arg: Any) -> None:
        if self.busy or event != "c_call" or getattr(arg, "__name__", None) != "write":
            return
        self.busy = True
        try:
            fileno = getattr(getattr(arg, "__self__", None), "fileno", None)
            try:
                fd = fileno() if fileno is not None else None
            except (OSError, ValueError):  # an in-memory stream
                fd = None
            target = os.readlink(f"/proc/self/fd/{fd}") if isinstance(fd, int) else ""
            if target.startswith("/") and (path := self.inside(target)):  # not "pipe:[N]"
                self.moment("write", path)
        finally:
            self.busy = False


def main() -> None:
    """Install the hooks and run the builder's CLI as ``python -m builder`` would."""
    log, stop, watched, dash, *args = sys.argv[1:]
    assert dash == "--", "usage: stop_at_write.py LOG STOP WATCHED[:WATCHED...] -- ARGS"
    stopper = Stopper(log, int(stop), watched.split(os.pathsep))
    sys.addaudithook(stopper.audit)
    sys.argv = [str(Path("builder").resolve()), *args]
    runpy.run_module("builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
