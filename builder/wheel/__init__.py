"""Wheel stage: the patched tree built (or a released wheel repacked) as a versioned wheel.

:func:`run_wheels` does it for a target: sdist and git sources are built with the
``build`` API (:mod:`~builder.wheel.build`); a target pinned to released wheels has each
wheel patched and repacked (:mod:`~builder.wheel.repack`).
"""

from builder.wheel.build import WheelResult, build_wheel, run_wheel, run_wheels

__all__ = ["WheelResult", "build_wheel", "run_wheel", "run_wheels"]
