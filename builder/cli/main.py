"""Command line: ``python -m builder`` / ``sglang-sm120``. Parses, validates, calls a stage,
prints.

One module per group of ``--help`` adds that group's commands (:data:`GROUPS`); a command
with modes that take different flags has one subcommand per mode (``kernels build``,
``release wheels``). Each command sets a ``handler`` that calls one ``run_<command>`` of its
stage (``tests/cli/test_layout.py`` checks both), and may set a ``validate`` step (its own
argument rules, raising :class:`~builder.core.errors.ConfigurationError`); a handler imports
its stage when it runs, so a command loads only what it uses. The options every command
shares (:data:`~builder.cli.common.SHARED`) are declared once, on the root parser, and
accepted after the command too; one a command does not read is refused as argparse refuses
any unknown flag.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from builder.cli import cache, image, kernels, patching, release, serve, targets, wheel
from builder.cli.common import SHARED, SHARED_DEST, add_shared, resolve_project_paths
from builder.core.address import redact
from builder.core.errors import BuilderError, ConfigurationError, exit_status_text

if TYPE_CHECKING:
    from rich.console import Console

    from builder.core.progress import Reporter

_DESCRIPTION = """\
Build patched SGLang wheels, FlashInfer kernels and OCI images for SM120 (RTX PRO 6000
Blackwell, RTX 5090) from pinned upstream releases.
"""

#: ``--help`` lists the commands by group, one line each (the command's own help line).
#: Each group is one module of :mod:`builder.cli`, which adds exactly these commands
#: (``build_parser`` checks it).
GROUPS: tuple[tuple[str, ModuleType, tuple[str, ...]], ...] = (
    ("source and patches", patching,
     ("targets", "fetch", "patch", "matrix", "refresh", "add-patch")),
    ("wheel", wheel, ("wheel", "behaviour")),
    ("kernels", kernels, ("preflight", "kernels")),
    ("images", image, ("pin-images", "image")),
    ("serving", serve, ("serve-command",)),
    ("release", release, ("smoke", "warm-cache", "release")),
    ("series and targets", targets, ("upstream", "add-target", "next-label", "lock", "plan")),
    ("cache", cache, ("cache",)),
)

_EPILOG = """\
examples:
  python -m builder wheel --target sglang-0.5.7 --json
  python -m builder patch --target sglang-0.5.10.post1 --dry-run
  python -m builder matrix --versions 0.5.9,0.5.11,0.5.13 --format markdown
  python -m builder kernels build --target sglang-0.5.9 --cuda-lane 13.0 --modules norm
  python -m builder release image --registry 127.0.0.1:5000 --repository-url http://127.0.0.1:8080/
  python -m builder release wheels --repository-url http://127.0.0.1:8080/ --gate build
  python -m builder add-target 0.5.23
  python -m builder next-label --target sglang-0.5.9

Results go to stdout, progress and errors to stderr. Errors print their kind, a one-line
cause and a hint on stderr; with --json a JSON object with "error", "kind" and
"exit_status" on stdout.
""" + exit_status_text()


class _Parser(argparse.ArgumentParser):
    """argparse's parser; with ``--json`` a usage error also prints the error object.

    argparse prints the usage and the message on stderr and exits 2 (``ArgumentParser.error``,
    Python 3.11); a machine reading stdout gets ``{"error", "hint", "kind", "exit_status"}``
    as for any other error. Subparsers are made of the same class (``add_subparsers``).
    """

    json_errors: ClassVar[bool] = False  # set by :func:`main` for the run

    def error(self, message: str) -> NoReturn:
        """Print the JSON error object when asked, then argparse's usage error (exit 2)."""
        message = redact(message)  # it may quote an address the user gave
        if _Parser.json_errors:
            error = ConfigurationError(message, f"see `{self.prog} --help`")
            print(json.dumps(error.to_json(), indent=2), flush=True)
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser (also used to render ``--help``).

    Raises:
        RuntimeError: a group's module adds other commands than :data:`GROUPS` lists (a bug).
    """
    parser = _Parser(
        prog="python -m builder", usage="%(prog)s [-h] [--json] COMMAND ...", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared(parser)
    # The listing is the description's (by group), so argparse's own is suppressed.
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     prog="python -m builder",
                                     help=argparse.SUPPRESS)
    for _, module, names in GROUPS:
        before = set(commands.choices)
        module.add_commands(commands)
        if sorted(set(commands.choices) - before) != sorted(names):
            raise RuntimeError(f"{module.__name__} adds {sorted(set(commands.choices) - before)}"
                               f", not {sorted(names)}")
    for path, leaf in walk_commands(parser):  # for its own usage line on an extra argument
        leaf.set_defaults(command_parser=leaf, command_path=path)
        shared = [SHARED[dest][0] + (f" {action.metavar}" if action.metavar else "")
                  for action in parser._actions for dest in SHARED
                  if action.dest == dest and dest in leaf.get_default("shared")]
        leaf.epilog = (leaf.epilog or "") + ("\n" if leaf.epilog else "") + \
            f"shared options it reads (`{parser.prog} --help`): {', '.join(shared)}\n"
    parser.description = _DESCRIPTION + "\n" + _listing(commands)
    return parser


def walk_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                  ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable command: ``(its words, its parser)``, subcommands in their order."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield path, parser
        return
    for name, child in subparsers[0].choices.items():
        yield from walk_commands(child, (*path, name))


def _listing(commands: argparse._SubParsersAction[Any]) -> str:
    """The commands by group, each with its help line, as ``--help`` shows them."""
    helps = {action.dest: action.help or "" for action in commands._choices_actions}
    width = max(map(len, helps)) + 2
    lines = ["commands by group (`python -m builder COMMAND --help` for its options):"]
    for group, _, names in GROUPS:
        lines.append(f"  {group}")
        lines += [f"    {name:{width}}{helps[name]}" for name in names]
    return "\n".join(lines) + "\n"


class _MissingValue(Exception):
    """A shared option that takes a value was given last, with none."""


def _hoist_shared(argv: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Move the shared options given after the command in front of it (the root parser
    declares them once); stop at ``--``.

    Args:
        argv: the arguments after the program name.

    Returns:
        The arguments to parse, and each shared option given (any place): its flag and
        the words it took (``--cache-dir DIR``).

    Raises:
        _MissingValue: a shared option that takes a value ends the arguments.
    """
    front: list[str] = []
    rest: list[str] = []
    given: list[tuple[str, list[str]]] = []
    values = {flag for flag, takes_value in SHARED.values() if takes_value}
    flags = {flag for flag, _ in SHARED.values()}
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            rest += argv[index:]
            break
        name = arg.split("=", 1)[0]
        if name in flags:
            words = [arg]
            if name in values and "=" not in arg:
                if index + 1 == len(argv) or argv[index + 1] == "--":
                    # Moved in front of the command, it would take the command as its value.
                    raise _MissingValue(f"argument {name}: expected one argument")
                index += 1
                words.append(argv[index])
            given.append((name, words))
            front += words
        else:
            rest.append(arg)
        index += 1
    return front + rest, given


