"""The images group: ``pin-images`` (base images' tags to digests) and ``image`` (the
runtime OCI image)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import (
    add_command,
    image_args,
    image_options_from,
    options,
    source_args,
    target_arg,
)
from builder.core.basepins import PINS_FILE
from builder.core.errors import ConfigurationError, VerificationError

if TYPE_CHECKING:
    from builder.core.progress import Reporter

_PIN_EPILOG = """\
examples:
  python -m builder pin-images                 # resolve every base, rewrite images/pins.toml
  python -m builder pin-images --verify        # exit 1 if a tag now points elsewhere
  python -m builder pin-images --json --pins-file my-pins.toml
  python -m builder pin-images --target sglang-0.5.23   # that target's bases only

Credentials: docker login's (~/.docker/config.json, $DOCKER_CONFIG, credential helpers);
Docker Hub's anonymous token is used when there are none. Registries on 127.0.0.0/8 and
localhost are reached over plain HTTP, like the Docker Engine does.
exit status: 0 pinned (or, with --verify, nothing moved), 1 a tag moved or was never
resolved (--verify), or a registry's answer failed its checks (not a digest, a body that
does not hash to its digest, a malformed or oversized manifest), 2 bad usage, 4 a
registry unreachable, refusing or without the tag. An entry that fails keeps its old pin;
the entries that resolved are written (the error says which).
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
    """Add ``pin-images`` and ``image``."""
    pin = add_command(
        commands, "pin-images", reads=("json", "targets_file", "target"),
        help="resolve the base images' tags to digests (images/pins.toml)",
        description="Resolve every base image in the pins file, upstream's runtime images "
                    "([[base]]) and the kernel build bases ([[kernel_base]]), from tag to "
                    "digest through the registry's API, pulling nothing; for a "
                    "multi-platform image record the index digest and the --platform "
                    "manifest digest. --target NAME: only that target's entries. The "
                    "entries that resolved are written (atomically, comments kept); one "
                    "that fails keeps its old pin and is named in the error.",
        epilog=_PIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    pin.add_argument("--pins-file", type=Path, default=PINS_FILE,
                     help="the pins file (default: %(default)s)")
    pin.add_argument("--verify", action="store_true",
                     help="write nothing; report pins whose tag now points elsewhere "
                          "(exit 1), for the scheduled upstream workflow")
    pin.add_argument("--platform", default="linux/amd64", metavar="OS/ARCH", type=_platform,
                     help="the manifest taken from multi-platform images "
                          "(default: %(default)s)")
    pin.set_defaults(handler=_cmd_pin_images)

    image = add_command(
        commands, "image",
        help="build the runtime OCI image: upstream's image plus our wheel(s)",
        description="Build the target's wheel, then the runtime image from images/Dockerfile "
                    "with the engine's BuildKit: FROM the upstream image of the target's "
                    "CUDA lane (by digest, images/pins.toml), plus one thin layer that "
                    "pip-installs the sglang wheel and any --kernel-wheel with --no-deps. "
                    "The build log streams to stderr.")
    target_arg(image)
    source_args(image)
    image_args(image)
    image.set_defaults(handler=_cmd_image, series=None, patch=None, strip=1, max_fuzz=0)


def _cmd_pin_images(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.core.config import load_targets
    from builder.image.pin import run_pin_images

    targets = load_targets(args.targets_file) if args.targets_file.is_file() else None
    if args.target is not None and targets is None:
        raise ConfigurationError(f"--target {args.target}: no targets file at "
                                 f"{args.targets_file}", "pass --targets-file FILE")
    only = targets.get(args.target) if targets is not None and args.target else None
    report = run_pin_images(args.pins_file, check=args.verify, targets=targets,
                            platform=args.platform, reporter=reporter, target=only)
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
    if args.verify and report.drifted:
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
