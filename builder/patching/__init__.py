"""Patch stage: the series applied with fuzz checking and intent checks.

* :mod:`~builder.patching.hunks` -- the hunk matcher (offset, fuzz, GNU patch's rules).
* :mod:`~builder.patching.status` -- the file and patch statuses of a report (one vocabulary).
* :mod:`~builder.patching.patchfile` -- patch files parsed (git and unified diff headers).
* :mod:`~builder.patching.series` -- the series file (``patches/series.toml``).
* :mod:`~builder.patching.intent` -- intent checks: what a patch means, on the tree.
* :mod:`~builder.patching.files` -- one file of a patch decided on a view of the tree.
* :mod:`~builder.patching.apply` -- the series applied all or nothing
  (:func:`~builder.patching.apply.run_patch` for a target).
* :mod:`~builder.patching.refresh` -- patches regenerated against a target.
* :mod:`~builder.patching.matrix` -- the compatibility matrix: series x releases.
"""

from builder.patching.apply import PatchReport, PatchResult, apply_series, run_patch

__all__ = ["PatchReport", "PatchResult", "apply_series", "run_patch"]
