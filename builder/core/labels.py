"""Raising a target's local version label in the targets file.

The label's last number is the build number (``sm120.1`` -> ``sm120.2``); a label without
one gets ``.1``. Only the ``local_label = "..."`` line of that target's ``[[target]]``
table changes: comments, order and every other byte of the file stay as they are, and
the file is replaced atomically.
"""

from __future__ import annotations

import re
from pathlib import Path

from builder.core.cache import atomic_write_bytes
from builder.core.config import load_targets
from builder.core.errors import BuilderError

_TABLE = re.compile(r"^\s*\[\[\s*target\s*\]\]\s*(#.*)?$")
_NAME = re.compile(r"""^\s*name\s*=\s*(["'])(?P<value>[^"']*)\1""")
_LABEL = re.compile(r"""^(?P<head>\s*local_label\s*=\s*)(["'])(?P<value>[^"']*)\2""")


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
        BuilderError: the file is invalid, has no such target, or its table has no
            ``local_label = "..."`` line this can rewrite.
    """
    old = load_targets(targets_file).get(target).local_label
    new = next_label(old)
    original = targets_file.read_text()
    lines = original.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if _TABLE.match(line)]
    label_line = None
    for begin, end in zip(starts, [*starts[1:], len(lines)], strict=True):
        # The table's own keys come before its first sub-table ([[target.source]] ...).
        own = next((i for i in range(begin + 1, end) if lines[i].lstrip().startswith("[")),
                   end)
        names = [m["value"] for i in range(begin + 1, own) if (m := _NAME.match(lines[i]))]
        if names == [target]:
            label_line = next((i for i in range(begin + 1, own) if _LABEL.match(lines[i])),
                              None)
            break
    found = _LABEL.match(lines[label_line]) if label_line is not None else None
    if label_line is None or found is None or found["value"] != old:
        raise BuilderError(f"{targets_file}: no local_label = \"{old}\" line found in target "
                           f"{target!r}", f"edit it by hand: local_label = \"{new}\"")
    quote = found.group(2)
    lines[label_line] = found["head"] + quote + new + quote + lines[label_line][found.end():]
    atomic_write_bytes(targets_file, "".join(lines).encode())
    try:
        if load_targets(targets_file).get(target).local_label != new:
            raise BuilderError(f"{targets_file}: the label edit did not take", "")
    except BuilderError:
        atomic_write_bytes(targets_file, original.encode())  # never leave it broken
        raise
    return old, new
