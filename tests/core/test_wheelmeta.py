"""builder.core.wheelmeta: the one Requires-Dist reader reads headers, never the
description, and one malformed requirement is one error."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from builder.core.errors import VerificationError
from builder.core.wheelmeta import parse_metadata, requires_dist, wheel_metadata

METADATA = (b"Metadata-Version: 2.1\nName: x\nVersion: 1\n"
            b"Requires-Dist: torch==2.9.1\nRequires-Dist: tilelang==0.1.11; extra == 'k'\n\n"
            b"Requires-Dist: not-a-header (a line of the description)\n")


def test_requirements_come_from_the_headers_only(tmp_path: Path) -> None:
    wheel = tmp_path / "x-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("x-1.dist-info/METADATA", METADATA)
    found = requires_dist(wheel_metadata(wheel), wheel.name)
    assert [str(r) for r in found] == ["torch==2.9.1", 'tilelang==0.1.11; extra == "k"']


def test_a_malformed_requirement_or_a_wheel_without_metadata_is_one_error(
        tmp_path: Path) -> None:
    with pytest.raises(VerificationError, match="malformed requirement"):
        requires_dist(parse_metadata(b"Name: x\nRequires-Dist: torch ==\n"), "x.whl")
    empty = tmp_path / "y-1-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("y/__init__.py", b"")
    with pytest.raises(VerificationError, match="has no METADATA"):
        wheel_metadata(empty)
    (tmp_path / "z.whl").write_bytes(b"not a zip")
    with pytest.raises(VerificationError, match="cannot read the METADATA"):
        wheel_metadata(tmp_path / "z.whl")
