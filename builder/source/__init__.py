"""Source stage: a target's pinned upstream source, downloaded, verified and unpacked.

An sdist or released wheel found on the package index by its sha256, or a git commit;
:func:`run_fetch` does it for a target and returns a
:class:`~builder.source.fetch.SourceResult` that the patch stage takes.
"""

from builder.source.fetch import SourceResult, fetch_source, local_source, run_fetch

__all__ = ["SourceResult", "fetch_source", "local_source", "run_fetch"]
