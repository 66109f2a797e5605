"""The one place that maps repository paths to paths inside a source tree.

Patches and intent checks name files as in the git repository (``python/sglang/...``).
An sdist (and a released wheel) holds only the repository's ``python/`` folder, so in an
sdist tree ``python/sglang/x.py`` is ``sglang/x.py`` and a path outside ``python/`` does
not exist there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from builder.core.errors import ConfigurationError

PACKAGE_FOLDER = "python"  # the repository folder that holds SGLang's pyproject.toml


@dataclass(frozen=True)
class Layout:
    """How a tree relates to the repository.

    Attributes:
        kind: ``git`` (the tree is the repository root) or ``sdist`` (the tree is the
            repository's ``python/`` folder).
    """

    kind: Literal["git", "sdist"]

    def tree_path(self, repo_path: str) -> str | None:
        """Map a repository path to a path relative to the tree; ``None`` if absent there."""
        if self.kind == "git":
            return repo_path
        prefix = PACKAGE_FOLDER + "/"
        return repo_path[len(prefix):] if repo_path.startswith(prefix) else None

    def repo_path(self, tree_path: str) -> str:
        """Map a path relative to the tree back to the repository path."""
        return tree_path if self.kind == "git" else f"{PACKAGE_FOLDER}/{tree_path}"

    def package_root(self, tree: Path) -> Path:
        """Return the folder holding ``pyproject.toml`` (what the wheel is built from)."""
        return tree / PACKAGE_FOLDER if self.kind == "git" else tree

    @staticmethod
    def detect(tree: Path) -> Layout:
        """Tell the layout of ``tree`` by where ``pyproject.toml`` is.

        Raises:
            BuilderError: the tree has neither ``python/pyproject.toml`` (git layout) nor
                ``pyproject.toml`` or a ``*.dist-info`` folder (sdist or wheel layout).
        """
        if (tree / PACKAGE_FOLDER / "pyproject.toml").is_file():
            return Layout("git")
        if (tree / "pyproject.toml").is_file() or any(tree.glob("*.dist-info")):
            return Layout("sdist")  # an unpacked sdist, or an unpacked wheel
        raise ConfigurationError(
            f"{tree} has no pyproject.toml, python/pyproject.toml or .dist-info",
            "point --source-dir at an SGLang checkout, or an unpacked sdist "
            "or wheel")
