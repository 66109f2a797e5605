"""``next-label``: raise a target's build number in the targets file (sm120.1 -> sm120.2)."""

from __future__ import annotations

from typing import Any

from builder.core.options import Options


def run_next_label(options: Options) -> dict[str, Any]:
    """Raise the local label's build number of ``options.target`` (or the default target).

    Only that target's ``local_label`` value changes (:func:`builder.core.labels.bump_label`).

    Args:
        options: the targets file, the target and the reporter.

    Returns:
        ``{"target", "old", "new", "version"}`` (``version``: upstream+new label).

    Raises:
        BuilderError: the targets file is invalid or has no such target.
        ConfigurationError: tomlkit cannot edit the file.
    """
    from builder.core.config import load_targets
    from builder.core.labels import bump_label

    target = load_targets(options.targets_file).get(options.target)
    old, new = bump_label(options.targets_file, target.name)
    options.reporter.result(f"{target.name}: local label {old} -> {new} in "
                            f"{options.targets_file} (version {target.upstream_version}+{new}); "
                            "build again, and commit targets.toml with versions.lock")
    return {"target": target.name, "old": old, "new": new,
            "version": f"{target.upstream_version}+{new}"}
