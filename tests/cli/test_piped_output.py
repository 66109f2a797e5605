"""What a user reads when the output is piped: tables keep whole target names, and a
download names the file it downloads (not the hash its partial file is named by)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from builder.core.config import load_targets
from builder.core.progress import Reporter
from builder.source.download import download
from tests.helpers.cli import run_cli_process
from tests.helpers.paths import REPO
from tests.helpers.serve import serve_directory


def test_a_piped_table_keeps_every_target_name_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # pytest's terminal may have set it
    done = run_cli_process("targets")
    assert done.returncode == 0, done.stderr
    names = list(load_targets(REPO / "targets.toml").targets)
    rows = [line for line in done.stdout.splitlines() if line.startswith("│")]
    cells = [row.split("│")[1].strip() for row in rows]
    assert [cell.split()[0] for cell in cells if cell] == names
    assert "…" not in done.stdout


def test_downloading_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    served = tmp_path / "served"
    served.mkdir()
    wheel = served / "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
    wheel.write_bytes(os.urandom(200_000))
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with serve_directory(served) as base:
        download(f"{base}/{wheel.name}", tmp_path / "out.whl", sha,
                 tmp_path / f"{sha}.part", Reporter())
    err = capsys.readouterr().err
    assert f"Downloading {wheel.name}" in err
    assert sha not in err
