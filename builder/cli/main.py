"""Command line: ``python -m builder`` / ``sglang-sm120``. Parses, calls a stage, prints.

One module per command group adds its commands (:mod:`builder.cli.patching`,
:mod:`builder.cli.wheel`, :mod:`builder.cli.kernels`, :mod:`builder.cli.release`,
:mod:`builder.cli.smoke`, :mod:`builder.cli.ci`); a handler imports its stage when it runs,
so a command loads only what it uses.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console

from builder.cli import ci, kernels, patching, project, release, smoke, wheel
from builder.cli.common import comma_list, resolve_project_paths
from builder.core.errors import BuilderError
from builder.core.progress import Reporter

_EPILOG = """\
examples:
  python -m builder targets
  python -m builder wheel                          # the default target's wheel into dist/
  python -m builder wheel --target sglang-0.5.7 --json
  python -m builder patch --target sglang-0.5.10.post1 --dry-run
  python -m builder patch --source-dir ~/src/sglang --patch my.patch --max-fuzz 1 --dry-run
  python -m builder check --format markdown        # the series x every target
  python -m builder check --versions 0.5.9,0.5.11,0.5.13
  python -m builder refresh --target sglang-0.5.10.post1 --accept-fuzz --dry-run
  python -m builder kernels --target sglang-0.5.9 --cuda-lane 13.0 --modules norm
  python -m builder plan --json                    # the CI build matrix, one entry a target
  python -m builder upstream --format markdown     # newer SGLang releases vs the series
  python -m builder pin-images                     # base images' tags -> digests (pins.toml)
  python -m builder image                          # the runtime OCI image on the pinned base
  python -m builder image --base-image NAME:TAG@sha256:...   # ... or on another base
  python -m builder release --registry 127.0.0.1:5000 --repository-url http://127.0.0.1:8080/
  python -m builder publish-wheels --repository-url http://127.0.0.1:8080/ --gate build
  python -m builder lock --check                   # one version, one content (versions.lock)
  python -m builder label --target sglang-0.5.9 --bump
  python -m builder cache prune --older-than 30

Results go to stdout, progress and errors to stderr.
exit status: 0 success, 1 the build refused or failed (one-line cause and a hint on
stderr; with --json a JSON object with "error" on stdout), 2 bad usage.
"""


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser (also used to render ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m builder",
        description="Build patched SGLang wheels for SM120 (RTX PRO 6000 Blackwell, RTX "
                    "5090) from pinned upstream releases: fetch -> patch -> wheel.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    patching.add_commands(commands)
    wheel.add_commands(commands)
    refresh = patching.add_matrix_commands(commands)
    kernels.add_commands(commands)
    release.add_commands(commands)
    patching.finish_refresh(refresh)
    smoke.add_commands(commands)
    ci.add_commands(commands)
    project.add_commands(commands)
    return parser


def _terminate(number: int, _frame: object) -> None:
    raise KeyboardInterrupt(number)


def _print_error(exc: BuilderError) -> None:
    from builder.cli.patching import render_report

    err = Console(stderr=True, highlight=False)
    if type(exc.report).__name__ == "PatchReport":
        render_report(exc.report, err)
    if type(exc.report).__name__ == "ReleaseSummary":
        err.print("release summary:", style="bold")
        for line in exc.report.lines():
            err.print(f"  {line}", markup=False, soft_wrap=True)
    err.print("error:", style="bold red", end=" ")
    err.print(exc.cause, markup=False, soft_wrap=True)
    if exc.hint:
        err.print("hint:", style="bold", end=" ")
        err.print(exc.hint, markup=False, soft_wrap=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status (0 ok, 1 refused or failed, 2 usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "upstream_version", None) and not getattr(args, "source_dir", None):
        parser.error("--upstream-version only applies with --source-dir")
    if args.command == "check":
        if args.git_url and not args.commits:
            parser.error("--git-url only applies with --commits")
        for flag in ("versions", "commits"):
            if getattr(args, flag) is not None and not comma_list(getattr(args, flag)):
                parser.error(f"--{flag} is empty")
    reporter = Reporter(quiet=args.json, progress=getattr(args, "progress", False))
    handler: Callable[[argparse.Namespace, Reporter], dict[str, Any]] = args.handler
    previous = signal.signal(signal.SIGTERM, _terminate)  # clean up as on Ctrl-C
    try:
        resolve_project_paths(args)
        payload = handler(args, reporter)
    except BuilderError as exc:
        if args.json:
            print(json.dumps(exc.to_json(), indent=2))
        else:
            _print_error(exc)
        return exc.exit_status
    except OSError as exc:  # a path the user gave cannot be read or written
        where = f": {exc.filename}" if exc.filename else ""
        error = BuilderError(f"{exc.strerror or exc}{where}",
                             "check the paths given (--dist, --cache-dir, ...) and their "
                             "permissions")
        if args.json:
            print(json.dumps(error.to_json(), indent=2))
        else:
            _print_error(error)
        return 1
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
