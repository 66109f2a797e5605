"""Release stage: wheel -> image -> smoke gate -> publish, never an overwrite.

:mod:`~builder.release.publish` uploads wheels to an index (twine) and pushes images to a
registry; :mod:`~builder.release.run` gates on the smoke test and publishes what passed
(:func:`~builder.release.run.run_release`).
"""

from builder.release.publish import Index
from builder.release.run import ReleaseSummary, gpu_gate, run_release, static_gate

__all__ = ["Index", "ReleaseSummary", "gpu_gate", "run_release", "static_gate"]
