"""The command line, one module per command group; :func:`main` runs it."""

from builder.cli.main import main

__all__ = ["main"]
