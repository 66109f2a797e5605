"""The version lock: one version, one content.

A wheel, a kernel wheel or an image tag carries a version made of the upstream release
and our local label (``0.5.9+sm120.1``). Two artifacts with one version and other bytes
break every consumer: pip treats the second as already installed, an index refuses it or
serves two files under one name (PEP 440 gives a version exactly one meaning). So the
lock file, ``versions.lock`` beside the targets file and kept in the repository, records
per artifact kind, target and version the digest of everything that decides the
artifact's content (the upstream pins, the patches that apply, the builder's output
format ...). A build whose digest differs from the one recorded for its version is
refused before anything is built; the fix is a new local label
(``python -m builder next-label --target NAME``).

The file is JSON with sorted keys and a trailing newline, so it diffs well and two runs
that record the same entries write the same bytes; it is replaced atomically.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from builder.core.errors import ConfigurationError
from builder.core.userfiles import (
    exclusive,
    read_input,
    read_json_input,
    rewrite_user_file,
    with_line_endings_of,
)

LOCK_FILE = "versions.lock"
SCHEMA = 1
Kind = Literal["wheel", "kernels", "image"]
KINDS: tuple[Kind, ...] = ("wheel", "kernels", "image")
_HEADER = ("One version, one content: per artifact kind, target and version, the sha256 "
           "of what decides the artifact's bytes. Written by `python -m builder lock` and "
           "by builds; a build whose digest differs is refused: raise the local label "
           "(`python -m builder next-label --target NAME`). Keep this file in git.")


def lock_path(targets_file: Path) -> Path:
    """The lock file of a project: ``versions.lock`` beside its targets file."""
    return targets_file.parent / LOCK_FILE


@dataclass(frozen=True)
class LockCheck:
    """The lock's verdict on one artifact.

    Attributes:
        state: ``recorded`` (the same digest is recorded), ``new`` (nothing recorded for
            this version yet) or ``differs`` (another digest is recorded).
        recorded: the digest in the lock, if any.
        digest: this build's digest.
    """

    state: Literal["recorded", "new", "differs"]
    recorded: str | None
    digest: str


class VersionLock:
    """The lock file, read once; :meth:`record` writes it back atomically.

    Args:
        path: the lock file (it may not exist yet).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, dict[str, str]]] = {kind: {} for kind in KINDS}
        self._read()

    def _read(self) -> None:
        path = self.path
        self.entries = {kind: {} for kind in KINDS}
        if not path.exists() and not path.is_symlink():
            return
        data = read_json_input(path, "the lock file",
                               "restore it from git (git checkout -- versions.lock)")
        # type(...) is int: JSON's true is not schema 1, though Python has True == 1.
        if not isinstance(data, dict) or type(data.get("schema")) is not int \
                or data.get("schema") != SCHEMA:
            raise ConfigurationError(f"the lock file {path} is not a schema-{SCHEMA} version lock",
                                     "restore it from git, or delete it and run "
                                     "`python -m builder lock` to record every target again")
        for kind in KINDS:
            table = data.get(kind, {})
            if not isinstance(table, dict) or not all(
                    isinstance(v, dict) and all(isinstance(d, str) for d in v.values())
                    for v in table.values()):
                raise ConfigurationError(f"the lock file {path}: {kind!r} is not "
                                         "{target: {version: digest}}", "restore it from git")
            self.entries[kind] = {t: dict(v) for t, v in table.items()}

    def check(self, kind: Kind, target: str, version: str, digest: str) -> LockCheck:
        """Compare ``digest`` with what the lock records for ``(kind, target, version)``."""
        recorded = self.entries[kind].get(target, {}).get(version)
        if recorded is None:
            # One version, one content, whatever the target's name: another target's
            # record of this version binds it too. A wheel's provenance names its
            # target, so for wheels another target's version is never this one's.
            others = sorted(d for t, versions in self.entries[kind].items() if t != target
                            for v, d in versions.items() if v == version)
            if others and (kind == "wheel" or digest not in others):
                return LockCheck("differs", others[0], digest)
            return LockCheck("new", None, digest)
        return LockCheck("recorded" if recorded == digest else "differs", recorded, digest)

    def require(self, kind: Kind, target: str, version: str, digest: str) -> LockCheck:
        """:meth:`check`, refusing a version whose recorded content differs.

        Raises:
            BuilderError: the lock records another digest for this version; the hint
                names the command that raises the label.
        """
        verdict = self.check(kind, target, version, digest)
        if verdict.state == "differs":
            raise ConfigurationError(
                f"{kind} {version} of target {target} would have other content than the "
                f"{version} recorded in {self.path} (recorded {str(verdict.recorded)[:12]}, "
                f"now {digest[:12]}): one version must always mean one content",
                f"raise the local label: python -m builder next-label --target {target} "
                f"--targets-file {self.path.parent / 'targets.toml'} (then build again); "
                "only if this version was never published: python -m builder lock "
                f"--target {target} --replace")
        return verdict

    def record(self, kind: Kind, target: str, version: str, digest: str, *,
               replace: bool = False) -> bool:
        """Record a digest and write the file; return whether anything changed.

        Raises:
            BuilderError: another digest is recorded and ``replace`` is false.
        """
        with self._serialised():
            self._read()  # what a concurrent writer recorded meanwhile is kept
            if not replace:
                verdict = self.require(kind, target, version, digest)
                if verdict.state == "recorded":
                    return False
            elif self.entries[kind].get(target, {}).get(version) == digest:
                return False
            self.entries[kind].setdefault(target, {})[version] = digest
            self.write()
        return True

    @contextlib.contextmanager
    def _serialised(self) -> Iterator[None]:
        """Hold an exclusive ``flock`` for a read-modify-write, on the folder of the file
        itself (:func:`builder.core.userfiles.exclusive`): projects sharing one lock
        through links share the flock too."""
        with exclusive(self.path):
            yield

    def to_json(self) -> dict[str, Any]:
        """The file's content: sorted, so the same entries always give the same bytes."""
        return {"comment": _HEADER, "schema": SCHEMA,
                **{kind: {t: dict(sorted(v.items())) for t, v in sorted(table.items())}
                   for kind, table in self.entries.items()}}

    def write(self) -> None:
        """Replace the file atomically (a reader sees the old or the new file, whole),
        with the line endings it has (a CRLF checkout stays CRLF)."""
        text = json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"
        original = b""
        if self.path.exists():
            original = read_input(self.path, "the lock file", "restore it from git "
                                  "(git checkout -- versions.lock)")
        rewrite_user_file(self.path, with_line_endings_of(original, text))
