"""What the smoke test tests and how (:class:`SmokeOptions`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from builder.core.progress import Reporter


@dataclass(frozen=True)
class SmokeOptions:
    """What to test and how.

    Attributes:
        mode: ``host`` (this environment) or ``image`` (a container of ``image``).
        image: the image reference (image mode).
        docker_host: the engine holding it (image mode; ``None``: ``DOCKER_HOST``).
        python: the interpreter that runs the probe (host: this one; image: ``python3``).
        series: the patch series whose intent checks must hold in the installed sglang.
        sglang_wheel: the patched wheel being released: the installed provenance and RECORD
            must equal its.
        expect_provenance: a provenance JSON file to compare with instead of a wheel.
        model: a model folder for the server check (host mode).
        tiny_model: run the server check on a tiny Qwen3-MoE with random weights, written
            by ``tiny_model.py`` with the tested interpreter into a temporary folder (no
            weights to download, no tokenizer: ``--skip-tokenizer-init`` and token ids).
        moe: count check 5 even when it cannot run.
        parallel: run and count check 7 (TP 1, TP 2 EP 1, TP 2 EP 2 on the model).
        server_args: extra arguments for ``sglang.launch_server``.
        probe_output: judge this saved output of ``smoke_probe.py`` (run by hand in the
            tested environment, which then needs neither the builder nor its
            dependencies) instead of running the probe.
        probe_timeout: seconds for the probe (checks 1-5).
        server_timeout: seconds for the server to become ready.
        reporter: progress output.
    """

    mode: Literal["host", "image"] = "host"
    image: str | None = None
    docker_host: str | None = None
    python: str | None = None
    series: Path = Path("patches/series.toml")
    sglang_wheel: Path | None = None
    expect_provenance: Path | None = None
    model: Path | None = None
    tiny_model: bool = False
    moe: bool = False
    parallel: bool = False
    server_args: tuple[str, ...] = ()
    probe_output: Path | None = None
    probe_timeout: float = 3600.0
    server_timeout: float = 1800.0
    reporter: Reporter = field(default_factory=lambda: Reporter(quiet=True))
