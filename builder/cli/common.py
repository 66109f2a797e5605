"""Arguments and helpers the command groups share."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.core.basepins import PINS_FILE
from builder.core.cache import default_cache_root
from builder.core.config import SOURCE_KINDS, git_url
from builder.core.errors import BuilderError, ConfigurationError
from builder.core.userfiles import read_json_input

if TYPE_CHECKING:
    from rich.table import Table

    from builder.core.options import Options
    from builder.core.progress import Reporter
    from builder.image.run import ImageOptions
    from builder.patching.matrix import Matrix


def count(limit: int, low: int = 0) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= limit:
            raise argparse.ArgumentTypeError(f"must be from {low} to {limit}")
        return value
    return parse


#: The options several commands share, each declared once, on the root parser
#: (:func:`add_shared`): dest -> (flag, whether it takes a value). A command names those it
#: reads (:func:`add_command`'s ``reads``, :func:`target_arg`, :func:`source_args`,
#: :func:`index_url_arg`); :func:`builder.cli.main.main` accepts them before or after the
#: command and refuses one the command does not read, as argparse refuses an unknown flag.
SHARED: dict[str, tuple[str, bool]] = {
    "json": ("--json", False),
    "targets_file": ("--targets-file", True),
    "cache_dir": ("--cache-dir", True),
    "target": ("--target", True),
    "source": ("--source", True),
    "git_url": ("--git-url", True),
    "index_url": ("--index-url", True),
    "source_dir": ("--source-dir", True),
    "upstream_version": ("--upstream-version", True),
}
SHARED_DEST: dict[str, str] = {flag: dest for dest, (flag, _) in SHARED.items()}
#: What every command of the project reads: ``--json``, the targets file and the cache.
PROJECT = ("json", "targets_file", "cache_dir")


def add_shared(parser: argparse.ArgumentParser) -> None:
    """Declare :data:`SHARED` on the root parser (the one place)."""
    group = parser.add_argument_group(
        "shared options (before or after the command; a command refuses one it does not read)")
    group.add_argument("--json", action="store_true",
                       help="print one JSON object on stdout and no progress")
    group.add_argument("--targets-file", type=Path, default=None, metavar="FILE",
                       help="the targets file; its series paths are relative to it "
                            "(default: targets.toml in this folder or the nearest one "
                            "above)")
    group.add_argument("--cache-dir", type=Path, default=None, metavar="DIR",
                       help="cache root (default: $SGLANG_SM120_CACHE or "
                            f"{default_cache_root()})")
    group.add_argument("--target", metavar="NAME", type=nonempty,
                       help="build target (default: the targets file's default)")
    group.add_argument("--source", choices=SOURCE_KINDS,
                       help="take the target's sdist, wheel or git pin (default: its "
                            "'prefer')")
    group.add_argument("--git-url", metavar="URL", type=git_url_arg,
                       help="clone the git pin's commit (matrix: the --commits) from this URL "
                            "or path instead")
    group.add_argument("--index-url", metavar="URL", default=PipIndexDefault(), type=_index_url,
                       help="simple index where sdists, wheels and releases are found (default: "
                            "the index pip uses: PIP_INDEX_URL, else index-url in pip.conf, "
                            "else PyPI; here: %(default)s)")
    group.add_argument("--source-dir", type=Path, metavar="DIR",
                       help="use this SGLang checkout or unpacked sdist instead of fetching")
    group.add_argument("--upstream-version", metavar="VERSION",
                       help="the upstream version of --source-dir (default: its PKG-INFO)")


def add_command(commands: Any, name: str, *, reads: tuple[str, ...] = PROJECT,
                **kwargs: Any) -> argparse.ArgumentParser:
    """Add a command (or a group of subcommands) that reads the shared options ``reads``.

    Args:
        commands: the ``add_subparsers()`` object to add it to.
        name: the command's word.
        reads: the :data:`SHARED` options its handler reads (more: :func:`reads_shared`).
        kwargs: ``add_parser``'s (``help``, ``description``, ``epilog``, ...).

    Returns:
        The command's parser.
    """
    parser: argparse.ArgumentParser = commands.add_parser(name, **kwargs)
    parser.set_defaults(shared=frozenset(reads))
    return parser


def reads_shared(parser: argparse.ArgumentParser, *dests: str) -> None:
    """Let ``parser``'s command take the shared options ``dests`` (keys of :data:`SHARED`)."""
    parser.set_defaults(shared=parser.get_default("shared") | frozenset(dests))


def target_arg(parser: argparse.ArgumentParser) -> None:
    """The command takes ``--target NAME`` (default: the targets file's default target)."""
    reads_shared(parser, "target")


def source_args(parser: argparse.ArgumentParser) -> None:
    """The command takes the source options (``--source``, ``--git-url``, ``--index-url``,
    ``--source-dir``, ``--upstream-version``), checked by :func:`validate_source_args`."""
    reads_shared(parser, "source", "git_url", "index_url", "source_dir", "upstream_version")
    parser.set_defaults(validate=validate_source_args)


