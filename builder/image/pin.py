"""``pin-images``: resolve every base image in ``images/pins.toml`` to its digest.

Every entry (upstream's runtime images per version and CUDA lane, the kernel build
container's bases per lane), or one target's (``--target``), is resolved through its
registry's API (:func:`builder.image.registry.resolve`), nothing pulled. Every entry is
tried before anything is written: those resolved are written in one atomic rewrite that
keeps the comments (:func:`builder.core.basepins.write_base_pins`), one that failed keeps
its old pin and is named in the error (a base that is not published yet does not hold
the others back).
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
from builder.core.config import Target, TargetsFile
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
                   resolver: Callable[..., Resolution] = resolve,
                   target: Target | None = None) -> PinReport:
    """Resolve the entries of the pins file; write those resolved unless ``check``.

    Every entry is tried: one that cannot be resolved is named in the error and left as
    it was, while the entries that resolved are written (one rewrite, atomic).

    Args:
        path: ``images/pins.toml``.
        check: resolve and compare only; write nothing.
        targets: the targets, to list those without a ``[[base]]`` entry.
        platform: the platform picked from multi-platform images.
        reporter: progress.
        resolver: the resolution function (:func:`builder.image.registry.resolve`).
        target: only this target's entries: its release's ``[[base]]`` on its lane and
            the ``[[kernel_base]]`` of that lane (``pin-images --target NAME``).

    Returns:
        the :class:`PinReport` (``written`` False with ``check`` or when nothing changed).

    Raises:
        BuilderError: the file is malformed, ``target`` has no ``[[base]]``, or an entry cannot
            be resolved (the first failure's type and exit status; every failed entry
            named; the resolved ones written).
    """
    pins = load_base_pins(path)
    if not pins.pins:
        raise ConfigurationError(f"{path} has no [[base]] or [[kernel_base]] entries",
                                 "add the images to pin (name = NAME:TAG, digest = \"\")")
    chosen = [p for p in pins.pins if target is None or _of_target(p, target)]
    if target is not None and not any(p.kind == "base" for p in chosen):
        raise ConfigurationError(f"{path} has no [[base]] for target "
                                 f"{target.name} ({target.upstream_version}, CUDA "
                                 f"{target.cuda_lane})", "add one (python -m builder "
                                 "add-target writes it), or drop --target")
    outcomes = []
    failures: list[tuple[BasePin, BuilderError]] = []
    for pin in chosen:
        if reporter:
            reporter.info(f"resolving {pin.name}")
        try:
            now = resolver(pin.name, platform=platform)
        except BuilderError as exc:
            failures.append((pin, exc))
            continue
        outcomes.append(PinOutcome(pin, now, _status(pin, now)))
    unpinned: list[str] = []
    if targets is not None:
        for each in targets.targets.values():
            if each.cuda_lane not in pins.lanes(each.upstream_version):
                unpinned.append(each.name)
    changed = any(o.status != "unchanged" for o in outcomes)
    written = False
    if changed and not check:
        today = datetime.datetime.now(datetime.UTC).date().isoformat()
        resolved = {id(o.pin): o for o in outcomes}
        write_base_pins(pins, [
            (o.pin.resolved_to(o.now.digest, o.now.index_digest, o.now.platform, today)
             if o.status != "unchanged" else o.pin) if (o := resolved.get(id(p))) else p
            for p in pins.pins])
        written = True
    if failures:
        pin, first = failures[0]
        more = "".join(f"; {p.describe()}: {e.cause}" for p, e in failures[1:])
        one = len(outcomes) == 1
        kept = (f"{path} was not changed" if not written else
                f"the {len(outcomes)} other entr{'y' if one else 'ies'} resolved and "
                f"{'was' if one else 'were'} written to {path}; the failed one(s) kept "
                "their old pin")
        # Its own type: a forged answer exits 1, an unreachable registry 4.
        raise first.replaced(cause=f"{pin.describe()}: {first.cause}{more}",
                             hint=f"{first.hint}; {kept}")
    return PinReport(path, tuple(outcomes), written, tuple(unpinned))


def _of_target(pin: BasePin, target: Target) -> bool:
    """Whether ``pin`` is one ``target`` builds on: its release's runtime base on its lane,
    or the kernel build base of its lane."""
    if pin.cuda_lane != target.cuda_lane:
        return False
    return pin.kind != "base" or pin.upstream_version == target.upstream_version
