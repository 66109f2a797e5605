"""Command line: ``python -m builder`` / ``sglang-sm120``. Parses, validates, calls a stage,
prints.

One module per command group adds its commands (:mod:`builder.cli.patching`,
:mod:`builder.cli.wheel`, :mod:`builder.cli.kernels`, :mod:`builder.cli.release`,
:mod:`builder.cli.smoke`, :mod:`builder.cli.ci`, :mod:`builder.cli.project`). Each command
sets a ``handler`` and may set a ``validate`` step (its own argument rules, raising
:class:`~builder.core.errors.ConfigurationError`); a handler imports its stage when it runs,
so a command loads only what it uses.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from builder.cli import behaviour, ci, kernels, patching, project, release, serve, smoke, wheel
from builder.cli.common import resolve_project_paths
from builder.core.errors import BuilderError, ConfigurationError

if TYPE_CHECKING:
    from rich.console import Console

    from builder.core.progress import Reporter

_DESCRIPTION = """\
Build patched SGLang wheels, FlashInfer kernels and OCI images for SM120 (RTX PRO 6000
Blackwell, RTX 5090) from pinned upstream releases.
"""

#: ``--help`` lists the commands by stage, one line each (the command's own help line).
#: Every command is in exactly one stage (``build_parser`` checks it).
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("source and patches", ("targets", "fetch", "patch", "matrix", "refresh", "add-patch")),
    ("wheel", ("wheel", "behaviour")),
    ("kernels", ("preflight", "kernels")),
    ("images", ("pin-images", "image")),
    ("serving", ("serve-command",)),
    ("release", ("smoke", "warm-cache", "release")),
    ("series and targets", ("upstream", "add-target", "next-label", "lock", "plan")),
    ("cache", ("cache",)),
)

_EPILOG = """\
examples:
  python -m builder wheel --target sglang-0.5.7 --json
  python -m builder patch --target sglang-0.5.10.post1 --dry-run
  python -m builder matrix --versions 0.5.9,0.5.11,0.5.13 --format markdown
  python -m builder kernels --target sglang-0.5.9 --cuda-lane 13.0 --modules norm
  python -m builder release --registry 127.0.0.1:5000 --repository-url http://127.0.0.1:8080/
  python -m builder release --wheels-only --repository-url http://127.0.0.1:8080/ --gate build
  python -m builder add-target 0.5.23
  python -m builder next-label --target sglang-0.5.9

