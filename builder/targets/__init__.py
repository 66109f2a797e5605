"""The targets file and the series over upstream releases: the build plan and the upstream
check the CI workflows in ``ci/`` call, pinning a release (``add-target``), the version lock
(``lock``) and the build number (``next-label``).

:func:`~builder.targets.plan.run_plan` turns the targets file into the build matrix;
:func:`~builder.targets.upstream.run_upstream` checks newer upstream releases against the series.
"""

from builder.targets.plan import Plan, run_plan
from builder.targets.upstream import UpstreamReport, run_upstream

__all__ = ["Plan", "UpstreamReport", "run_plan", "run_upstream"]
