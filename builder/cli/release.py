"""The image and release commands: ``pin-images``, ``image`` and ``release`` (which
also publishes the wheels alone, ``--wheels-only``)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import (
    common,
    image_args,
    image_options_from,
    options,
    source_args,
    validate_source_args,
)
from builder.core.basepins import PINS_FILE
from builder.core.errors import ConfigurationError, VerificationError

if TYPE_CHECKING:
    from builder.core.progress import Reporter

_PIN_EPILOG = """\
examples:
  python -m builder pin-images                 # resolve every base, rewrite images/pins.toml
  python -m builder pin-images --check         # exit 1 if a tag now points elsewhere
  python -m builder pin-images --json --pins-file my-pins.toml

Credentials: docker login's (~/.docker/config.json, $DOCKER_CONFIG, credential helpers);
Docker Hub's anonymous token is used when there are none. Registries on 127.0.0.0/8 and
localhost are reached over plain HTTP, like the Docker Engine does.
exit status: 0 pinned (or, with --check, nothing moved), 1 a tag moved or was never
resolved (--check), or a registry's answer failed its checks (not a digest, a body that
does not hash to its digest, a malformed or oversized manifest), 2 bad usage, 4 a
registry unreachable, refusing or without the tag. On any failure the pins file is
unchanged.
"""


def _platform(text: str) -> str:
    """An OCI platform ``OS/ARCH[/VARIANT]`` (``image-index.md``, OCI image spec 1.1).

    Raises:
        argparse.ArgumentTypeError: not of that form.
    """
    if not re.fullmatch(r"[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not OS/ARCH[/VARIANT] (e.g. "
                                         "linux/amd64, linux/arm64/v8)")
    return text


def add_commands(commands: Any) -> None:
    """Add ``pin-images``, ``image`` and ``release``."""
    pin = commands.add_parser(
        "pin-images", help="resolve the base images' tags to digests (images/pins.toml)",
        description="Resolve every base image in the pins file, upstream's runtime images "
                    "([[base]]) and the kernel build bases ([[kernel_base]]), from tag to "
                    "digest through the registry's API, pulling nothing; for a "
                    "multi-platform image record the index digest and the --platform "
                    "manifest digest. The file is rewritten atomically with its comments, "
                    "only when every entry resolved.",
        epilog=_PIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(pin, target=False)
    pin.add_argument("--pins-file", type=Path, default=PINS_FILE,
                     help="the pins file (default: %(default)s)")
    pin.add_argument("--check", action="store_true",
                     help="write nothing; report pins whose tag now points elsewhere "
                          "(exit 1), for the scheduled upstream workflow")
    pin.add_argument("--platform", default="linux/amd64", metavar="OS/ARCH", type=_platform,
                     help="the manifest taken from multi-platform images "
                          "(default: %(default)s)")
    pin.set_defaults(handler=_cmd_pin_images)

    image = commands.add_parser(
        "image", help="build the runtime OCI image: upstream's image plus our wheel(s)",
        description="Build the target's wheel, then the runtime image from images/Dockerfile "
                    "with the engine's BuildKit: FROM the upstream image of the target's "
                    "CUDA lane (by digest, images/pins.toml), plus one thin layer that "
                    "pip-installs the sglang wheel and any --kernel-wheel with --no-deps. "
                    "The build log streams to stderr.")
    common(image)
    source_args(image)
    image_args(image)
    image.set_defaults(handler=_cmd_image, series=None, patch=None, strip=1, max_fuzz=0)

    release = commands.add_parser(
        "release", help="build, gate and publish: wheels and image, or --wheels-only",
        description="Build the wheel and, unless --wheels-only, the image; open the gate; and "
                    "only then publish. With the image: --gate gpu (the default) runs the "
                    "smoke test on this runner's GPU inside the image, --gate static only "
                    "reads the provenance and the patched line inside the image; the image "
                    "is pushed (SGLANG_SM120_REGISTRY_USERNAME / _PASSWORD, or docker login). "
                    "With --wheels-only (no Docker Engine): --gate smoke (the default) takes "
                    "the smoke test's report for this very wheel from a GPU runner "
                    "(--smoke-report), --gate build relies on the build's own checks. The "
                    "wheels go through twine either way (TWINE_USERNAME / TWINE_PASSWORD or "
                    "keyring), after the index's simple page is read: the same file with the "
                    "same sha256 counts as published, the same name with other bytes is an "
                    "error, never an overwrite; the index must then list our sha256. The "
                    "summary lists exactly what was published. One command with a mode, not "
                    "two: both build the same wheel and publish it through the same checks; "
                    "only whether an image is built decides which gate can run.",
        epilog=_PUBLISH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(release)
    source_args(release)
    image_args(release)
    release.add_argument("--repository-url", required=True, metavar="URL",
                         help="where twine uploads the wheels (pypiserver: its root URL)")
    release.add_argument("--publish-index-url", metavar="URL",
                         help="the simple index of that repository, read to find files "
                              "already published (default: <repository-url>/simple/)")
    release.add_argument("--wheels-only", action="store_true",
                         help="publish the wheel(s) alone: no image, no Docker Engine; "
                              "--kernel-wheel FILE (repeated) publishes the kernel stage's "
                              "wheels with them, through the same gate and index checks")
    release.add_argument("--gate", choices=_IMAGE_GATES + _WHEEL_GATES, default=None,
                         help="with the image: gpu (default; the smoke test on this "
                              "runner's GPU, in the image) or static (provenance and patched "
                              "line read in the image, no GPU); with --wheels-only: smoke "
                              "(default; a passed --smoke-report for this wheel) or build "
                              "(the build's own checks alone)")
    release.add_argument("--gate-series", type=Path, default=None,
                         metavar="FILE", help="series whose intent checks the gpu gate "
                                              "verifies in the image (default: "
                                              "patches/series.toml beside the targets file)")
    release.add_argument("--smoke-report", type=Path, metavar="FILE",
                         help="--wheels-only --gate smoke: the report of `smoke --mode host "
                              "--sglang-wheel WHEEL --output FILE` run on a GPU runner")
    release.set_defaults(handler=_cmd_release, validate=_validate_release, series=None,
                         patch=None, strip=1, max_fuzz=0)


_IMAGE_GATES = ("gpu", "static")
_WHEEL_GATES = ("smoke", "build")
#: The image's flags and their defaults: given with --wheels-only they would do nothing.
_IMAGE_DEFAULTS: tuple[tuple[str, object], ...] = (
    ("registry", "localhost:5000"), ("repository", "sglang-sm120"), ("base_image", None),
    ("pins_file", None), ("dockerfile", None), ("profiles_dir", None),
    ("launch_profile", None), ("docker_host", None), ("gate_series", None))


def _validate_release(args: argparse.Namespace) -> None:
    """``release``'s rules beyond argparse's; fills in the mode's default gate.

    Raises:
        ConfigurationError: a gate of the other mode, an image flag with
            ``--wheels-only``, or ``--smoke-report`` without ``--wheels-only --gate smoke``.
    """
    validate_source_args(args)
    gates = _WHEEL_GATES if args.wheels_only else _IMAGE_GATES
    mode = "--wheels-only" if args.wheels_only else "a release with the image"
    if args.gate is None:
        args.gate = gates[0]
    elif args.gate not in gates:
        raise ConfigurationError(f"--gate {args.gate} does not apply to {mode}",
                                 f"give --gate {' or '.join(gates)}")
    if args.wheels_only:
        image_only = [f"--{name.replace('_', '-')}" for name, default in _IMAGE_DEFAULTS
                      if getattr(args, name) != default]
        if image_only:
            raise ConfigurationError(f"{', '.join(image_only)} only apply with the image",
                                     "drop them, or drop --wheels-only")
    if args.smoke_report is not None and args.gate != "smoke":
        raise ConfigurationError("--smoke-report only applies with --wheels-only --gate smoke",
                                 "drop --smoke-report, or give --gate smoke" if
                                 args.wheels_only else
                                 "drop --smoke-report, or give --wheels-only")


_PUBLISH_EPILOG = """\
examples:
  # wheels alone: on the GPU runner: build, install, smoke-test the wheel, keep the report
  python -m builder wheel --target sglang-0.5.9
  pip install dist/sglang-0.5.9+sm120.1-py3-none-any.whl
  python -m builder smoke --mode host --sglang-wheel dist/sglang-0.5.9+sm120.1-py3-none-any.whl \\
      --output smoke.json
  # then publish exactly that wheel
  TWINE_USERNAME=... TWINE_PASSWORD=... python -m builder release \\
      --wheels-only --target sglang-0.5.9 --repository-url https://index.example/ \\
      --smoke-report smoke.json
  # or on the build's own checks alone (no GPU proof)
  python -m builder release --wheels-only --repository-url http://127.0.0.1:8080/ --gate build
  # wheels and image, the image smoke-tested on this runner's GPU
  python -m builder release --registry 127.0.0.1:5000 --repository-url http://127.0.0.1:8080/
