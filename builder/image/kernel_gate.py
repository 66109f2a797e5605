"""The kernel-wheel gate: only a target's own kernel wheels, for its own FlashInfer, go into
its release image or onto an index beside its sglang wheels.

One rule for every path that takes ``--kernel-wheel`` and names the result as the target's
release: ``image`` (its tag is the release's, ``<upstream>-<label>``), ``release image`` and
``release wheels``. A kernel wheel passes when

- its local version is the target's label or starts with it (the kernel stage's
  ``<flashinfer>+<label>.cu<lane>``);
- its version's public part is the FlashInfer the target pins (FlashInfer loads a
  jit-cache wheel only of its own version: the kernel stage versions the wheel so,
  :func:`builder.kernels.pins.kernel_wheel_version`);
- its manifest (provider or jit-cache wheel) names the target and that FlashInfer
  (``target``, ``flashinfer_version``: what :func:`builder.kernels.build.build_kernels`
  writes);
- it is not a fast build or a trial of another module set (:func:`refuse_unreleased_kernels`).

The FlashInfer a target pins is read from its upstream source (the ``flashinfer_python==``
requirement of the sdist's ``pyproject.toml`` or the wheel's ``METADATA``:
:func:`builder.kernels.pins.read_pins`), as the kernel stage reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

from packaging.version import InvalidVersion, Version

from builder.core.config import Target
from builder.core.errors import BuilderError, ConfigurationError, PublishError
from builder.core.options import Options
from builder.image.build import ExtraWheel


def pinned_flashinfer(options: Options, target: Target) -> Version:
    """The ``flashinfer_python`` version the target's upstream source pins.

    Raises:
        BuilderError: the source cannot be fetched, or does not pin FlashInfer exactly
            (:func:`builder.kernels.pins.read_pins`).
    """
    from builder.kernels.pins import read_pins
    from builder.source.fetch import obtain_source

    return read_pins(obtain_source(options, target)).flashinfer


def _public(text: object) -> str | None:
    try:
        return Version(str(text)).public
    except InvalidVersion:
        return None


def refuse_foreign_kernels(wheels: Sequence[ExtraWheel], target: Target,
                           flashinfer: Version) -> None:
    """Refuse a kernel wheel built for another target or another FlashInfer.

    Args:
        wheels: the kernel wheels (:func:`builder.image.build.read_extra_wheel`); a shim
            (no manifest) is judged by its version alone.
        target: the target released.
        flashinfer: the FlashInfer it pins (:func:`pinned_flashinfer`).

    Raises:
        ConfigurationError: the first wheel whose version, manifest target or manifest
            FlashInfer differs, naming each difference and the ``kernels`` command that
            builds the target's own (exit 2).
    """
    wanted = flashinfer.public
    for wheel in wheels:
        wrong = []
        if _public(wheel.version.partition("+")[0]) != wanted:
            wrong.append(f"version {wheel.version} (FlashInfer {wanted} loads only "
                         f"{wanted}+...)")
        if wheel.manifest is not None:
            named = wheel.manifest.get("target")
            if named != target.name:
                wrong.append(f"manifest target {named or 'none'} (this release: {target.name})")
            built = wheel.manifest.get("flashinfer_version")
            if _public(built) != wanted:
                wrong.append(f"manifest FlashInfer {built or 'none'} ({target.name} pins "
                             f"flashinfer_python {flashinfer})")
        if wrong:
            raise ConfigurationError(
                f"{wheel.path.name} is not {target.name}'s kernel wheel: " + "; ".join(wrong),
                f"build the target's own: python -m builder kernels build --target "
                f"{target.name}")


def refuse_unreleased_kernels(wheels: Sequence[ExtraWheel], target: Target,
                              error: type[BuilderError] = PublishError) -> None:
    """Refuse every kernel wheel that is not ``target``'s released kernel set.

    The one rule the release paths (``image``, ``release image``, ``release wheels``)
    apply. Refused:

    - a fast build (``kernels --fast-build``: its fused MoE keeps one of the TMA
      warp-specialised tile shapes, for smoke tests), known by its local label segment
      ``fastbuild`` or, in a wheel renamed by hand, by its manifest's ``"fast_build"``;
    - a trial (``kernels --modules``, ``--head-dims``, ``--arch-list``): its manifest's
      arch list, module groups or head dimensions are not the target's. A trial carries
      the target's version but not its module set: publishing it would make that version
      mean other content (the kernel stage does not record a trial in the lock,
      :func:`builder.kernels.run.run_kernels`).

    Args:
        wheels: the kernel wheels (:func:`builder.image.build.read_extra_wheel`); a wheel
            without a manifest (the shim) is judged by its label alone.
        target: the target being released.
        error: the error raised (``PublishError`` for the release paths,
            ``ConfigurationError`` for ``image``, which publishes nothing).

    Raises:
        BuilderError: ``error``, for the first wheel that is a fast build or a trial, with
            what differs.
    """
    from builder.kernels.build import DEFAULT_HEAD_DIMS, is_fast_build_version
    from builder.kernels.pins import default_groups

    arch_list = tuple(target.arch_list)
    groups = tuple(target.kernel_groups or default_groups(arch_list))
    head_dims = tuple(target.head_dims or DEFAULT_HEAD_DIMS) if "attention" in groups else ()
    wanted = {"arch list": arch_list, "module groups": groups, "head dims": head_dims}
    for wheel in wheels:
        manifest = wheel.manifest or {}
        if is_fast_build_version(wheel.version) or manifest.get("fast_build"):
            raise error(f"{wheel.path.name} is a --fast-build kernel wheel (its fused "
                        "MoE keeps one of the TMA warp-specialised tile shapes): it "
                        "is for smoke tests and is never released",
                        "build the kernel wheel without --fast-build")
        if wheel.manifest is None:
            continue
        found = {"arch list": tuple(manifest.get("arch_list") or ()),
                 "module groups": tuple(manifest.get("groups") or ()),
                 "head dims": tuple(manifest.get("head_dims") or ())}
        wrong = [f"{what} {', '.join(map(str, found[what])) or 'none'} (the target's: "
                 f"{', '.join(map(str, wanted[what])) or 'none'})"
                 for what in found if found[what] != wanted[what]]
        if wrong:
            raise error(f"{wheel.path.name} is a trial build of {target.name}, not its "
                        "kernels: " + "; ".join(wrong),
                        f"build the target's own set: python -m builder kernels "
                        f"build --target {target.name} (no --modules, --head-dims, "
                        "--arch-list or --fast-build)")


def refuse_other_labels(wheels: Sequence[ExtraWheel], target: Target,
                        error: type[BuilderError] = PublishError) -> None:
    """Refuse a kernel wheel whose local version is not the target's label (or does not
    start with ``<label>.``, the kernel stage's ``<label>.cu<lane>``).

    Raises:
        BuilderError: ``error``, naming the wheel, its label and the target's.
    """
    label = target.local_label
    for wheel in wheels:
        local = wheel.version.partition("+")[2]
        if local != label and not local.startswith(f"{label}."):
            raise error(f"{wheel.path.name} is not a kernel wheel of this target "
                        f"(local version {local or 'none'}, the target's label is "
                        f"{label})", "pass the wheels `python -m builder kernels "
                        f"build --target {target.name}` wrote for this target")


def gate_kernel_wheels(options: Options, target: Target, wheels: Sequence[ExtraWheel],
                       error: type[BuilderError] = PublishError) -> None:
    """The whole gate (module docstring) for ``wheels``; nothing is fetched without any.

    Args:
        options: the build options (the target's upstream source is read from the cache
            or fetched, for its FlashInfer pin).
        target: the target released.
        wheels: the kernel wheels.
        error: the error of the label, fast-build and trial refusals
            (:func:`refuse_unreleased_kernels`); a foreign target or FlashInfer is always a
            ``ConfigurationError``.

    Raises:
        BuilderError: the first refusal; or the source cannot be fetched.
    """
    if not wheels:
        return
    # What the files alone tell first: a refusal there fetches nothing.
    refuse_other_labels(wheels, target, error)
    refuse_unreleased_kernels(wheels, target, error)
    refuse_foreign_kernels(wheels, target, pinned_flashinfer(options, target))
