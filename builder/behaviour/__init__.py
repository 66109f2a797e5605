"""The behaviour stage: every SM12x patch's behaviours, run on the release's own code.

:func:`run_behaviour` installs the target's release with its pinned dependencies on a CPU
torch (:mod:`builder.behaviour.env`), reports the device as an SM120 GPU, and runs the
series' declared behaviours (``[[patch.behaviour]]`` in ``patches/series.toml``) on
upstream's code and on the patched code; :class:`BehaviourReport` says which are proven.
``script/`` holds what runs inside that environment (standard library, torch, sglang).
"""

from builder.behaviour.run import BehaviourReport, BehaviourResult, run_behaviour

__all__ = ["BehaviourReport", "BehaviourResult", "run_behaviour"]