"""


def _cmd_pin_images(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.core.config import load_targets
    from builder.image.pin import pin_images

    targets = load_targets(args.targets_file) if args.targets_file.is_file() else None
    report = pin_images(args.pins_file, check=args.check, targets=targets,
                        platform=args.platform, reporter=reporter)
    lines = []
    for outcome in report.outcomes:
        now = outcome.now
        index = f" (index {now.index_digest})" if now.index_digest else ""
        lines.append(f"{outcome.status:9} {outcome.pin.name}\n"
                     f"          -> {now.digest} {now.platform}{index}\n")
        if outcome.status == "moved":
            lines.append(f"          was {outcome.pin.digest}\n")
    for name in report.unpinned_targets:
        lines.append(f"note: target {name} has no [[base]] entry for its version and lane\n")
    lines.append(f"{args.pins_file}: "
                 f"{'written' if report.written else 'unchanged'}\n")
    reporter.raw("".join(lines))
    if args.check and report.drifted:
        raise VerificationError(
            f"{len(report.drifted)} base image pin(s) no longer match their tag: "
            + ", ".join(f"{o.pin.name} ({o.status})" for o in report.drifted),
            "run `python -m builder pin-images`, rebuild and test, then commit "
            f"{args.pins_file}", report=report.describe())
    return report.describe()


def _cmd_image(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.image.run import run_image

    result = run_image(options(args, reporter), image_options_from(args))
    how = "from the build cache" if result.cached else "built"
    reporter.raw(f"image {result.image_id} ({how}) on {result.base.reference}\n"
                 + "".join(f"tagged {tag}\n" for tag in result.tags)
                 + f"layer added: {result.layer_size} bytes ({result.layers_added} layer); "
                 f"installed: {', '.join(result.requirements)}\n")
    return result.describe()


def _publish_wheels(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.release.publish import Index
    from builder.release.wheels import run_release_wheels

    index = Index.from_urls(args.repository_url, args.publish_index_url)
    summary = run_release_wheels(options(args, reporter), index, gate=args.gate,
                                 smoke_report=args.smoke_report,
                                 kernel_wheels=tuple(args.kernel_wheel))
    reporter.raw("".join(line + "\n" for line in summary.lines()))
    return summary.to_json()


def _cmd_release(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.release.publish import Index
    from builder.release.run import gpu_gate, run_release, static_gate

    if args.wheels_only:
        return _publish_wheels(args, reporter)
    index = Index.from_urls(args.repository_url, args.publish_index_url)
    image = image_options_from(args)
    gate = gpu_gate(docker_host=image.docker_host, series=args.gate_series) \
        if args.gate == "gpu" else static_gate
    summary = run_release(options(args, reporter), image, index, gate=gate)
    reporter.raw("".join(line + "\n" for line in summary.lines()))
    return summary.to_json()
