"""Raising a target's local version label in the targets file.

The label's last number is the build number (``sm120.1`` -> ``sm120.2``); a label without
one gets ``.1``. The file is edited with tomlkit, as ``bump`` and ``pin-images`` edit
theirs: only the value of that target's ``local_label`` changes (its quote style and
trailing comment kept); comments, order, line endings (CRLF too) and every other byte of
the file stay as they are, and the file is replaced atomically.
"""

from __future__ import annotations

from pathlib import Path

import tomlkit
import tomlkit.exceptions
import tomlkit.items

from builder.core.config import load_targets
from builder.core.errors import BuilderError, ConfigurationError
from builder.core.userfiles import exclusive, read_input, rewrite_user_file, temporary_beside


def next_label(label: str) -> str:
    """``sm120.1`` -> ``sm120.2``; ``sm120`` -> ``sm120.1`` (PEP 440 local label parts)."""
    parts = label.split(".")
    if parts[-1].isdigit():
        parts[-1] = str(int(parts[-1]) + 1)
    else:
        parts.append("1")
    return ".".join(parts)


def bump_label(targets_file: Path, target: str) -> tuple[str, str]:
    """Raise ``target``'s local label in ``targets_file``.

    Args:
        targets_file: the targets file.
        target: the target's name.

    Returns:
        ``(old label, new label)``.

    Raises:
        BuilderError: the file is invalid or has no such target (see
            :func:`builder.core.config.load_targets`).
        ConfigurationError: tomlkit cannot parse the file, or does not find the target's
            ``local_label`` string where tomllib did, or the edited file would not load
            (checked before the file changes: it is left as it was).
    """
    # One bump at a time per file: a bump that read the label while another wrote it
    # would write the same new label again, and one of two successes would be lost.
    with exclusive(targets_file):
        old = load_targets(targets_file).get(target).local_label
        new = next_label(old)
        original = read_input(targets_file, "targets file", "give the targets file")
        # decoded without newline translation, so a CRLF file is written back with CRLF
        try:
            document = tomlkit.parse(original.decode("utf-8"))
        except tomlkit.exceptions.TOMLKitError as exc:  # tomllib read it; tomlkit may not
            raise ConfigurationError(f"{targets_file}: tomlkit cannot edit it: {exc}",
                                     f"edit it by hand: local_label = \"{new}\"") from exc
        tables = [table for table in document.get("target", [])
                  if isinstance(table, dict) and table.get("name") == target]
        label = tables[0].get("local_label") if len(tables) == 1 else None
        if not isinstance(label, tomlkit.items.String) or str(label) != old:
            raise ConfigurationError(
                f"{targets_file}: no local_label = \"{old}\" line found in target {target!r}",
                f"edit it by hand: local_label = \"{new}\"")
        tables[0]["local_label"] = tomlkit.string(new, literal=label.type.is_literal(),
                                                  multiline=label.type.is_multiline())
        output = tomlkit.dumps(document).encode("utf-8")
        # Checked before the file changes (beside it: its series path is relative to it).
        with temporary_beside(targets_file, output) as temporary:
            try:
                took = load_targets(temporary).get(target).local_label == new
            except BuilderError as exc:
                raise exc.replaced(cause=exc.cause.replace(str(temporary),
                                                           str(targets_file))) from None
        if not took:
            raise ConfigurationError(f"{targets_file}: the label edit did not take",
                                     f"edit it by hand: local_label = \"{new}\"")
        rewrite_user_file(targets_file, output)
    return old, new
