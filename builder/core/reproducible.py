"""Reproducible archive timestamps, shared by every stage that writes a wheel.

A wheel's bytes depend on its zip entries' dates and on the RECORD ``wheel`` writes; both
come from ``SOURCE_DATE_EPOCH`` (reproducible-builds.org's convention). The kernel stage
packs wheels too, and must not import the wheel stage (and with it the source stage) to
get these two rules.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["record_timestamp", "zip_timestamp"]


def zip_timestamp(epoch: int) -> tuple[int, int, int, int, int, int]:
    """Zip timestamp (UTC) for ``epoch``; zip cannot store dates before 1980."""
    return time.gmtime(max(epoch, 315532800))[:6]


@contextmanager
def record_timestamp(epoch: int) -> Iterator[None]:
    """Set SOURCE_DATE_EPOCH while ``wheel`` writes RECORD (it reads the variable:
    reproducible-builds.org's convention, honoured by ``wheel.wheelfile``).

    This changes the process environment for the duration: not safe with threads.
    """
    saved = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = str(epoch)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["SOURCE_DATE_EPOCH"]
        else:
            os.environ["SOURCE_DATE_EPOCH"] = saved