def validate_source_args(args: argparse.Namespace) -> None:
    """The rules of :func:`source_args`' flags that argparse cannot state.

    Raises:
        ConfigurationError: ``--upstream-version`` without ``--source-dir``.
    """
    if args.upstream_version and not args.source_dir:
        raise ConfigurationError("--upstream-version only applies with --source-dir",
                                 "give --source-dir DIR too, or drop --upstream-version")


class PipIndexDefault:
    """``--index-url``'s default: the index pip is configured with, asked only when
    ``--help`` prints it (so other commands never start pip)."""

    def __str__(self) -> str:
        from builder.core.pipconfig import pip_index

        return str(pip_index())


def _index_url(text: str) -> str:
    """A simple index's URL: ``http(s)://`` with a host, or ``file://`` (pip takes both);
    :func:`builder.core.pipconfig.check_index_url`, the rule pip's configured index is
    checked by too (credentials allowed, shown redacted).

    Raises:
        argparse.ArgumentTypeError: any other text.
    """
    from builder.core.pipconfig import check_index_url

    try:
        return check_index_url(text, "--index-url")
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(exc.cause) from None


def index_url_arg(parser: argparse.ArgumentParser) -> None:
    """The command takes ``--index-url`` (default: the index pip is configured with)."""
    reads_shared(parser, "index_url")


def given_index_url(args: argparse.Namespace) -> str | None:
    """The ``--index-url`` the user gave, ``None`` for pip's configured default."""
    value = getattr(args, "index_url", None)
    return value if isinstance(value, str) else None


def series_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("patches")
    group.add_argument("--series", type=Path, metavar="FILE",
                       help="apply this series file instead of the target's")
    group.add_argument("--patch", type=Path, metavar="FILE",
                       help="apply just this patch (unpinned, for trying one out)")
    group.add_argument("--strip", type=count(20), default=1, metavar="N",
                       help="strip level for --patch (default: %(default)s)")
    group.add_argument("--layout", choices=("auto", "git", "sdist"), default="auto",
                       help="paths of --patch: git (a/python/sglang/...), sdist "
                            "(a/sglang/..., made in an unpacked sdist or wheel) or auto "
                            "(default: told from the paths)")
    group.add_argument("--max-fuzz", type=count(3), default=0, metavar="N",
                       help="fuzz allowed for --patch (default: %(default)s)")


def git_url_arg(text: str) -> str:
    """argparse type of a ``--git-url``: :func:`builder.core.config.git_url`'s rule.

    Raises:
        argparse.ArgumentTypeError: not an address git reaches by its own transports.
    """
    return _checked(lambda url: git_url(url, ""), text)