Results go to stdout, progress and errors to stderr.
exit status: 0 ok; 1 failed: a check did not hold (the smoke test's, a moved pin in
pin-images --check, or an answer's shape, identity or size: a sha256 or digest that
differs, a malformed manifest, index page, METADATA or archive); 2 bad input (flags,
targets/series/request files); 3 missing tool or misconfigured runner; 4 source
unavailable (unreachable, refused, an HTTP error, no such file, tag or commit: a retry
may help); 5 patch; 6 build; 7 publish; 130/143 interrupted. Errors print their kind, a
one-line cause and a hint on stderr; with --json a JSON object with "error", "kind" and
"exit_status" on stdout.
"""

#: Old spellings kept for one release: old command -> the new command line's start.
#: ``label`` is resolved in :func:`_rewrite_alias` (it meant two commands).
_ALIASES: dict[str, tuple[str, ...]] = {
    "check": ("matrix",),
    "bump": ("add-target",),
    "publish-wheels": ("release", "--wheels-only"),
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser; with ``--json`` a usage error also prints the error object.

    argparse prints the usage and the message on stderr and exits 2 (``ArgumentParser.error``,
    Python 3.11); a machine reading stdout gets ``{"error", "hint", "kind", "exit_status"}``
    as for any other error. Subparsers are made of the same class (``add_subparsers``).
    """

    json_errors: ClassVar[bool] = False  # set by :func:`main` for the run

    def error(self, message: str) -> NoReturn:
        """Print the JSON error object when asked, then argparse's usage error (exit 2)."""
        if _Parser.json_errors:
            error = ConfigurationError(message, f"see `{self.prog} --help`")
            print(json.dumps(error.to_json(), indent=2), flush=True)
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser (also used to render ``--help``)."""
    parser = _Parser(
        prog="python -m builder", usage="%(prog)s [-h] COMMAND ...", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    # The listing is the description's (by stage), so argparse's own is suppressed.
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     prog="python -m builder",
                                     help=argparse.SUPPRESS)

    patching.add_commands(commands)
    wheel.add_commands(commands)
    behaviour.add_commands(commands)
    refresh = patching.add_matrix_commands(commands)
    kernels.add_commands(commands)
    release.add_commands(commands)
    patching.finish_refresh(refresh)
    smoke.add_commands(commands)
    serve.add_commands(commands)
    ci.add_commands(commands)
    project.add_commands(commands)
    for command in commands.choices.values():  # for its own usage line on an extra argument
        command.set_defaults(command_parser=command)
    parser.description = _DESCRIPTION + "\n" + _listing(commands)
    return parser


def _listing(commands: argparse._SubParsersAction[Any]) -> str:
    """The commands by stage, each with its help line, as ``--help`` shows them.

    Raises:
        RuntimeError: a command is in no stage of :data:`STAGES` or in two (a bug).
    """
    helps = {action.dest: action.help or "" for action in commands._choices_actions}
    staged = [name for _, names in STAGES for name in names]
    if sorted(staged) != sorted(helps):
        raise RuntimeError(f"STAGES and the commands differ: {sorted(staged)} vs "
                           f"{sorted(helps)}")
    width = max(map(len, staged)) + 2
    lines = ["commands by stage (`python -m builder COMMAND --help` for its options):"]
    for stage, names in STAGES:
        lines.append(f"  {stage}")
        lines += [f"    {name:{width}}{helps[name]}" for name in names]
    return "\n".join(lines) + "\n"


def _rewrite_alias(argv: list[str]) -> list[str]:
    """Turn a deprecated spelling into the new one, with a one-line note on stderr.

    Args:
        argv: the arguments after the program name.

    Returns:
        The arguments to parse (``argv`` itself when no old spelling is used).
    """
    if not argv or argv[0] not in (*_ALIASES, "label"):
        return argv
    old, rest = argv[0], argv[1:]
    if old == "label" and "--bump" in rest:
        shown, start = "label --bump", ["next-label"]
        rest = [arg for arg in rest if arg != "--bump"]
    elif old == "label":  # it showed the lock state of one target
        shown, start = "label", ["lock", "--check"]
    else:
        shown, start = old, list(_ALIASES[old])
    print(f"note: `{shown}` is deprecated and goes in the next release; use "
          f"`{' '.join(start)}`", file=sys.stderr)
    new = [*start, *rest]
    return new


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
    if as_json:
        print(json.dumps(exc.to_json(), indent=2))
    else:
        _print_error(exc)
    return exc.exit_status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status (see ``--help``: 0 ok, 1 failed or not verified,
    2 bad input, 3 missing tool, 4 source unavailable, 5 patch, 6 build, 7 publish, 130/143
    interrupted; :mod:`builder.core.errors`)."""
    from builder.core.progress import Reporter

    parser = build_parser()
    arguments = _rewrite_alias(list(sys.argv[1:] if argv is None else argv))
    _Parser.json_errors = "--json" in arguments
    args, extra = parser.parse_known_args(arguments)
    if extra:  # said by the command's parser, with its usage, not the top level's
        getattr(args, "command_parser", parser).error(
            f"unrecognized arguments: {' '.join(extra)}"
            + (" (options go after the command)" if arguments[0].startswith("-") else ""))
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
            print(json.dumps(payload, indent=2), flush=True)
        except BrokenPipeError:  # `... --json | head`: the reader left; no traceback
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141  # 128 + SIGPIPE, as a shell reports it
    return 0
