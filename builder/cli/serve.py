"""The serving command: ``serve-command`` (the launch profile's server command for a pip
install, the same rules as the image's ``sglang-sm120-serve``)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import add_command, index_url_arg, options, target_arg
from builder.core.errors import ConfigurationError

if TYPE_CHECKING:
    from builder.core.progress import Reporter

_EPILOG = """\
examples:
  python -m builder serve-command --target sglang-0.5.23 --gpu rtx-pro-6000 --tp 4 \\
      --model /models/DeepSeek-V3-0324-FP4
  python -m builder serve-command --target sglang-0.5.23 --gpu rtx-5090 --tp 2 \\
      --model /models/m --check --json -- --port 30001

Prints the environment and `python -m sglang.launch_server ...` line to run where the
patched sglang wheel and the FlashInfer kernel wheels are installed (docs/operator.md):
the profile's arguments for the GPU and TP size, then --model-path and whatever follows
`--` (yours win over the profile's, as in the image's launcher). --check parses the line
with the pinned release's own argument parser (the behaviour environment: the first run
installs the release on a CPU torch, minutes; later runs find it in the cache).
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
    parser.add_argument("--gpu", required=True, metavar="NAME",
                        help="the profile's GPU entry: rtx-pro-6000 or rtx-5090")
    parser.add_argument("--tp", type=int, required=True, metavar="N",
                        help="tensor-parallel size (the profile lists 1, 2, 4, 8)")
    parser.add_argument("--model", required=True, metavar="PATH",
                        help="the model folder or Hugging Face name (--model-path)")
    parser.add_argument("--profiles-dir", type=Path, default=None, metavar="DIR",
                        help="launch profiles, <target>.toml each (default: "
                             "images/profiles beside the targets file)")
    parser.add_argument("--launch-profile", type=Path, metavar="FILE",
                        help="use this launch profile instead of the target's")
    parser.add_argument("--check", action="store_true",
                        help="parse the command with the pinned release's own parser")
    index_url_arg(parser)
    parser.add_argument("extra", nargs="*", metavar="-- ARG",
                        help="more server arguments, after --")
    parser.set_defaults(handler=_cmd_serve_command)


def _cmd_serve_command(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.core.config import load_targets
    from builder.image.profile import (
        launcher_module,
        load_profile,
        parse_with_release,
        profile_path,
        release_env,
    )

    if not args.model.strip():
        raise ConfigurationError("--model is empty", "give the model folder or Hugging Face "
                                 "name, e.g. --model /models/qwen3-30b-a3b")
    if any(arg.split("=", 1)[0] in ("--model-path", "--model") for arg in args.extra):
        raise ConfigurationError("the model goes in --model, not after --",
                                 "drop --model-path from the arguments after --")
    opts = options(args, reporter)
    targets = load_targets(opts.targets_file)
    target = targets.get(args.target or targets.default)
    profile = load_profile(args.launch_profile or profile_path(args.profiles_dir, target),
                           target)
    if not profile.gpus:
        raise ConfigurationError(f"{profile.path} has no per-GPU entries ([gpu.*])",
                                 "use a target with per-GPU profiles (0.5.16 and later), or "
                                 "write [gpu.NAME] tables")
    if args.gpu not in profile.gpus:
        raise ConfigurationError(f"{profile.path} has no GPU {args.gpu!r}",
                                 f"--gpu {' or '.join(sorted(profile.gpus))}")
    launcher = launcher_module()
    user = ["--model-path", args.model, *args.extra]
    given = {arg.split("=", 1)[0] for arg in user if arg.startswith("--")}
    server_argv = [*profile.argv(args.gpu, args.tp, given), *user]
    env = dict(launcher.SERVER_ENV)
    command = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + \
        shlex.join(["python", "-m", "sglang.launch_server", *server_argv])
    checked = None
    if args.check:
        answer = parse_with_release(release_env(target, cache=opts.cache,
                                                index_url=opts.index_url, reporter=reporter),
                                    [server_argv])[0]
        if not answer["ok"]:
            raise ConfigurationError(f"sglang {target.upstream_version}'s own argument parser "
                                     f"refuses the command: {answer['error']}",
                                     "drop or fix the argument it names")
        checked = f"parsed by sglang {target.upstream_version}'s own argument parser"
    reporter.raw(command + "\n")  # one line, never wrapped: it is meant to be pasted
    if checked:
        reporter.info(checked)
    return {"target": target.name, "gpu": args.gpu, "tp": args.tp,
            "profile": str(profile.path), "env": env,
            "argv": ["python", "-m", "sglang.launch_server", *server_argv],
            "command": command, "checked": checked,
            "requirements": [f"sglang=={target.upstream_version}+{target.local_label}",
                             "flashinfer-jit-cache (the kernel wheels: docs/kernels-current.md)"]}
