"""Small trees and series for the patch engine's tests."""

from __future__ import annotations

from pathlib import Path

from packaging.specifiers import SpecifierSet

from builder.patching.series import Series, SeriesEntry


def make_tree(root: Path, files: dict[str, bytes | str]) -> Path:
    """A git-layout tree (python/pyproject.toml) holding ``files`` (repository paths)."""
    (root / "python").mkdir(parents=True)
    (root / "python" / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    for path, data in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
    return root


def series_of(tmp_path: Path, *patches: str, strip: int = 1) -> Series:
    entries = []
    for number, text in enumerate(patches, 1):
        path = tmp_path / f"{number:04d}-case.patch"
        path.write_bytes(text.encode())
        entries.append(SeriesEntry(path=path, sha256=None, strip=strip, versions=SpecifierSet()))
    return Series(path=None, entries=tuple(entries))
