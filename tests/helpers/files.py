"""File trees for the tests' own caches."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def hardlink_tree(source: Path, destination: Path) -> None:
    """``source`` at another path: hard links (no disk), copies across file systems. For
    a cache of a test's own that starts with the shared cache's big entries."""
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, destination, symlinks=True, copy_function=link)
