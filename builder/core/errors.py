"""The errors the builder raises, one type per audience and exit status.

Every refusal or failure is a :class:`BuilderError` with a one-line cause and a hint saying
what to do; the CLI prints both and exits with the error's :attr:`~BuilderError.exit_status`.
Anything else escaping a stage is a bug. The subclasses say who has to act, as
cibuildwheel's errors do (``cibuildwheel.errors``, 2.x: one class per exit code):

============================ ====== ========================================================
error                        status who acts
============================ ====== ========================================================
:class:`VerificationError`   1      nobody may trust it: a check did not hold. An answer
                                    that arrived (a download, registry manifest, index page,
                                    METADATA, archive, the smoke probe's output) is not what
                                    it claims or what the pin says (its shape, identity or
                                    size), or ``pin-images --verify`` found a moved pin. Not
                                    worth a retry, unlike 4; pip 26.3 exits 1 on a
                                    ``--require-hashes`` mismatch too
:class:`ConfigurationError`  2      the user: a flag, ``targets.toml``, ``series.toml``, a
                                    profile or request file is wrong (argparse uses 2 too)
:class:`MissingToolError`    3      the machine: a tool, service or GPU runtime is missing
                                    or misconfigured (nvcc, a Docker Engine, the NVIDIA
                                    runtime); the input is fine
:class:`SourceError`         4      upstream: what the pin names cannot be had (the host is
                                    unreachable, refuses, answers an HTTP error, or lists no
                                    such file, tag or commit); a retry may help
:class:`PatchError`          5      the series: a patch does not apply or its intent fails
:class:`BuildError`          6      a build (wheel, kernels, image) ran and failed
:class:`PublishError`        7      a registry or index refused, or a gate did not open
============================ ====== ========================================================

:class:`BuilderError` itself (status 1) is the base; the smoke test's failure is one with its
report's status (1 failed, 3 misconfigured runner).
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "EXIT_STATUSES",
    "BuildError",
    "BuilderError",
    "ConfigurationError",
    "MissingToolError",
    "PatchError",
    "PublishError",
    "SourceError",
    "VerificationError",
]


class BuilderError(Exception):
    """A failure the user can act on.

    Args:
        cause: one line saying what went wrong, naming the file, target or hunk involved.
        hint: one line saying what to do about it (may be empty).
        report: optional detail (for example a :class:`builder.patching.apply.PatchReport`); an
            object with ``to_json()`` is serialised for ``--json``, one with ``lines()`` is
            printed above the cause.

    Attributes:
        exit_status: the CLI's exit status for this error (a class attribute; the smoke
            test's ``SmokeFailed`` sets its report's status: 1 failed, 3 misconfigured).
        kind: the word the CLI prints before the cause (``error``, ``configuration error``).
    """

    exit_status: int = 1
    kind: ClassVar[str] = "error"

    def __init__(self, cause: str, hint: str = "", *, report: Any = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.hint = hint
        self.report = report

    def replaced(self, *, cause: str | None = None, hint: str | None = None,
                 report: Any = None) -> BuilderError:
        """Return this error with another cause, hint or report, of the same type and status.

        Args:
            cause: the new cause (``None`` keeps this one), e.g. with the entry it concerns.
            hint: the new hint (``None`` keeps this one).
            report: the new report (``None`` keeps this one).

        Returns:
            A new error; this one is unchanged.
        """
        new = type(self).__new__(type(self))  # no __init__: subclasses take other arguments
        new.__dict__.update(self.__dict__)
        new.args = self.args
        if cause is not None:
            new.cause = cause
            new.args = (cause,)
        if hint is not None:
            new.hint = hint
        if report is not None:
            new.report = report
        return new

    def to_json(self) -> dict[str, Any]:
        """Return ``{"error", "hint", "kind", "exit_status"}`` and ``report`` for ``--json``."""
        out: dict[str, Any] = {"error": self.cause, "hint": self.hint, "kind": self.kind,
                               "exit_status": self.exit_status}
        if self.report is not None:
            to_json = getattr(self.report, "to_json", None)
            out["report"] = to_json() if callable(to_json) else self.report
        return out


class VerificationError(BuilderError):
    """A check did not hold: an answer's shape, identity or size, or a pin (exit 1).

    Raised where something arrived and is not what it claims to be or what its pin says (a
    sha256 or digest that differs, a malformed manifest, index page, METADATA or archive, an
    oversized answer), and by ``pin-images --verify`` when a tag moved. Unlike a
    :class:`SourceError`, trying again will not help: someone has to look.
    """

    exit_status = 1
    kind = "verification failed"


class ConfigurationError(BuilderError):
    """The user's input is wrong: a flag, a targets, series, profile or request file (exit 2)."""

    exit_status = 2
    kind = "configuration error"


class MissingToolError(BuilderError):
    """This machine lacks a tool, service or GPU runtime the step needs (exit 3)."""

    exit_status = 3
    kind = "missing tool"


class SourceError(BuilderError):
    """What a pin names cannot be had: unreachable, refused, an HTTP error, not listed (exit 4)."""

    exit_status = 4
    kind = "source error"


class PatchError(BuilderError):
    """The patch series does not apply, or a patch's intent check fails (exit 5)."""

    exit_status = 5
    kind = "patch error"


class BuildError(BuilderError):
    """A build ran and failed: the wheel, the kernels or the image (exit 6)."""

    exit_status = 6
    kind = "build error"


class PublishError(BuilderError):
    """A registry or index refused an upload, or a release gate did not open (exit 7)."""

    exit_status = 7
    kind = "publish error"


#: The CLI's exit statuses, the one copy: ``--help``'s epilog
#: (:func:`exit_status_text`) and ``docs/pipeline.md`` (:func:`exit_status_markdown`,
#: compared by ``tests/cli/test_layout.py``) are rendered from it. Each row is
#: ``(status, meaning)``; 1 to 7 are the error types' :attr:`BuilderError.exit_status`.
EXIT_STATUSES: tuple[tuple[str, str], ...] = (
    ("0", "ok"),
    ("1", "failed: a check did not hold (the smoke test's, a moved pin in "
          "`pin-images --verify`, or an answer's shape, identity or size: a sha256 or digest "
          "that differs, a malformed manifest, index page, METADATA or archive)"),
    ("2", "bad input (a flag, `targets.toml`, a series, profile or request file)"),
    ("3", "a missing tool or misconfigured runner (nvcc, a Docker Engine, the NVIDIA "
          "runtime)"),
    ("4", "source unavailable (unreachable, refused, an HTTP error, no such file, tag or "
          "commit: a retry may help)"),
    ("5", "patch"),
    ("6", "build"),
    ("7", "publish"),
    ("130/143", "interrupted (Ctrl-C / SIGTERM)"),
    ("141", "the reader of `--json` output left (a closed pipe: 128 + SIGPIPE)"),
)


def exit_status_text() -> str:
    """:data:`EXIT_STATUSES` as ``--help`` shows them: one line per status, wrapped."""
    import textwrap

    lines = ["exit status:"]
    for status, meaning in EXIT_STATUSES:
        lines += textwrap.wrap(meaning.replace("`", ""), 88, initial_indent=f"  {status:9}",
                               subsequent_indent=" " * 11)
    return "\n".join(lines) + "\n"


def exit_status_markdown() -> str:
    """:data:`EXIT_STATUSES` as the Markdown table of ``docs/pipeline.md``."""
    rows = ["| exit status | meaning |", "| --- | --- |"]
    rows += [f"| {status} | {meaning} |" for status, meaning in EXIT_STATUSES]
    return "\n".join(rows) + "\n"
