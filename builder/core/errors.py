"""The one error type the builder raises for bad input or a failed stage.

Every stage raises :class:`BuilderError` with a one-line cause and a hint saying what to
do; the CLI prints both and exits non-zero. Anything else escaping a stage is a bug.
"""

from __future__ import annotations

from typing import Any


class BuilderError(Exception):
    """A failure the user can act on.

    Args:
        cause: one line saying what went wrong, naming the file, target or hunk involved.
        hint: one line saying what to do about it (may be empty).
        report: optional detail (for example a :class:`builder.patching.apply.PatchReport`); an
            object with ``to_json()`` is rendered by the CLI and serialised for ``--json``.

    Attributes:
        exit_status: the CLI's exit status for this error (1; the smoke test's own
            ``SmokeFailed`` sets 3 for a misconfigured runner).
    """

    exit_status: int = 1

    def __init__(self, cause: str, hint: str = "", *, report: Any = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.hint = hint
        self.report = report

    def to_json(self) -> dict[str, Any]:
        """Return ``{"error": cause, "hint": hint, "report": ...}`` for ``--json`` output."""
        out: dict[str, Any] = {"error": self.cause, "hint": self.hint}
        if self.report is not None:
            to_json = getattr(self.report, "to_json", None)
            out["report"] = to_json() if callable(to_json) else self.report
        return out
