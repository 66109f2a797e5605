"""``serve-command``: the SGLang server command a target's launch profile gives for one GPU
and tensor-parallel size, for a pip install (the same rules as the image's
``sglang-sm120-serve``)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from builder.core.errors import BuildError, ConfigurationError
from builder.core.options import Options


def run_serve_command(options: Options, *, gpu: str, tp: int, model: str, profiles_dir: Path,
                      extra: tuple[str, ...] = (), launch_profile: Path | None = None,
                      check: bool = False, kernel_wheel: Path | None = None) -> dict[str, Any]:
    """Print (on the reporter) and return the environment and server command line.

    Args:
        options: the targets file, target, cache, index URL and reporter.
        gpu: the profile's GPU entry (``rtx-pro-6000``, ``rtx-5090``).
        tp: the tensor-parallel size.
        model: the model folder or Hugging Face name (``--model-path``).
        extra: more server arguments (they win over the profile's).
        launch_profile: this profile instead of the target's.
        profiles_dir: the folder of ``<target>.toml`` profiles.
        check: parse the command with the pinned release's own argument parser, and check
            that the kernel wheel covers the model and flags (:func:`check_kernel_coverage`).
        kernel_wheel: the kernel wheel to check (``None``: the one installed here, if any).

    Returns:
        ``{"target", "gpu", "tp", "profile", "env", "argv", "command", "checked", "notes",
        "requirements"}`` (``notes``: the profile's graph bounds lowered to the user's
        request cap, ``fit_graph_bounds`` of the profile reader).

    Raises:
        ConfigurationError: an empty model, a model or argument that is not valid UTF-8,
            ``--model-path`` among ``extra``, a TP size
            among ``extra`` (any spelling the release's parser reads) other than ``tp``, a
            profile without that GPU or without per-GPU entries, or (``check``) a command
            the release's parser refuses, or a kernel wheel that does not cover the model
            and flags.
    """
    from builder.behaviour.env import parse_with_release
    from builder.core.config import load_targets
    from builder.image.profile import (
        launcher_module,
        load_profile,
        profile_path,
        profile_reader,
        release_env,
    )

    reader = profile_reader()
    _check_user_args(reader, model, extra, tp)
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
    args = profile.resolve(gpu, tp)
    lowered = reader.fit_graph_bounds(args, list(extra))
    for note in lowered:
        reporter.info(f"warning: {note}")
    server_argv = [*reader.to_argv(args, given), *user]
    env = dict(launcher.SERVER_ENV)
    command = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + \
        shlex.join(["python", "-m", "sglang.launch_server", *server_argv])
    checked = None
    # A wheel given is the user's input: read before the release's parser (minutes cold).
    given = read_kernel_wheel(kernel_wheel) if check and kernel_wheel is not None else None
    if check:
        answer = parse_with_release(release_env(target, cache=opts.cache,
                                                index_url=opts.index_url, reporter=reporter),
                                    [server_argv])[0]
        if not answer["ok"]:
            raise ConfigurationError(f"sglang {target.upstream_version}'s own argument parser "
                                     f"refuses the command: {answer['error']}",
                                     "drop or fix the argument it names")
        checked = f"parsed by sglang {target.upstream_version}'s own argument parser"
        covered = check_kernel_coverage(opts, target, model, tuple(
            a for i, a in enumerate(server_argv) if "--model-path" not in
            (a, server_argv[i - 1] if i else "")), given)
        if covered:
            checked += f"; {covered}"
    reporter.raw(command + "\n")  # one line, never wrapped: it is meant to be pasted
    if checked:
        reporter.info(checked)
    return {"target": target.name, "gpu": gpu, "tp": tp,
            "profile": str(profile.path), "env": env,
            "argv": ["python", "-m", "sglang.launch_server", *server_argv],
            "command": command, "checked": checked, "notes": lowered,
            "requirements": [f"sglang=={target.upstream_version}+{target.local_label}",
                             "flashinfer-jit-cache (the kernel wheels: docs/kernels-current.md)"]}


def _check_user_args(reader: Any, model: str, extra: tuple[str, ...], tp: int | None) -> None:
    """Refuse the user's model and server arguments as :func:`run_serve_command` says
    (``reader``: the profile reader module; ``tp`` None: no TP size to agree with, as in
    ``--check --all``, where each pair has its own)."""
    if not model.strip():
        raise ConfigurationError("--model is empty", "give the model folder or Hugging Face "
                                 "name, e.g. --model /models/qwen3-30b-a3b")
    _refuse_undecodable((model, *extra))
    typed = [arg.split("=", 1)[0] for arg in extra
             if arg.startswith("--") and reader.is_model_option(arg.split("=", 1)[0])]
    if typed:  # SGLang keeps the last: it would silently replace --model's
        raise ConfigurationError(f"the model goes in --model, not after -- ({typed[0]} "
                                 "names SGLang's --model-path)",
                                 f"drop {typed[0]} and its value from the arguments after --")
    if tp is None:
        return
    try:  # the TP size is --tp's; one given after -- (any spelling SGLang reads) must agree
        reader.server_tp(list(extra), tp, "--tp " + str(tp))
    except reader.ArgumentError as exc:
        raise ConfigurationError(str(exc), "give the TP size once, with --tp (the profile's "
                                 "caps are those of that TP size)") from None


def _refuse_undecodable(args: tuple[str, ...]) -> None:
    """Refuse an argument that holds bytes the file system gave, not text (Python's
    surrogate escapes): the command printed would not be the one given."""
    for arg in args:
        try:
            arg.encode()
        except UnicodeEncodeError:
            raise ConfigurationError(f"{os.fsencode(arg).decode('ascii', 'backslashreplace')} is "
                                     "not valid UTF-8, so the command printed would not be "
                                     "the one given", "give it as UTF-8 text (a path: rename "
                                     "it, or link to it, with a UTF-8 name)") from None


def run_serve_check_all(options: Options, *, profiles_dir: Path, model: str | None = None,
                        extra: tuple[str, ...] = (),
                        launch_profile: Path | None = None) -> dict[str, Any]:
    """``serve-command --check --all``: every GPU x TP pair of the target's profile (and
    its common ``[args]`` alone) parsed by the pinned release's own argument parser, in one
    run, each pair's verdict printed before the command fails on any refused one.

    Args:
        options: the targets file, target, cache, index URL and reporter.
        profiles_dir: the folder of ``<target>.toml`` profiles.
        model: the model path the commands carry (default: a placeholder path; the parser
            only checks that one is given).
        extra: more server arguments (they win over the profile's).
        launch_profile: this profile instead of the target's.

    Returns:
        ``{"target", "profile", "checked": [{"gpu", "tp", "ok", "error", "argv"}], "method"}``.

    Raises:
        ConfigurationError: a pair the release's parser refuses (every refused pair named),
            or a profile without per-GPU entries.
    """
    from builder.behaviour.env import parse_with_release
    from builder.core.config import WheelPin, load_targets
    from builder.image.profile import (
        CHECK_MODEL,
        check_profile,
        load_profile,
        profile_path,
        profile_reader,
        release_env,
    )

    targets = load_targets(options.targets_file)
    target = targets.get(options.target or targets.default)
    profile = load_profile(launch_profile or profile_path(profiles_dir, target), target)
    if not profile.gpus:
        raise ConfigurationError(f"{profile.path} has no per-GPU entries ([gpu.*])",
                                 "write [gpu.NAME] tables (docs/new-release.md: profile)")
    reporter = options.reporter
    reader = profile_reader()
    _check_user_args(reader, CHECK_MODEL if model is None else model, extra, None)
    user = ["--model-path", model or CHECK_MODEL, *extra]
    given = {arg.split("=", 1)[0] for arg in user if arg.startswith("--")}
    combos = profile.combinations()

    def pair_argv(gpu: str | None, tp: int | None) -> list[str]:
        """The pair's command line as the single mode prints it (bounds fitted)."""
        args = profile.resolve(gpu, tp)
        reader.fit_graph_bounds(args, list(extra))
        return [*reader.to_argv(args, given), *user]

    argvs = [pair_argv(gpu, tp) for gpu, tp in combos]
    if not any(isinstance(pin, WheelPin) for pin in target.sources):
        # An sdist target has no parser environment: option names only, first refusal.
        check_profile(profile, target, cache=options.cache, index_url=options.index_url,
                      reporter=reporter)
        answers = [{"ok": True, "error": None}] * len(argvs)
        method = f"option names of sglang {target.upstream_version}'s server_args.py"
    else:
        env = release_env(target, cache=options.cache, index_url=options.index_url,
                          reporter=reporter)
        answers = parse_with_release(env, argvs)
        method = f"sglang {target.upstream_version}'s own argument parser"
    checked = [{"gpu": gpu, "tp": tp, "ok": bool(answer["ok"]), "error": answer.get("error"),
                "argv": ["python", "-m", "sglang.launch_server", *argv]}
               for (gpu, tp), argv, answer in zip(combos, argvs, answers, strict=True)]
    for item in checked:
        where = "common [args]" if item["gpu"] is None else f"{item['gpu']} TP {item['tp']}"
        reporter.result(f"{'ok' if item['ok'] else 'REFUSED'}: {where}"
                        + ("" if item["ok"] else f": {item['error']}"))
    refused = [i for i in checked if not i["ok"]]
    if refused:
        raise ConfigurationError(
            f"{profile.path}: {method} refuses {len(refused)} of {len(checked)} "
            "commands: " + "; ".join(
                f"{i['gpu'] or 'common'} TP {i['tp'] or '-'}: {i['error']}" for i in refused),
            "fix the values it names (every pair's verdict is printed above)")
    reporter.info(f"{len(checked)} commands of {profile.path.name} parsed by {method}")
    return {"target": target.name, "profile": str(profile.path), "method": method,
            "checked": checked}


def read_kernel_wheel(kernel_wheel: Path) -> tuple[str, dict[str, Any]]:
    """The manifest of the kernel wheel ``--check WHEEL`` names, read before any slow work.

    Args:
        kernel_wheel: the user's file.

    Returns:
        ``(label, manifest)``.

    Raises:
        ConfigurationError: not a regular file (a fifo would block the zip reader) or not a
            kernel wheel of this builder: the user's input (exit 2), not a build error.
    """
    from builder.kernels.jitcache import read_manifest

    if not kernel_wheel.is_file():
        raise ConfigurationError(f"--check {kernel_wheel}: not a file",
                                 "give the kernel wheel (flashinfer_jit_cache*.whl)")
    try:
        return str(kernel_wheel), read_manifest(kernel_wheel)
    except BuildError as error:
        raise ConfigurationError(error.cause, error.hint) from None


def check_kernel_coverage(options: Options, target: Any, model: str,
                          server_flags: tuple[str, ...],
                          given: tuple[str, dict[str, Any]] | None) -> str | None:
    """Refuse a kernel wheel that lacks a module the model and flags will load.

    The set is derived with the release's own backend selection
    (:func:`builder.kernels.derive.select_backends`, on the patched code, in its behaviour
    environment) and compared with the wheel's manifest (``given``, else the one
    installed in this Python).

    Args:
        options: the cache, index URL and reporter.
        target: the target.
        model: the model folder (a Hugging Face name cannot be derived from).
        server_flags: the server arguments after ``--model-path MODEL``.
        given: the kernel wheel's label and manifest (:func:`read_kernel_wheel`), or None
            for the one installed in this Python.

    Returns:
        what was checked, or ``None`` when no kernel wheel was given or installed.

    Raises:
        ConfigurationError: the wheel misses a module group, head dim, arch or FlashInfer
            version the configuration needs (one message, with the ``kernels`` command
            that builds the set: exit 2), or a wheel was given for a model that is not a
            local checkpoint folder (with the installed wheel such a model is not checked).
    """
    from builder.kernels.derive import (
        derive,
        installed_manifest,
        require_coverage,
        select_backends,
    )
    found = given if given is not None else installed_manifest()
    if found is None:
        options.reporter.info("kernel coverage not checked: no kernel wheel given "
                              "(--check WHEEL) and none installed in this Python")
        return None
    label, manifest = found
    folder = Path(model)
    if not (folder / "config.json").is_file() and given is None:
        options.reporter.info(f"kernel coverage not checked: {model} is not a local "
                              "checkpoint folder (the set is derived from its config.json)")
        return None
    if not (folder / "config.json").is_file():
        raise ConfigurationError(f"{model} is not a checkpoint folder with a config.json: the "
                                 "kernel set is derived from it",
                                 "give the local folder as --model, or --check without a "
                                 "wheel")
    held = [str(a) for a in manifest.get("arch_list") or ()]
    # The per-arch groups are named after the first arch: the target's, where the installed
    # wheels (several providers, one per arch) hold it.
    arch_list = tuple(dict.fromkeys([*(a for a in target.arch_list if a in held), *held]))
    selection = select_backends(options, target, folder, server_flags)
    derived = derive(selection, arch_list or (target.arch_list[0],))
    require_coverage(manifest, derived, arch_list=tuple(target.arch_list),
                     flashinfer=selection.get("flashinfer_version"), target=target.name,
                     model=folder, flags=server_flags, wheel=label)
    return f"kernel wheel {label} covers {', '.join(derived.groups)}"