def _refuse_two_values(parser: argparse.ArgumentParser,
                       shared: list[tuple[str, list[str]]]) -> None:
    """Refuse a shared option given twice with different values (before and after the
    command, say): argparse would keep the last one silently."""
    seen: dict[str, str] = {}
    for flag, words in shared:
        value = words[0].split("=", 1)[1] if "=" in words[0] else " ".join(words[1:])
        if flag in seen and seen[flag] != value:
            parser.error(f"argument {flag}: given twice, as {seen[flag]!r} and {value!r} "
                         "(give it once)")
        seen[flag] = value


def _terminate(number: int, _frame: object) -> None:
    raise KeyboardInterrupt(number)


def _print_error(exc: BuilderError) -> None:
    """Print an error on stderr: its report (if it renders), its kind, cause and hint.

    A :class:`~builder.patching.apply.PatchReport` prints as the patch report; any other
    report with ``lines()`` prints those lines; other reports only go into ``--json``.
    """
    from rich.console import Console

    err = Console(stderr=True, highlight=False)
    _print_report(exc.report, err)
    err.print(f"{exc.kind}:", style="bold red", end=" ")
    err.print(exc.cause, markup=False, soft_wrap=True)
    if exc.hint:
        err.print("hint:", style="bold", end=" ")
        err.print(exc.hint, markup=False, soft_wrap=True)


def _print_report(report: object, err: Console) -> None:
    if report is None:
        return
    from builder.patching.apply import PatchReport

    if isinstance(report, PatchReport):
        patching.render_report(report, err)
        return
    lines = getattr(report, "lines", None)
    if callable(lines):
        err.print("summary:", style="bold")
        for line in lines():
            err.print(f"  {line}", markup=False, soft_wrap=True)


def _fail(exc: BuilderError, as_json: bool) -> int:
    # An address in a message may carry an index's credentials (pip's
    # https://USER:TOKEN@host/simple): shown as ****, as pip shows them.
    exc = exc.replaced(cause=redact(exc.cause), hint=redact(exc.hint))
    if as_json:
        print(redact(json.dumps(exc.to_json(), indent=2)))
    else:
        _print_error(exc)
    return exc.exit_status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status (:data:`builder.core.errors.EXIT_STATUSES`)."""
    from builder.core.progress import Reporter

    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    try:
        arguments, shared = _hoist_shared(given)
    except _MissingValue as exc:
        _Parser.json_errors = "--json" in given
        parser.error(str(exc))
    _Parser.json_errors = any(flag == "--json" for flag, _ in shared)
    _refuse_two_values(parser, shared)
    args, extra = parser.parse_known_args(arguments)
    extra += [word for flag, words in shared if SHARED_DEST[flag] not in args.shared
              for word in words]
    if extra:  # said by the command's parser, with its usage, not the top level's
        getattr(args, "command_parser", parser).error(
            f"unrecognized arguments: {' '.join(extra)}"
            + (" (options go after the command)" if given[0].startswith("-")
               and given[0].split("=", 1)[0] not in SHARED_DEST else ""))
    handler: Callable[[argparse.Namespace, Reporter], dict[str, Any]] = args.handler
    validate: Callable[[argparse.Namespace], None] | None = getattr(args, "validate", None)
    previous = signal.signal(signal.SIGTERM, _terminate)  # clean up as on Ctrl-C
    try:
        if validate is not None:
            validate(args)
        reporter = Reporter(quiet=args.json, progress=getattr(args, "progress", False))
        resolve_project_paths(args)
        payload = handler(args, reporter)
    except BuilderError as exc:
        return _fail(exc, args.json)
    except OSError as exc:  # a path the user gave cannot be read or written
        where = f": {exc.filename}" if exc.filename else ""
        return _fail(ConfigurationError(f"{exc.strerror or exc}{where}",
                                        "check the paths given (--dist, --cache-dir, ...) and "
                                        "their permissions"), args.json)
    except KeyboardInterrupt as exc:
        print("interrupted; nothing half-written was kept", file=sys.stderr)
        return 143 if exc.args == (signal.SIGTERM,) else 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        try:
            print(redact(json.dumps(payload, indent=2)), flush=True)
        except BrokenPipeError:  # `... --json | head`: the reader left; no traceback
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141  # 128 + SIGPIPE, as a shell reports it
    return 0
