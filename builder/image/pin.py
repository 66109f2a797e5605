"""``pin-images``: resolve every base image in ``images/pins.toml`` to its digest.

Every entry (upstream's runtime images per version and CUDA lane, the kernel build
container's bases per lane) is resolved through its registry's API
(:func:`builder.image.registry.resolve`), nothing pulled. All entries are resolved
before anything is written, so one failure leaves the file as it was; the file is then
rewritten atomically with its comments (:func:`builder.core.basepins.write_base_pins`).
``check`` resolves the same way and writes nothing: it reports the pins whose tag now
points at another digest (and those never resolved).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.basepins import BasePin, load_base_pins, write_base_pins
from builder.core.config import TargetsFile
from builder.core.errors import BuilderError, ConfigurationError
from builder.core.progress import Reporter
from builder.image.registry import Resolution, resolve


@dataclass(frozen=True)
class PinOutcome:
    """One entry's result.

    Attributes:
        pin: the entry as it was in the file.
        now: what its tag resolves to now.
        status: ``unchanged``, ``resolved`` (was empty), ``moved`` (the tag points
            elsewhere now).
    """

    pin: BasePin
    now: Resolution
    status: str

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"kind": self.pin.kind, "name": self.pin.name, "cuda_lane": self.pin.cuda_lane,
                "upstream_version": str(self.pin.upstream_version or "") or None,
                "status": self.status, "pinned_digest": self.pin.digest or None,
                "digest": self.now.digest, "index_digest": self.now.index_digest or None,
                "platform": self.now.platform}


@dataclass(frozen=True)
class PinReport:
    """All entries' results.

    Attributes:
        path: the pins file.
        outcomes: one per entry, in file order.
        written: whether the file was rewritten.
        unpinned_targets: targets with no ``[[base]]`` entry for their version and lane.
    """

    path: Path
    outcomes: tuple[PinOutcome, ...]
    written: bool
    unpinned_targets: tuple[str, ...] = ()

    @property
    def drifted(self) -> list[PinOutcome]:
        """Entries whose tag moved or that were never resolved."""
        return [o for o in self.outcomes if o.status != "unchanged"]

    def describe(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"pins_file": str(self.path), "written": self.written,
                "pins": [o.describe() for o in self.outcomes],
                "drifted": len(self.drifted),
                "unpinned_targets": list(self.unpinned_targets)}


def _status(pin: BasePin, now: Resolution) -> str:
    if not pin.digest:
        return "resolved"
    same = pin.digest == now.digest and (pin.index_digest or "") == now.index_digest
    return "unchanged" if same else "moved"


def run_pin_images(path: Path, *, check: bool = False, targets: TargetsFile | None = None,
               platform: str = "linux/amd64", reporter: Reporter | None = None,
               resolver: Callable[..., Resolution] = resolve) -> PinReport:
    """Resolve every entry of the pins file; write them unless ``check``.

    Args:
        path: ``images/pins.toml``.
        check: resolve and compare only; write nothing.
        targets: the targets, to list those without a ``[[base]]`` entry.
        platform: the platform picked from multi-platform images.
        reporter: progress.
        resolver: the resolution function (:func:`builder.image.registry.resolve`).

    Returns:
        the :class:`PinReport` (``written`` False with ``check`` or when nothing changed).

    Raises:
        BuilderError: the file is malformed, or any entry cannot be resolved (the file
            is then left as it was).
    """
    pins = load_base_pins(path)
    if not pins.pins:
        raise ConfigurationError(f"{path} has no [[base]] or [[kernel_base]] entries",
                                 "add the images to pin (name = NAME:TAG, digest = \"\")")
    outcomes = []
    for pin in pins.pins:
        if reporter:
            reporter.info(f"resolving {pin.name}")
        try:
            now = resolver(pin.name, platform=platform)
        except BuilderError as exc:
            # Its own type: a forged answer exits 1, an unreachable registry 4.
            raise exc.replaced(cause=f"{pin.describe()}: {exc.cause}",
                               hint=f"{exc.hint}; {path} was not changed") from None
        outcomes.append(PinOutcome(pin, now, _status(pin, now)))
    unpinned: list[str] = []
    if targets is not None:
        for target in targets.targets.values():
            if target.cuda_lane not in pins.lanes(target.upstream_version):
                unpinned.append(target.name)
    changed = any(o.status != "unchanged" for o in outcomes)
    written = False
    if changed and not check:
        today = datetime.datetime.now(datetime.UTC).date().isoformat()
        write_base_pins(pins, [o.pin.resolved_to(o.now.digest, o.now.index_digest,
                                                 o.now.platform, today)
                               if o.status != "unchanged" else o.pin for o in outcomes])
        written = True
    return PinReport(path, tuple(outcomes), written, tuple(unpinned))
