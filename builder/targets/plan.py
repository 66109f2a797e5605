"""CI plan: the targets file as a build matrix, one entry per target.

``python -m builder plan --json`` prints it; the CI workflows (``ci/build.yml``) feed
its ``targets`` list to every per-target job as ``strategy.matrix.include``, so a target
is declared once, in ``targets.toml``, and never listed again in a workflow.

Each entry carries only what is known from the targets file itself, without a
download: FlashInfer's version is left out because it is read from the upstream source
(``python -m builder preflight``), which the kernels job fetches anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from builder.core.config import SourceKind, Target, TargetsFile, WheelPin, load_targets
from builder.core.options import Options


@dataclass(frozen=True)
class PlanEntry:
    """One target as a CI job sees it.

    Attributes:
        target: the target's name (what ``--target`` takes).
        upstream_version: the upstream SGLang release (``0.5.9``).
        version: our wheel's version (``0.5.9+sm120.1``).
        local_label: the PEP 440 local version label (``sm120.1``).
        cuda_lane: CUDA ``major.minor`` of the kernel build (``12.9``).
        arch_list: SM arch list of the kernel build (``["12.0a"]``).
        source: the source kind built by default (``sdist``, ``wheel`` or ``git``).
        sources: every source kind the target pins.
        python_tags: CPython tags of the pinned upstream wheels (``["cp311", "cp312"]``)
            for a target repacked from released wheels; empty when the wheel is built
            from source (pure Python, ``py3-none-any``).
        default: the targets file's default target.
    """

    target: str
    upstream_version: str
    version: str
    local_label: str
    cuda_lane: str
    arch_list: tuple[str, ...]
    source: SourceKind
    sources: tuple[SourceKind, ...]
    python_tags: tuple[str, ...]
    default: bool

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data (one ``matrix.include`` item)."""
        return {"target": self.target, "upstream_version": self.upstream_version,
                "version": self.version, "local_label": self.local_label,
                "cuda_lane": self.cuda_lane, "arch_list": list(self.arch_list),
                "source": self.source, "sources": list(self.sources),
                "python_tags": list(self.python_tags), "default": self.default}


@dataclass(frozen=True)
class Plan:
    """The CI plan for a targets file.

    Attributes:
        default: the default target's name.
        entries: one entry per target, in file order.
        kernel_shards: shard jobs per target for the kernel build (``kernels --shard
            I/N``; docs/compile-at-scale.md).
    """

    default: str
    entries: tuple[PlanEntry, ...]
    kernel_shards: int = 4

    def to_json(self) -> dict[str, Any]:
        """Return ``{"default": NAME, "targets": [entry, ...], "kernel_shards": [...]}``.

        ``targets`` is what a workflow passes to ``strategy.matrix.include``;
        ``kernel_shards`` is every target's entry once per shard, with ``shard`` (``I/N``)
        added, for the kernel shard jobs' matrix.
        """
        count = self.kernel_shards
        return {"default": self.default, "targets": [e.to_json() for e in self.entries],
                "kernel_shards": [{**e.to_json(), "shard": f"{index}/{count}"}
                                  for e in self.entries for index in range(1, count + 1)]}


def _python_tags(target: Target) -> tuple[str, ...]:
    if target.prefer != "wheel":
        return ()
    tags: set[str] = set()
    for pin in target.sources:
        if isinstance(pin, WheelPin):
            try:
                tags.update(tag.interpreter for tag in parse_wheel_filename(pin.filename)[3])
            except InvalidWheelFilename:
                continue
    return tuple(sorted(tags))


def plan_targets(targets: TargetsFile) -> Plan:
    """Derive the CI plan from a parsed targets file (no network, no downloads).

    Args:
        targets: the parsed targets file (:func:`builder.core.config.load_targets`).

    Returns:
        One :class:`PlanEntry` per target, in file order.
    """
    entries = tuple(
        PlanEntry(target=t.name, upstream_version=str(t.upstream_version), version=t.version,
                  local_label=t.local_label, cuda_lane=t.cuda_lane, arch_list=t.arch_list,
                  source=t.prefer, sources=tuple(dict.fromkeys(p.kind for p in t.sources)),
                  python_tags=_python_tags(t), default=t.name == targets.default)
        for t in targets.targets.values())
    return Plan(default=targets.default, entries=entries)


def run_plan(options: Options, *, kernel_shards: int = 4) -> Plan:
    """The CI plan: every target of the targets file as a matrix entry (no downloads).

    Args:
        options: the common options (the targets file).
        kernel_shards: shard jobs per target for the kernel build.

    Raises:
        BuilderError: the targets file is missing or invalid.
    """
    plan = plan_targets(load_targets(options.targets_file))
    return Plan(plan.default, plan.entries, kernel_shards)
