"""``add-patch``: store a patch in a target's series (:func:`run_add_patch`)."""

from __future__ import annotations

from pathlib import Path

from builder.core.options import Options
from builder.patching.canonical import PatchLayout


def run_add_patch(options: Options, patch: Path, *, versions: str, description: str,
                  name: str | None = None, strip: int = 1, layout: str = "auto"
                  ) -> tuple[Path, Path, PatchLayout, str]:
    """Store ``patch`` in ``options.series``, else the target's series
    (:func:`builder.patching.canonical.add_to_series`).

    Args:
        options: the targets file, the target and ``series`` (``None``: the target's).
        patch: the patch, in either layout.
        versions: upstream versions it applies to (PEP 440 specifiers).
        description: one line for reports and the provenance.
        name: its file name in the series folder (default: the patch's).
        strip: its strip level.
        layout: ``auto``, ``git`` or ``sdist``.

    Returns:
        ``(series file, stored file, layout it was written in, sha256)``.

    Raises:
        BuilderError: the targets file has no such target, or as ``add_to_series``.
    """
    from builder.core.config import load_targets
    from builder.patching.canonical import add_to_series

    series = options.series or load_targets(options.targets_file).get(options.target).series
    stored, written_layout, digest = add_to_series(
        series, patch, versions=versions, description=description, name=name, strip=strip,
        layout=layout)
    return series, stored, written_layout, digest
