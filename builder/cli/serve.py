"""The serving command: ``serve-command`` (the launch profile's server command for a pip
install, the same rules as the image's ``sglang-sm120-serve``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import add_command, index_url_arg, options, target_arg

if TYPE_CHECKING:
    from builder.core.progress import Reporter

_EPILOG = """\
examples:
  python -m builder serve-command --target sglang-0.5.23 --gpu rtx-pro-6000 --tp 8 \\
      --model /models/DeepSeek-V3-0324-FP4
  python -m builder serve-command --target sglang-0.5.23 --gpu rtx-5090 --tp 2 \\
      --model /models/m --check --json -- --port 30001
  python -m builder serve-command --target sglang-0.5.23 --check --all

Prints the environment and `python -m sglang.launch_server ...` line to run where the
patched sglang wheel and the FlashInfer kernel wheels are installed (docs/operator.md):
the profile's arguments for the GPU and TP size, then --model-path and whatever follows
`--` (yours win over the profile's, as in the image's launcher). --check parses the line
with the pinned release's own argument parser (the behaviour environment: the first run
installs the release and torch==2.13.0 as your pip resolves it, minutes: 0.9 GB as the +cpu
build where PyTorch's CPU index or a wheelhouse offers it, about 4.7 GB as PyPI's CUDA
build; later runs find it in the cache), then
derives the FlashInfer modules the model and flags load (the release's own backend
selection) and refuses a kernel wheel that lacks one, naming it and the `kernels build
--model` command that builds the set (exit 2): --check WHEEL checks that wheel (from
FlashInfer 0.7 the provider, flashinfer_jit_cache_sm120f-*.whl), plain --check the one
installed in this Python, if any.
--check --all parses every GPU x TP pair of the profile (and its common [args]) in one run,
prints each pair's verdict, and exits 2 when the release refuses any.
"""


def add_commands(commands: Any) -> None:
    """Add ``serve-command``."""
    parser = add_command(
        commands, "serve-command",
        help="print the SGLang server command for a GPU and TP size",
        description="Print the exact `python -m sglang.launch_server` command (with "
                    "FLASHINFER_DISABLE_JIT=1 for the kernel wheels) that the target's "
                    "SM120 launch profile gives for one GPU and tensor-parallel size.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    target_arg(parser)
    # --gpu, --tp and --model are required unless --check --all (validated below)
    parser.add_argument("--gpu", metavar="NAME",
                        help="the profile's GPU entry: rtx-pro-6000 or rtx-5090")
    parser.add_argument("--tp", type=int, metavar="N",
                        help="tensor-parallel size (the profile lists 1, 2, 4, 8)")
    parser.add_argument("--model", metavar="PATH",
                        help="the model folder or Hugging Face name (--model-path)")
    parser.add_argument("--profiles-dir", type=Path, default=None, metavar="DIR",
                        help="launch profiles, <target>.toml each (default: "
                             "images/profiles beside the targets file)")
    parser.add_argument("--launch-profile", type=Path, metavar="FILE",
                        help="use this launch profile instead of the target's")
    parser.add_argument("--check", nargs="?", const=True, default=False, type=Path,
                        metavar="WHEEL",
                        help="parse the command with the pinned release's own parser, and "
                             "refuse a kernel wheel (WHEEL, the provider wheel from "
                             "FlashInfer 0.7, else the one installed in this Python) that "
                             "lacks a module the model (a local folder) and flags load")
    parser.add_argument("--all", action="store_true", dest="check_all",
                        help="with --check: every GPU x TP pair of the profile in one run "
                             "(no --gpu, --tp or --model needed)")
    index_url_arg(parser)
    parser.add_argument("extra", nargs="*", metavar="-- ARG",
                        help="more server arguments, after --")
    parser.set_defaults(handler=_cmd_serve_command, validate=_validate)


def _validate(args: argparse.Namespace) -> None:
    """--gpu, --tp and --model for one command; --all only with --check."""
    from builder.core.errors import ConfigurationError

    if args.check_all and not args.check:
        raise ConfigurationError("--all checks every GPU x TP: it goes with --check",
                                 "python -m builder serve-command --target NAME --check --all")
    if args.check_all and (args.gpu is not None or args.tp is not None):
        raise ConfigurationError("--all checks every GPU x TP pair: drop --gpu and --tp",
                                 "or drop --all to print one command")
    missing = [flag for flag, value in (("--gpu", args.gpu), ("--tp", args.tp),
                                        ("--model", args.model)) if value is None]
    if missing and not args.check_all:
        raise ConfigurationError(f"serve-command needs {', '.join(missing)}",
                                 "give --gpu NAME --tp N --model PATH, or --check --all to "
                                 "check every pair of the profile")


def _cmd_serve_command(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.image.serve import run_serve_check_all, run_serve_command

    if args.check_all:
        return run_serve_check_all(options(args, reporter), model=args.model,
                                   extra=tuple(args.extra),
                                   launch_profile=args.launch_profile,
                                   profiles_dir=args.profiles_dir)
    return run_serve_command(options(args, reporter), gpu=args.gpu, tp=args.tp,
                             model=args.model, extra=tuple(args.extra),
                             launch_profile=args.launch_profile,
                             profiles_dir=args.profiles_dir, check=bool(args.check),
                             kernel_wheel=args.check if isinstance(args.check, Path)
                             else None)