def _checked(check: Callable[[str], str], text: str) -> str:
    try:
        return check(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(f"{exc.cause} ({exc.hint})") from None


def registry_arg(text: str) -> str:
    """argparse type of ``--registry``: :func:`builder.image.registry.check_registry`."""
    from builder.image.registry import check_registry  # its imports only when given

    return _checked(check_registry, text)


def repository_arg(text: str) -> str:
    """argparse type of ``--repository``: :func:`builder.image.registry.check_repository`."""
    from builder.image.registry import check_repository

    return _checked(check_repository, text)


def docker_host_arg(text: str) -> str:
    """argparse type of ``--docker-host``: :func:`builder.core.engine.check_docker_host`."""
    from builder.core.engine import check_docker_host

    return _checked(lambda address: check_docker_host(address, ""), text)


def _not_blank(text: str, remedy: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"is empty; {remedy}")
    return text


def nonempty(text: str) -> str:
    """argparse type of a name that has no default once given (``--target NAME``).

    Raises:
        argparse.ArgumentTypeError: an empty or blank name (it used to mean the default).
    """
    return _not_blank(text, "give a name, or leave the option out for the default")


def path_arg(text: str) -> Path:
    """argparse type of a path the user names (``--output-dir``, ``--series``, ...).

    Raises:
        argparse.ArgumentTypeError: an empty path (``Path("")`` is ``.``: it would
            silently mean the current folder).
    """
    return Path(_not_blank(text, "give a path, or leave the option out"))


def positive(text: str) -> int:
    return count(1024, low=1)(text)


def seconds(text: str) -> float:
    """A time limit: a finite number of seconds above 0, at most a week.

    Raises:
        argparse.ArgumentTypeError: anything else (``nan``, ``inf``, ``-5``, ``0``).
    """
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= 7 * 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds above 0, at most 604800")
    return value


def comma_names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError("give at least one name")
    return names


def comma_numbers(text: str) -> tuple[int, ...]:
    try:
        numbers = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of whole numbers") from None
    if not numbers or min(numbers) <= 0:
        raise argparse.ArgumentTypeError("head dimensions are positive")
    return numbers


def comma_list(text: str | None) -> list[str]:
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def resolve_project_paths(args: argparse.Namespace) -> None:
    """Fill in the paths whose default is the project's: the targets file (found from
    the current folder upward) and the image files beside it.

    Raises:
        BuilderError: no targets file was given and none is found.
    """
    from builder.core.options import TARGETS_FILE, find_targets_file

    if "targets_file" in args and args.targets_file is None:
        try:
            args.targets_file = find_targets_file()
        except BuilderError:
            # Not every command reads it (smoke on a runner): the stage that does fails
            # then, naming the file.
            args.targets_file = Path(TARGETS_FILE)
    root = args.targets_file.parent if getattr(args, "targets_file", None) else Path()
    for name, default in (("pins_file", PINS_FILE),
                          ("profiles_dir", "images/profiles"),
                          ("gate_series", "patches/series.toml")):
        if name in args and getattr(args, name) is None:
            setattr(args, name, root / default)


def cache_root(args: argparse.Namespace) -> Path:
    """The cache root (``--cache-dir``, else the default), for every command that uses it.

    Raises:
        ConfigurationError: it exists and is not a folder.
    """
    root: Path = getattr(args, "cache_dir", None) or default_cache_root()
    if root.exists() and not root.is_dir():
        raise ConfigurationError(f"the cache {root} is not a folder",
                                 "pass --cache-dir a folder (or set SGLANG_SM120_CACHE)")
    return root


def options(args: argparse.Namespace, reporter: Reporter) -> Options:
    from builder.core.options import Options

    return Options(
        targets_file=args.targets_file, target=getattr(args, "target", None),
        cache_dir=cache_root(args),
        index_url=given_index_url(args),
        source=getattr(args, "source", None), git_url=getattr(args, "git_url", None),
        source_dir=getattr(args, "source_dir", None),
        upstream_version=getattr(args, "upstream_version", None),
        series=getattr(args, "series", None), patch=getattr(args, "patch", None),
        strip=getattr(args, "strip", 1), max_fuzz=getattr(args, "max_fuzz", 0),
        dist_dir=getattr(args, "dist", Path("dist")), reporter=reporter)


def image_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("image")
    group.add_argument("--registry", default="localhost:5000", metavar="HOST[:PORT]",
                       type=registry_arg,
                       help="registry the image tag names (default: %(default)s)")
    group.add_argument("--repository", default="sglang-sm120", metavar="PATH",
                       type=repository_arg,
                       help="repository in that registry (default: %(default)s)")
    group.add_argument("--base-image", metavar="NAME@sha256:...",
                       help="build on this image instead of the pinned upstream one")
    group.add_argument("--kernel-wheel", type=Path, action="append", default=[],
                       metavar="WHEEL", help="also install this wheel (repeatable; e.g. "
                       "the flashinfer_jit_cache kernel wheel)")
    group.add_argument("--pins-file", type=Path, default=None, metavar="FILE",
                       help="upstream base images by digest (default: images/pins.toml "
                            "beside the targets file)")
    group.add_argument("--profiles-dir", type=Path, default=None, metavar="DIR",
                       help="SM120 launch profiles, <target>.toml each (default: "
                            "images/profiles beside the targets file)")
    group.add_argument("--launch-profile", type=Path, metavar="FILE",
                       help="put this launch profile in the image instead of the target's")
    group.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR",
                       help="where the wheels go (default: %(default)s)")
    group.add_argument("--docker-host", metavar="URL", type=docker_host_arg,
                       help="the Docker Engine (default: $DOCKER_HOST or "
                            "unix:///var/run/docker.sock)")


def image_options_from(args: argparse.Namespace) -> ImageOptions:
    from builder.image.run import ImageOptions

    return ImageOptions(registry=args.registry, repository=args.repository,
                        base_image=args.base_image, pins_file=args.pins_file,
                        # The Dockerfile installs the launcher and its profile reader: it is
                        # the project's own file, not an input (images/ beside the targets).
                        dockerfile=args.targets_file.parent / "images" / "Dockerfile",
                        kernel_wheels=tuple(args.kernel_wheel),
                        docker_host=args.docker_host, profiles_dir=args.profiles_dir,
                        launch_profile=args.launch_profile)


def image_id_from(path: Path) -> str:
    """The ``image_id`` in the JSON ``image --json`` printed.

    Raises:
        BuilderError: the file is missing, not JSON, or has no image ID.
    """
    hint = "write it with `python -m builder image --json > FILE`"
    data = read_json_input(path, "the image's JSON", hint)
    try:
        image_id = data["image_id"] if "image_id" in data else data["image"]["image_id"]
    except (KeyError, TypeError):
        raise ConfigurationError(f"{path} holds no image ID", hint) from None
    return str(image_id)


def matrix_table(matrix: Matrix) -> Table:
    from rich.table import Table

    table = Table(title="Patch compatibility")
    table.add_column("patch", overflow="fold")
    for column in matrix.columns:
        table.add_column(column.label + (f"\n({column.target})" if column.target else ""),
                         overflow="fold")
    for name, row in zip(matrix.patches, matrix.cells, strict=True):
        table.add_row(name, *(cell.text + {True: " ✓", False: " ✗", None: ""}[cell.intents]
                              for cell in row))
    return table
