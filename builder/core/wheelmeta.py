"""Wheel metadata: the one reader of a distribution's ``Requires-Dist``.

Core metadata is an RFC 822 message (the core metadata specification, PyPA); the
``Requires-Dist`` fields are its headers, never lines of the description that follows
them, so they are read with :mod:`email.parser`, as ``importlib.metadata`` reads them.
"""

from __future__ import annotations

import email.message
import email.parser
import zipfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from builder.core.errors import VerificationError

_HINT = "use the target's pinned wheel"


def parse_metadata(data: bytes) -> email.message.Message:
    """A METADATA file's bytes as a message (headers only; the description is not read)."""
    return email.parser.BytesParser().parsebytes(data, headersonly=True)


def wheel_metadata(wheel: Path) -> email.message.Message:
    """The core metadata of a wheel file (its ``*.dist-info/METADATA``).

    Raises:
        VerificationError: the file is not a zip or has no METADATA.
    """
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
            if not names:
                raise VerificationError(f"{wheel.name} has no METADATA", _HINT)
            return parse_metadata(archive.read(names[0]))
    except (OSError, zipfile.BadZipFile) as exc:
        raise VerificationError(f"cannot read the METADATA of {wheel.name}: {exc}",
                                _HINT) from None


def requires_dist(metadata: email.message.Message, where: str) -> list[Requirement]:
    """The ``Requires-Dist`` requirements of core metadata, in order.

    Args:
        metadata: the message (:func:`wheel_metadata`, :func:`parse_metadata`, or a
            remote wheel's METADATA).
        where: what it came from, for the message (a wheel's file name).

    Raises:
        VerificationError: a requirement does not parse.
    """
    found = []
    for value in metadata.get_all("Requires-Dist") or []:
        try:
            found.append(Requirement(str(value).strip()))
        except InvalidRequirement as exc:
            raise VerificationError(f"{where} has a malformed requirement: {exc}",
                                    _HINT) from None
    return found
