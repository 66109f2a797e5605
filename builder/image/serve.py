"""``serve-command``: the SGLang server command a target's launch profile gives for one GPU
and tensor-parallel size, for a pip install (the same rules as the image's
``sglang-sm120-serve``)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from builder.core.errors import ConfigurationError
from builder.core.options import Options


def run_serve_command(options: Options, *, gpu: str, tp: int, model: str, profiles_dir: Path,
                      extra: tuple[str, ...] = (), launch_profile: Path | None = None,
                      check: bool = False) -> dict[str, Any]:
    """Print (on the reporter) and return the environment and server command line.

    Args:
        options: the targets file, target, cache, index URL and reporter.
        gpu: the profile's GPU entry (``rtx-pro-6000``, ``rtx-5090``).
        tp: the tensor-parallel size.
        model: the model folder or Hugging Face name (``--model-path``).
        extra: more server arguments (they win over the profile's).
        launch_profile: this profile instead of the target's.
        profiles_dir: the folder of ``<target>.toml`` profiles.
        check: parse the command with the pinned release's own argument parser.

    Returns:
        ``{"target", "gpu", "tp", "profile", "env", "argv", "command", "checked",
        "requirements"}``.

    Raises:
        ConfigurationError: an empty model, ``--model-path`` among ``extra``, a TP size
            among ``extra`` (any spelling the release's parser reads) other than ``tp``, a
            profile without that GPU or without per-GPU entries, or (``check``) a command
            the release's parser refuses.
    """
    from builder.core.config import load_targets
    from builder.image.profile import (
        launcher_module,
        load_profile,
        parse_with_release,
        profile_path,
        profile_reader,
        release_env,
    )

    if not model.strip():
        raise ConfigurationError("--model is empty", "give the model folder or Hugging Face "
                                 "name, e.g. --model /models/qwen3-30b-a3b")
    if any(arg.split("=", 1)[0] in ("--model-path", "--model") for arg in extra):
        raise ConfigurationError("the model goes in --model, not after --",
                                 "drop --model-path from the arguments after --")
    reader = profile_reader()
    try:  # the TP size is --tp's; one given after -- (any spelling SGLang reads) must agree
        reader.server_tp(list(extra), tp, "--tp " + str(tp))
    except reader.ArgumentError as exc:
        raise ConfigurationError(str(exc), "give the TP size once, with --tp (the profile's "
                                 "caps are those of that TP size)") from None
    opts, reporter = options, options.reporter
    targets = load_targets(opts.targets_file)
    target = targets.get(options.target or targets.default)
    profile = load_profile(launch_profile or profile_path(profiles_dir, target),
                           target)
    if not profile.gpus:
        raise ConfigurationError(f"{profile.path} has no per-GPU entries ([gpu.*])",
                                 "use a target with per-GPU profiles (0.5.16 and later), or "
                                 "write [gpu.NAME] tables")
    if gpu not in profile.gpus:
        raise ConfigurationError(f"{profile.path} has no GPU {gpu!r}",
                                 f"--gpu {' or '.join(sorted(profile.gpus))}")
    launcher = launcher_module()
    user = ["--model-path", model, *extra]
    given = reader.given_options(user)
    server_argv = [*profile.argv(gpu, tp, given), *user]
    env = dict(launcher.SERVER_ENV)
    command = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + \
        shlex.join(["python", "-m", "sglang.launch_server", *server_argv])
    checked = None
    if check:
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
    return {"target": target.name, "gpu": gpu, "tp": tp,
            "profile": str(profile.path), "env": env,
            "argv": ["python", "-m", "sglang.launch_server", *server_argv],
            "command": command, "checked": checked,
            "requirements": [f"sglang=={target.upstream_version}+{target.local_label}",
                             "flashinfer-jit-cache (the kernel wheels: docs/kernels-current.md)"]}
