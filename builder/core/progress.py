"""Progress display on standard error (rich), silent when asked or not a terminal.

Every line shown goes through :func:`builder.core.address.redact`: an address in it may
carry an index's credentials, shown as ``****`` as pip shows them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING

from builder.core.address import redact

if TYPE_CHECKING:  # rich loads on first print, not at start-up (``targets --json``)
    from rich.console import Console
    from rich.progress import Progress

#: The width results are laid out at on a pipe or file (no table cell is cut).
PIPE_WIDTH = 400
_STEP = re.compile(r"^\[\d+/\d+\]|^\[sm120-builder\]|\berror\b|^FAILED", re.IGNORECASE)


class Reporter:
    """Where stages report progress. ``quiet`` silences everything (``--json`` runs).

    Args:
        quiet: print nothing (``--json``).
        verbose: print every line of a tool's log (compilers), not just its steps.
        progress: with ``quiet``, still print progress on standard error (standard output
            stays for the JSON result).
    """

    def __init__(self, quiet: bool = False, verbose: bool = False,
                 progress: bool = False) -> None:
        self.quiet = quiet
        self.verbose = verbose
        self.progress = progress

    @cached_property
    def console(self) -> Console:
        """The standard-error console (progress, errors), made on first use."""
        from rich.console import Console

        return Console(stderr=True, quiet=self.quiet and not self.progress, highlight=False)

    @cached_property
    def out(self) -> Console:
        """The standard-output console (results), made on first use."""
        import os

        from rich.console import Console

        # Piped, rich assumes 80 columns and cuts table cells (target names) with "…";
        # a pipe has no width, so the result is written at its own width ($COLUMNS wins).
        wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
        return Console(quiet=self.quiet, highlight=False, width=PIPE_WIDTH if wide else None)

    def info(self, message: str) -> None:
        """Print one line of progress on standard error (text is never read as markup)."""
        self.console.print(redact(message), markup=False)

    def detail(self, line: str) -> None:
        """Show one line of a running tool's log as it arrives: every line when verbose,
        else only step lines (ninja's ``[3/12] ...``, the builder's own, errors), cut
        to the terminal's width."""
        line = redact(line)
        if self.verbose:
            self.console.print(line, markup=False, soft_wrap=True)
        elif _STEP.search(line):
            self.console.print(line[:self.console.width - 1], markup=False)

    def raw(self, text: str) -> None:
        """Write text to standard output exactly as given (Markdown, diffs)."""
        if not self.quiet:
            sys.stdout.write(redact(text))
            sys.stdout.flush()

    def result(self, renderable: object, *, style: str | None = None) -> None:
        """Print part of the command's result on standard output (not with ``--json``)."""
        self.out.print(redact(renderable) if isinstance(renderable, str) else renderable,
                       markup=False, style=style)

    @contextmanager
    def download(self, label: str, total: int | None) -> Iterator[Progress]:
        """Yield a byte progress bar (advance it with ``progress.advance(0, n)``)."""
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TransferSpeedColumn,
        )

        progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                            TransferSpeedColumn(), console=self.console,
                            disable=self.quiet, transient=False)
        with progress:
            progress.add_task(redact(label), total=total)
            yield progress

    @contextmanager
    def working(self, label: str) -> Iterator[None]:
        """Show a spinner with the elapsed time while a long step runs."""
        from rich.progress import Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("{task.description}"), TimeElapsedColumn(),
                            console=self.console, disable=self.quiet, transient=True)
        with progress:
            progress.add_task(redact(label), total=None)
            yield
        self.info(f"{label} done")
